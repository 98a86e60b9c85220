"""DEST, the node-local folder staging writes: its lock, its ownership (a run token recorded
before anything is written), what an earlier run left there, room for the dataset, and the end
of a staging (`finish_node`): each node's manifest and sources file, the copies of removed
files taken away (our own, unchanged), strangers refused, and the completion marker last.

Staging replaces files by name, so a folder is staging's only when it is provably so: empty,
marked by an earlier run, or holding only files the source has at the same paths.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mlhpc.common.errors import MlhpcError, StagingError
from mlhpc.common.safeio.datasets import DATASET_COMPLETE, DATASET_GENERATING
from mlhpc.common.safeio.fileio import atomic_write_text
from mlhpc.common.safeio.locks import LOCK_NAME, FolderBusy, folder_lock
from mlhpc.common.safeio.safe_read import read_bytes
from mlhpc.common.safeio.safepath import inside, landing
from mlhpc.staging.comm import Communicator, agree
from mlhpc.staging.engine import PARTIAL_SUFFIX, Staged, Work, staged_path, write_error
from mlhpc.staging.journal import JOURNAL_PREFIX, STAGED_MARKER, read_journals, remove_journals, write_sources
from mlhpc.staging.localdir import LOCAL_DIR_VARIABLE
from mlhpc.staging.manifest import MANIFEST_NAME, Manifest, hash_file
from mlhpc.staging.plan import Mode, node_files
from mlhpc.staging.request import CopyOptions

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


# ---------------------------------------------------------------- the end of a staging
def finish_node(
    comm: Communicator,
    src: Path,
    dest: Path,
    mode: Mode,
    manifest: Manifest | None,
    work: Work,
    options: CopyOptions,
    durable: bool = False,
    previous: dict[str, Staged] | None = None,
) -> Manifest:
    """Local rank 0 writes the node's manifest (from every rank's journal); in replicate mode
    the nodes compare digests of their copies; the marker is written last (`durable`: after
    the copy is on disk). Before it, the copies of files the source no longer has are removed
    (`remove_stale`: only our own, unchanged), and what every file was made from goes into the
    sources file, the evidence of the next restage and of `mlhpc verify`."""
    topo = comm.topology
    held: Manifest | None = None
    records: list[Staged] = []
    error: str | None = None
    if topo.local_rank == 0:
        held, records, error = _write_node_manifest(src, dest, mode, manifest, work, options, previous, topo)
    digests = agree(comm, error, [topo.node, held.digest() if held else None])
    if mode == "replicate" and comm.collective:
        first = {digest: node for node, digest in reversed(digests) if digest}
        if len(first) > 1:
            nodes = sorted(first.values())
            raise StagingError(
                f"the copies on nodes {nodes[0]} and {nodes[1]} differ (manifest digests); stage again"
            )
    if held is not None:
        error = _write_marker(src, dest, mode, topo, held, records, durable)
    agree(comm, error)  # a barrier that also tells every rank if a marker could not be written
    if held is None and (dest / MANIFEST_NAME).is_file():
        held = Manifest.read(dest / MANIFEST_NAME)
    return held or Manifest(options.algorithm, tuple(node_files(manifest, mode, topo)) if manifest else ())


def _write_node_manifest(
    src: Path,
    dest: Path,
    mode: Mode,
    manifest: Manifest | None,
    work: Work,
    options: CopyOptions,
    previous: dict[str, Staged] | None,
    topo: Any,
) -> tuple[Manifest | None, list[Staged], str | None]:
    """Local rank 0: the node's manifest written, after its folders got their source's modes and
    stale copies and strangers were dealt with; (the manifest, what each file was made from, the
    error to agree on)."""
    held: Manifest | None = None
    records: list[Staged] = []
    try:
        records = _node_records(dest, manifest, mode, topo, work, options)
        held = Manifest(options.algorithm, tuple(s.entry for s in records))
        if manifest is not None:
            keep_folder_modes(src, dest, (f.path for f in held.files))
        remove_stale(src, dest, previous or {}, {s.path for s in records}, options.algorithm)
        refuse_strangers(src, dest, {s.path for s in records})
        held.write(dest / MANIFEST_NAME)
    except StagingError as e:
        return held, records, str(e)
    except OSError as e:
        return held, records, str(destination_error(e, e.filename or dest / MANIFEST_NAME))
    return held, records, None


def _write_marker(
    src: Path, dest: Path, mode: Mode, topo: Any, held: Manifest, records: list[Staged], durable: bool
) -> str | None:
    """The sources file, the journals removed, then the completion marker, last (`durable`: after
    the copy is on disk); the error to agree on, if any."""
    try:
        write_sources(dest, records)  # before the journals go: their lines are in it
        remove_journals(dest, run_tokens(dest))
        if durable:
            sync_filesystem(dest)
        marker = {"source": str(src.absolute()), "mode": mode, "node": topo.node, "nodes": topo.num_nodes}
        marker |= {"files": len(held.files), "bytes": held.total_bytes}
        atomic_write_text(dest / STAGED_MARKER, json.dumps(marker) + "\n")
    except OSError as e:
        return str(write_error(e, str(dest / STAGED_MARKER)))
    return None


def _node_records(
    dest: Path, manifest: Manifest | None, mode: Mode, topo: Any, work: Work, options: CopyOptions
) -> list[Staged]:
    """What the node holds, with what each file was made from: an archive's extracted members,
    or for a directory the node's files as its ranks' journals (and an earlier run's) record them."""
    if manifest is None:
        return sorted(work.held or [], key=lambda s: s.path)
    records = work.records if work.records is not None else read_journals(dest)
    out: list[Staged] = []
    for f in node_files(manifest, mode, topo):
        record = records.get(f.path)
        if record is None or record.path != staged_path(f.path, options):
            raise StagingError(f"{f.path} was not staged to {dest}; stage again")
        out.append(record)
    return sorted(out, key=lambda s: s.path)


def keep_folder_modes(src: Path, dest: Path, paths: Iterable[str]) -> None:
    """Give the folders of the staged `paths` their source folders' modes (a stat of each folder
    of the source, not of each file)."""
    folders: set[str] = set()
    for path in paths:  # string splits: PurePosixPath.parents cost 19 us a file (0.19 s for 10,000)
        folder = path.rpartition("/")[0]
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder.rpartition("/")[0]
    for folder in sorted(folders):
        try:
            mode = folder_mode(src / folder)
        except FileNotFoundError:
            continue  # a folder the source no longer has: the umask's default stays
        os.chmod(dest / folder, mode)


def remove_stale(src: Path, dest: Path, previous: dict[str, Staged], held: set[str], algorithm: str) -> None:
    """Remove the copies an earlier staging made of files the source no longer has (or this
    node no longer holds), so that DEST holds what SRC does. Only a copy that is provably ours
    goes: recorded by an earlier run and still the very bytes it recorded. Anything else at such
    a path is refused in one line, before the marker: mlhpc does not delete what it cannot
    prove it made. A file no run of ours recorded is not looked at."""
    seen: set[str] = set()
    for record in previous.values():
        if record.path in held or record.path in seen:
            continue
        seen.add(record.path)
        where = f"staging into {dest}: an earlier copy"
        target = landing(
            str(dest), record.path, where, "remove the link from DEST, or stage into a new folder"
        )
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # not a file, so not a copy of ours: left as it is
        if info.st_size != record.size or hash_file(Path(target), algorithm) != record.checksum:
            raise StagingError(
                f"{target} was staged from {src} earlier, which no longer has it, and it changed since; "
                f"move it out of {dest} (mlhpc removes only its own unchanged copies) and stage again"
            )
        os.unlink(target)


def refuse_strangers(src: Path, dest: Path, held: set[str]) -> None:
    """DEST must hold the dataset and nothing else: a regular file that neither the source has
    nor a run of ours recorded (someone's own file, or a copy whose journal line a kill lost
    and whose source went meanwhile) is not ours to remove, and a loader would read it as data:
    refused in one line, before the marker, with nothing removed."""
    for folder, _, filenames in os.walk(dest):  # does not follow links
        for name in filenames:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, dest).replace(os.sep, "/")
            if name.startswith(".mlhpc") or name.endswith(PARTIAL_SUFFIX) or relative in held:
                continue
            if relative == MANIFEST_NAME or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            raise StagingError(
                f"{dest} holds {relative}, which {src} does not have and no staging recorded; move it "
                f"out of {dest} (mlhpc removes only its own copies) and stage again"
            )


def sync_filesystem(folder: Path) -> None:
    """Put everything written to `folder`'s file system on disk (syncfs; sync where it is missing)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if getattr(libc, "syncfs", None) is None or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
