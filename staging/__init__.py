"""Data staging: copy a dataset from the shared file system to node-local storage, verified.

Torch-free so it runs on a login node; the caller passes a barrier for its ranks.
"""

from mlhpc.staging.localdir import LOCAL_DIR_VARIABLE, resolve_local_dir
from mlhpc.staging.manifest import MANIFEST_NAME, Manifest, build_manifest, hash_file
from mlhpc.staging.stage import STAGED_MARKER, StageReport, stage_dataset, verify_staged

__all__ = [
    "LOCAL_DIR_VARIABLE",
    "MANIFEST_NAME",
    "STAGED_MARKER",
    "Manifest",
    "StageReport",
    "build_manifest",
    "hash_file",
    "resolve_local_dir",
    "stage_dataset",
    "verify_staged",
]
