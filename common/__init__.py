"""The shared ground floor, in rooms; the words every room uses lie at its top.

    errors, printable, vocabulary, log_keys, layout   the words: import nothing of common/
    safeio/    reading and writing what others made          -> the words
    cluster/   launchers, the process group, who answers     -> the words
    contract/  the benchmark catalog, registry and configs   -> the words, cluster
    display/   tables, figures, slow-step notes, log records -> the words, safeio, cluster
    training/  the one time-to-train loop                    -> every room above

tests/cli/test_import_rules.py holds these arrows. Importing this package does not import torch, so
staging and the submission checker use its torch-free modules on a login node.
"""
