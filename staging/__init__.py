"""Data staging: copy a dataset from the shared file system to node-local storage, verified.

Torch-free so it runs on a login node; ranks coordinate through a small `Communicator`
(torch.distributed or MPI, imported only when used) or, on one node, a barrier callable.

The names below are imported on first use (a module `__getattr__`), so `mlhpc verify` or a
caller of one function loads only the modules it uses, not the whole engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlhpc.staging.comm import CallbackComm, Communicator
    from mlhpc.staging.connect import comm_for, make_comm
    from mlhpc.staging.journal import STAGED_MARKER
    from mlhpc.staging.localdir import LOCAL_DIR_VARIABLE, resolve_local_dir
    from mlhpc.staging.manifest import MANIFEST_NAME, Manifest, build_manifest, hash_file
    from mlhpc.staging.plan import MODES, Mode, Topology
    from mlhpc.staging.request import CopyOptions, StageReport, StageRequest
    from mlhpc.staging.stage import stage_dataset
    from mlhpc.staging.verify import verify_staged

_HOME = {
    "CallbackComm": "comm",
    "Communicator": "comm",
    "comm_for": "connect",
    "make_comm": "connect",
    "STAGED_MARKER": "journal",
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
"""Each public name and the module of this package that defines it (the imports above, for readers
and type checkers)."""

__all__ = [
    "LOCAL_DIR_VARIABLE",
    "MANIFEST_NAME",
    "MODES",
    "STAGED_MARKER",
    "CallbackComm",
    "Communicator",
    "CopyOptions",
    "Manifest",
    "Mode",
    "StageReport",
    "StageRequest",
    "Topology",
    "build_manifest",
    "comm_for",
    "hash_file",
    "make_comm",
    "resolve_local_dir",
    "stage_dataset",
    "verify_staged",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:  # AttributeError lets `from mlhpc.staging import archive` find the submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
