"""DEST, the node-local folder staging writes: its lock, its ownership (a run token recorded
before anything is written), what an earlier run left there, and room for the dataset.

Staging replaces files by name, so a folder is staging's only when it is provably so: empty,
marked by an earlier run, or holding only files the source has at the same paths.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
from contextlib import ExitStack
from pathlib import Path

from mlhpc.common.errors import MlhpcError, StagingError
from mlhpc.common.safeio.datasets import DATASET_COMPLETE, DATASET_GENERATING
from mlhpc.common.safeio.locks import LOCK_NAME, FolderBusy, folder_lock
from mlhpc.common.safeio.safe_read import read_bytes
from mlhpc.common.safeio.safepath import inside
from mlhpc.staging.comm import Communicator, agree
from mlhpc.staging.engine import PARTIAL_SUFFIX, write_error
from mlhpc.staging.journal import JOURNAL_PREFIX
from mlhpc.staging.localdir import LOCAL_DIR_VARIABLE
from mlhpc.staging.manifest import MANIFEST_NAME

STAGED_MARKER = ".mlhpc_staged.json"


STAGING_OWNED = ".mlhpc_staging"
"""Written into an empty DEST before anything is staged there: a later run finds the folder is
mlhpc's (see `refuse_unless_staged_here`) even if it was killed before any journal line."""


SPACE_MARGIN_BYTES = 64 << 20
"""Room kept free beyond the dataset, at most (1 % of it below that): the manifest, journals
and the file system's own blocks."""


_RUN_LINE = re.compile(rb"^run ([0-9a-f]{12})\b", re.MULTILINE)


_OUR_PARTIAL = re.compile(r"\..+\.([0-9a-f]{12})" + re.escape(PARTIAL_SUFFIX))


def lock_destination(comm: Communicator, src: Path, dest: Path, held: ExitStack) -> None:
    """Local rank 0 of each node makes DEST and takes its lock for as long as `held` lasts (DEST
    is node-local: one lock a node); every rank learns of a refusal, which names the holder.

    A DEST that staging makes gets a directory source's permission bits."""
    error = None
    if comm.topology.local_rank == 0:
        try:
            created = not dest.exists()
            if not created and dest.is_dir():  # before the lock file goes in: a user's folder stays as it was
                refuse_unless_staged_here(dest, src)
            dest.mkdir(parents=True, exist_ok=True)
            held.enter_context(
                folder_lock(
                    dest, f"mlhpc stage {src}", "wait for it to finish, or stage to another directory"
                )
            )
            if created and src.is_dir():
                os.chmod(dest, folder_mode(src))
        except (FolderBusy, StagingError) as e:
            error = str(e)
        except MlhpcError as e:  # the lock file could not be made: say why in staging's terms
            error = str(destination_error(e.__cause__, dest) if isinstance(e.__cause__, OSError) else e)
        except OSError as e:
            error = str(destination_error(e, e.filename or dest))
    agree(comm, error)


def destination_error(e: OSError, where: str | os.PathLike[str]) -> StagingError:
    """A destination that cannot be made or written, as one line naming it (`where`) and the fix."""
    fix = f"pass a writable node-local directory as DEST (mlhpc run: --local-dir or {LOCAL_DIR_VARIABLE})"
    if e.errno == errno.ENOSPC:
        return write_error(e, str(where))
    if e.errno == errno.EROFS:
        return StagingError(f"staging destination {where} is on a read-only file system; {fix}")
    if e.errno in (errno.EACCES, errno.EPERM):
        return StagingError(f"staging destination {where}: permission denied; make it writable or {fix}")
    if e.errno == errno.EEXIST:
        return StagingError(f"staging destination {where} is a file, not a directory; {fix}")
    if e.errno == errno.ENOTDIR:
        return StagingError(f"staging destination {where}: a folder in that path is a file; {fix}")
    return StagingError(f"staging destination {where}: {e.strerror or e}; {fix}")


def folder_mode(src_folder: Path) -> int:
    """A staged folder's mode: its source's permission bits and the owner's rwx (a rerun writes
    there; a read-only source folder must not make the copy unrepairable)."""
    return stat.S_IMODE(src_folder.stat().st_mode) & 0o777 | 0o700


def agree_destination(comm: Communicator, dest: Path, needed: int) -> tuple[bool, str]:
    """Check that the ranks of each node name one directory; local rank 0 prepares it (drops an
    old marker and our own partial files, refuses a disk that is too small) and records this
    run's token there. Returns: was it empty, and the node's run token (`CopyOptions.run_token`)."""
    topo = comm.topology
    error, fresh, token = None, False, ""
    if topo.local_rank == 0:
        token = secrets.token_hex(6)
        try:
            fresh = prepare_destination(dest, needed, token)
        except StagingError as e:
            error = str(e)
        except OSError as e:
            error = str(destination_error(e, e.filename or dest))
    values = agree(comm, error, [topo.node, topo.local_rank, str(dest.absolute()), fresh, token])
    leaders = {node: (path, was_fresh, tok) for node, local, path, was_fresh, tok in values if local == 0}
    for rank, (node, _, path, _, _) in enumerate(values):
        if node in leaders and path != leaders[node][0]:
            raise StagingError(
                f"rank {rank} stages to {path} but local rank 0 of node {node} to {leaders[node][0]}; "
                "set MLHPC_LOCAL_DIR (or the destination) the same on every rank of a node"
            )
    dest.mkdir(parents=True, exist_ok=True)
    _, was_fresh, node_token = leaders.get(topo.node, ("", False, ""))
    return was_fresh, node_token


