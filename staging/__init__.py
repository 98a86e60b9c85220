"""Data staging: copy a dataset from the shared file system to node-local storage, verified.

Torch-free so it runs on a login node; ranks coordinate through a small `Communicator`
(torch.distributed or MPI, imported only when used) or, on one node, a barrier callable.
"""

from mlhpc.staging.comm import CallbackComm, Communicator
from mlhpc.staging.connect import comm_for, make_comm
from mlhpc.staging.destination import STAGED_MARKER
from mlhpc.staging.localdir import LOCAL_DIR_VARIABLE, resolve_local_dir
from mlhpc.staging.manifest import MANIFEST_NAME, Manifest, build_manifest, hash_file
from mlhpc.staging.plan import MODES, Mode, Topology
from mlhpc.staging.request import StageReport, StageRequest
from mlhpc.staging.stage import stage_dataset
from mlhpc.staging.verify import verify_staged

__all__ = [
    "LOCAL_DIR_VARIABLE",
    "MANIFEST_NAME",
    "MODES",
    "STAGED_MARKER",
    "CallbackComm",
    "Communicator",
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
