"""Shared runtime: errors, config, distributed context, MLLOG, registry and the time-to-train loop.

Importing this package does not import torch, so the staging layer and the submission checker
can use its torch-free modules (errors, layout) on a login node.
"""