def prepare_destination(dest: Path, needed: int, token: str) -> bool:
    """Make DEST ready: this run's token recorded before any temporary file is made, an old
    marker and the temporary files of our own earlier runs removed, the free space checked."""
    fresh = not dest.exists() or all(p.name == LOCK_NAME for p in dest.iterdir())
    dest.mkdir(parents=True, exist_ok=True)
    earlier = run_tokens(dest)
    record_run(dest, token)  # from now on the folder is provably staging's, and so are this run's files
    (dest / STAGED_MARKER).unlink(missing_ok=True)
    if not fresh:
        remove_partials(dest, earlier)
        needed = max(0, needed - bytes_present(dest))
    check_free_space(dest, needed)
    return fresh


def record_run(dest: Path, token: str) -> None:
    """Append `run <token>` to DEST's ownership file (made if missing, never through a link)."""
    line = f"run {token} pid {os.getpid()}\n".encode()
    fd = os.open(
        dest / STAGING_OWNED,
        os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
        0o644,
    )
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def run_tokens(dest: Path) -> set[str]:
    """The tokens of the staging runs DEST's ownership file records (none if it cannot be read)."""
    try:
        data = read_bytes(dest / STAGING_OWNED, 16 << 20, what="a staging ownership file")
    except OSError:
        return set()
    return {m.decode() for m in _RUN_LINE.findall(data)}


def remove_partials(dest: Path, tokens: set[str]) -> None:
    """Remove the temporary files of our own earlier runs: regular files whose name carries a
    token DEST records. A file merely named like one (a user's, a link) stays."""
    for folder, _, filenames in os.walk(dest):  # does not follow links
        for name in filenames:
            match = _OUR_PARTIAL.fullmatch(name)
            if match is None or match.group(1) not in tokens:
                continue
            path = os.path.join(folder, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)


def bytes_present(dest: Path) -> int:
    """Bytes of the dataset's files in DEST already (what a rerun need not find room for again)."""
    total = 0
    for folder, _, filenames in os.walk(dest):
        for name in filenames:
            if name.startswith(".mlhpc") or name.endswith(PARTIAL_SUFFIX):
                continue
            info = os.lstat(os.path.join(folder, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def refuse_unless_staged_here(dest: Path, src: Path) -> None:
    """A DEST that is not empty must be one mlhpc staged into before (its bookkeeping is there),
    or hold only files that a directory SRC has at the same paths (a copy by another tool, which
    staging verifies and keeps or copies again): staging replaces files by name, so in anyone
    else's folder it could overwrite their files. A dataset mlhpc generated is never a DEST."""
    names = {p.name for p in dest.iterdir()}
    if names & {DATASET_COMPLETE, DATASET_GENERATING}:
        raise StagingError(
            f"{dest} is a dataset mlhpc generated, not a staging destination; stage it into another folder"
        )
    bookkeeping = names & {STAGING_OWNED, STAGED_MARKER, MANIFEST_NAME}
    if bookkeeping or any(n.startswith(JOURNAL_PREFIX) for n in names):
        return
    for folder, dirnames, filenames in os.walk(dest):
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(folder, d))]:
            if name.startswith(".mlhpc") or name.endswith(PARTIAL_SUFFIX):
                continue
            relative = os.path.relpath(os.path.join(folder, name), dest)
            if not any(os.path.isfile(src / f"{relative}{suffix}") for suffix in ("", ".gz", ".zst")):
                raise StagingError(
                    f"{dest} holds {os.path.join(folder, name)}, which mlhpc did not stage and {src} does "
                    "not have; stage into an empty or new folder (mlhpc would overwrite files of the same name)"
                )


def refuse_overlap(src: Path, dest: Path) -> None:
    """SRC and DEST must be apart: a DEST inside SRC is listed as source on a rerun, and a SRC
    inside DEST is written over while it is read."""
    if inside(str(dest), os.path.realpath(src)) or inside(str(src), os.path.realpath(dest)):
        raise StagingError(
            f"staging source {src} and destination {dest} overlap; stage into a folder outside the source"
        )


def space_shortfall(dest: Path | str, needed_bytes: int, free_bytes: int) -> str | None:
    """Why `needed_bytes` (and a margin: 1 % of them, at most `SPACE_MARGIN_BYTES`) do not fit in
    `free_bytes` on DEST's file system, as one line naming both sizes and DEST; None when they fit."""
    margin = min(SPACE_MARGIN_BYTES, needed_bytes // 100)
    if needed_bytes <= 0 or needed_bytes + margin <= free_bytes:
        return None
    return (
        f"not enough space on {dest}: staging needs {needed_bytes} bytes, {free_bytes} are free "
        f"({_human(needed_bytes)} needed and {_human(margin)} to spare, {_human(free_bytes)} free); "
        "set MLHPC_LOCAL_DIR to a larger node-local disk"
    )


def _human(n: int) -> str:
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def check_free_space(dest: Path, needed_bytes: int) -> None:
    """Refuse, before anything is copied, a dataset that does not fit on DEST's file system."""
    dest.mkdir(parents=True, exist_ok=True)
    if (why := space_shortfall(dest, needed_bytes, shutil.disk_usage(dest).free)) is not None:
        raise StagingError(why)
