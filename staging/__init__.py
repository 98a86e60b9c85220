"""Data staging: copy a dataset from the shared file system to node-local storage, verified.

Torch-free so it runs on a login node; ranks coordinate through a small `Communicator`
(torch.distributed or MPI, imported only when used) or, on one node, a barrier callable.
The names below are imported when first used, so that `import mlhpc.staging` (and a copy
worker process, `python -m mlhpc.staging.parallel`) costs nothing it does not need.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CallbackComm": "comm",
    "Communicator": "comm",
    "comm_for": "connect",
    "make_comm": "connect",
    "STAGED_MARKER": "destination",
    "LOCAL_DIR_VARIABLE": "localdir",
    "resolve_local_dir": "localdir",
    "MANIFEST_NAME": "manifest",
    "Manifest": "manifest",
    "build_manifest": "manifest",
    "hash_file": "manifest",
    "MODES": "plan",
    "Mode": "plan",
    "Topology": "plan",
    "CopyOptions": "request",
    "StageReport": "request",
    "StageRequest": "request",
    "stage_dataset": "stage",
    "verify_staged": "verify",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
