"""Safe I/O: reading and writing files that other programs, users or a neighbour made.

Owns every judge of what comes from outside on disk: bounded reads (safe_read), strict JSON
(safe_json), paths that must land inside a root (safepath), dataset and .npy headers (datasets,
npyfile), write-then-rename (fileio), output folders checked up front (writable) and the one
writer per folder (locks). Torch-free. May import: the words at common/'s top only.
"""
