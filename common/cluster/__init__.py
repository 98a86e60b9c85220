"""The cluster: where a process sits in a job and how it talks to the others.

Owns the launcher environments (launch), the process group and its timeouts (distributed), the
name of a node a failed collective lost (liveness), CPU threads per rank (threads) and stops from
outside as exceptions (termination). May import: the words at common/'s top only; torch only
inside distributed (imported lazily by the torch-free callers).
"""
