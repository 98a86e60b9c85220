"""Staging a dataset to node-local storage: plan, copy or exchange, verify, mark complete.

Every rank calls `stage_dataset` at the same point. Its phases end in agreements, so an error
on one rank stops every rank with that rank's message, and the completion marker is written
last, by local rank 0, only when every file of its node verified. Local rank 0 holds DEST's
lock throughout, so a second `mlhpc stage` into the same DEST is refused at once.

Permissions: a staged file keeps its source's permission bits (less setuid, setgid, sticky),
a staged folder its source folder's (plus the owner's rwx, which a rerun needs), so a private
dataset stays private on a shared node-local disk; the node's manifest and marker, written for
others to read, follow the umask.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mlhpc.common import safe_json
from mlhpc.common.datasets import DATASET_COMPLETE, DATASET_GENERATING
from mlhpc.common.errors import MlhpcError, StagingError
from mlhpc.common.fileio import atomic_write_text, current_umask
from mlhpc.common.locks import LOCK_NAME, FolderBusy, folder_lock
from mlhpc.common.safe_read import read_bytes
from mlhpc.common.safepath import inside, landing
from mlhpc.staging import archive as archives
from mlhpc.staging.comm import CallbackComm, Communicator, LostRankError, agree
from mlhpc.staging.execute import Settings, Work, stage_archive, stage_directory
from mlhpc.staging.iopath import choose_io
from mlhpc.staging.journal import (
    JOURNAL_PREFIX,
    close_journal,
    read_journals,
    read_sources,
    remove_journals,
    write_sources,
)
from mlhpc.staging.localdir import LOCAL_DIR_VARIABLE
from mlhpc.staging.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    hash_file,
    list_dataset_files,
    scan_dataset,
)
from mlhpc.staging.origin import current_identity
from mlhpc.staging.plan import Mode, node_files
from mlhpc.staging.request import StageReport, StageRequest
from mlhpc.staging.sink import (
    PARTIAL_SUFFIX,
    SinkOptions,
    Staged,
    direct_writes_pay,
    forget_checked_dirs,
    staged_path,
    write_error,
)

log = logging.getLogger(__name__)
STAGED_MARKER = ".mlhpc_staged.json"
STAGING_OWNED = ".mlhpc_staging"
"""Written into an empty DEST before anything is staged there: a later run finds the folder is
mlhpc's (see `refuse_unless_staged_here`) even if it was killed before any journal line."""
SPACE_MARGIN_BYTES = 64 << 20
"""Room kept free beyond the dataset, at most (1 % of it below that): the manifest, journals
and the file system's own blocks."""
_RUN_LINE = re.compile(rb"^run ([0-9a-f]{12})\b", re.MULTILINE)
_OUR_PARTIAL = re.compile(r"\..+\.([0-9a-f]{12})" + re.escape(PARTIAL_SUFFIX))
IDENTITY_PROMISE = (
    "without a manifest a file already staged is kept when its source's size, mtime, ctime and "
    "inode are unchanged since it was copied (not its bytes)"
)


def stage_dataset(request: StageRequest, comm: Communicator | None = None) -> StageReport:
    """Stage the dataset at `request.src` (a directory or a tar/tar.gz/tar.zst archive) into
    `request.dest`.

    Without `comm`, one rank alone stages (a `CallbackComm` lets the ranks of one node split the
    work, synchronised by its barrier). With a collective `Communicator`, `request.mode` says what
    each node ends with (see `plan`). A rerun skips what is staged and verified already.
    `request.io` picks the I/O path (`iopath.IO_CHOICES`): "auto" decides on the node's memory and
    the source's cached share, "direct" reads large files with O_DIRECT and writes with it where
    that pays (`direct_writes_pay`), "buffered" and "kernel" never do.
    """
    comm = comm or CallbackComm()
    src, dest, mode = request.src, request.dest, request.mode
    started = time.perf_counter()
    refuse_overlap(src, dest)
    forget_checked_dirs()
    with ExitStack() as locked:  # DEST's lock, held until the marker is written
        lock_destination(comm, src, dest, locked)
        topo = comm.topology
        if mode == "replicate" and topo.num_nodes > 1 and not comm.collective:
            log.warning(
                "replicate over %d nodes needs a Communicator; every node copies the source", topo.num_nodes
            )
            mode = "copy"
        manifest, trusted = _describe_source(comm, src)
        kind = archives.archive_kind(src) if src.is_file() else None
        mine = node_files(manifest, mode, topo) if kind is None else []
        needed = _needed_bytes(src, kind, manifest, mine)
        fresh, token = agree_destination(comm, dest, needed)
        sources = [str(src)] if kind is not None else [os.path.join(src, f.path) for f in mine]
        plan = choose_io(request.io, needed, sources, direct_writes_pay(str(dest)))
        log.debug("staging I/O: %s (%s)", plan.label, plan.reason)
        options = SinkOptions(
            manifest.algorithm, plan.direct_writes, request.decompress, umask=current_umask(), run_token=token
        )
        settings = Settings(
            mode=mode,
            options=options,
            direct_reads=plan.direct_reads,
            kernel_copy=plan.kernel_copy,
            memory_bytes=plan.available_bytes,
            source_cached=plan.source_cached,
            workers=request.workers,
            processes=request.processes,
            chunk_bytes=request.chunk_bytes,
            progress=request.progress and comm.rank == 0,
        )
        error: str | None = None
        work = Work()
        evidence: dict[str, Staged] | None = None
        try:
            evidence = None if fresh else read_journals(dest)
            if kind is not None:
                work = stage_archive(
                    comm, src, kind, dest, manifest if trusted else None, evidence or {}, settings
                )
            else:
                work = stage_directory(comm, src, dest, manifest, evidence, settings)
        except LostRankError:
            raise
        except (StagingError, OSError) as e:
            error = str(e) if isinstance(e, StagingError) else f"cannot stage {src} to {dest}: {e}"
        finally:
            try:
                close_journal(str(dest))
            except StagingError as e:  # also when interrupted: the interruption goes on up, not this
                error = error or str(e)
        totals = agree(comm, error, work.read_bytes)
        held = finish_node(
            comm,
            src,
            dest,
            mode,
            manifest if kind is None else None,
            work,
            settings.options,
            request.durable,
            previous=evidence,
        )
        return StageReport(
            dest=dest,
            files=len(held.files),
            bytes=held.total_bytes,
            seconds=time.perf_counter() - started,
            mode=mode,
            copied_files=len(work.staged),
            skipped_files=work.skipped,
            read_bytes=work.read_bytes,
            job_read_bytes=sum(totals),
            node=topo.node,
            num_nodes=topo.num_nodes,
            io=plan,
            durable=request.durable,
            checked_by="checksums" if trusted else "identity",
            warnings=tuple(w for w in [archives.unchecked_warning(src, kind)] if w and not trusted and kind),
        )


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


def _describe_source(comm: Communicator, src: Path) -> tuple[Manifest, bool]:
    """The source's manifest (trusted: checksums to verify against) or its listing; read by
    rank 0 and broadcast, so the shared file system is asked once."""
    if not comm.collective:
        return read_source(src)
    payload = None
    if comm.rank == 0:
        try:
            manifest, trusted = read_source(src)
            payload = json.dumps({"manifest": manifest.to_json(), "trusted": trusted}).encode()
        except StagingError as e:
            payload = json.dumps({"error": str(e)}).encode()
    data = json.loads(comm.broadcast(payload))
    if "error" in data:
        raise StagingError(data["error"])
    return Manifest.from_json(data["manifest"], src), bool(data["trusted"])


def read_source(src: Path) -> tuple[Manifest, bool]:
    """A directory's manifest (or its listing) or an archive's manifest (or an empty one)."""
    try:
        return _read_source(src)
    except OSError as e:
        raise StagingError(
            f"cannot read staging source {e.filename or src} ({e.strerror or e}); check it and its permissions"
        ) from e


def _read_source(src: Path) -> tuple[Manifest, bool]:
    if src.is_dir():
        if (src / MANIFEST_NAME).is_file():
            manifest = Manifest.read(src / MANIFEST_NAME)
            refuse_linked_folders(src, manifest)
            return manifest, True
        return scan_dataset(src), False
    if src.is_file() and archives.archive_kind(src) is not None:
        sidecar = archives.sidecar_manifest(src)
        if sidecar.is_file():
            return Manifest.read(sidecar), True
        return Manifest("xxh3_128", ()), False
    if src.exists():
        raise StagingError(
            f"staging source {src} is neither a directory nor a .tar, .tar.gz or .tar.zst archive"
        )
    raise StagingError(f"staging source {src} is not a directory; pass --data DIR holding the dataset")


def refuse_linked_folders(src: Path, manifest: Manifest) -> None:
    """A manifest entry whose folder in SRC is a symbolic link is refused (it could lead out of
    SRC, and a listing never enters one): one lstat per folder, not per file."""
    real: set[str] = set()
    for entry in manifest.files:
        folder = entry.path.rpartition("/")[0]
        while folder and folder not in real:
            if os.path.islink(src / folder):
                raise StagingError(
                    f"{src / MANIFEST_NAME}: entry {entry.path!r} goes through {src / folder}, a symbolic "
                    "link; refused: put the files themselves under SRC and write the manifest again"
                )
            real.add(folder)
            folder = folder.rpartition("/")[0]


def _needed_bytes(src: Path, kind: str | None, manifest: Manifest, mine: list[FileEntry]) -> int:
    if kind is not None:
        return archives.estimated_bytes(src, kind, manifest if manifest.files else None)
    return sum(f.size for f in mine)  # a lower bound when decompressing: a full disk is caught later


def agree_destination(comm: Communicator, dest: Path, needed: int) -> tuple[bool, str]:
    """Check that the ranks of each node name one directory; local rank 0 prepares it (drops an
    old marker and our own partial files, refuses a disk that is too small) and records this
    run's token there. Returns: was it empty, and the node's run token (`SinkOptions.run_token`)."""
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


def finish_node(
    comm: Communicator,
    src: Path,
    dest: Path,
    mode: Mode,
    manifest: Manifest | None,
    work: Work,
    options: SinkOptions,
    durable: bool = False,
    previous: dict[str, Staged] | None = None,
) -> Manifest:
    """Local rank 0 writes the node's manifest (from every rank's journal); in replicate mode
    the nodes compare digests of their copies; the marker is written last (`durable`: after
    the copy is on disk). Before it, the copies of files the source no longer has are removed
    (`remove_stale`: only our own, unchanged), and what every file was made from goes into the
    sources file, the evidence of the next restage and of `mlhpc verify`."""
    topo = comm.topology
    held, error = None, None
    records: list[Staged] = []
    if topo.local_rank == 0:
        try:
            records = _node_records(dest, manifest, mode, topo, work, options)
            held = Manifest(options.algorithm, tuple(s.entry for s in records))
            if manifest is not None:
                keep_folder_modes(src, dest, (f.path for f in held.files))
            remove_stale(src, dest, previous or {}, {s.path for s in records}, options.algorithm)
            refuse_strangers(src, dest, {s.path for s in records})
            held.write(dest / MANIFEST_NAME)
        except StagingError as e:
            error = str(e)
        except OSError as e:
            error = str(destination_error(e, e.filename or dest / MANIFEST_NAME))
    digests = agree(comm, error, [topo.node, held.digest() if held else None])
    if mode == "replicate" and comm.collective:
        first = {digest: node for node, digest in reversed(digests) if digest}
        if len(first) > 1:
            nodes = sorted(first.values())
            raise StagingError(
                f"the copies on nodes {nodes[0]} and {nodes[1]} differ (manifest digests); stage again"
            )
    if held is not None:
        try:
            write_sources(dest, records)  # before the journals go: their lines are in it
            remove_journals(dest, run_tokens(dest))
            if durable:
                sync_filesystem(dest)
            marker = {"source": str(src.absolute()), "mode": mode, "node": topo.node, "nodes": topo.num_nodes}
            marker |= {"files": len(held.files), "bytes": held.total_bytes}
            atomic_write_text(dest / STAGED_MARKER, json.dumps(marker) + "\n")
        except OSError as e:
            error = str(write_error(e, str(dest / STAGED_MARKER)))
    agree(comm, error)  # a barrier that also tells every rank if a marker could not be written
    if held is None and (dest / MANIFEST_NAME).is_file():
        held = Manifest.read(dest / MANIFEST_NAME)
    return held or Manifest(options.algorithm, tuple(node_files(manifest, mode, topo)) if manifest else ())


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


def sync_filesystem(folder: Path) -> None:
    """Put everything written to `folder`'s file system on disk (syncfs; sync where it is missing)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if getattr(libc, "syncfs", None) is None or libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


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


def _node_records(
    dest: Path, manifest: Manifest | None, mode: Mode, topo: Any, work: Work, options: SinkOptions
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


def verify_staged(dest: Path, workers: int = 8) -> int:
    """Re-hash a staged directory against its manifest, and check its source where it is
    reachable (`check_source`); returns the file count, raises on a mismatch."""
    return verify_report(dest, workers)[0]


def verify_report(dest: Path, workers: int = 8) -> tuple[int, str]:
    """`verify_staged`, and one line saying what the source check could promise."""
    dest = Path(dest)
    if not (dest / STAGED_MARKER).is_file():
        raise StagingError(f"{dest} holds no complete staged dataset (no {STAGED_MARKER}); stage it again")
    manifest = Manifest.read(dest / MANIFEST_NAME)

    def check(entry: FileEntry) -> None:
        path = dest / entry.path
        try:
            size = path.stat().st_size if path.is_file() else -1
        except OSError:  # a rerun of the staging is replacing it
            size = -1
        if size != entry.size:
            raise StagingError(f"staged file {path} is missing or has the wrong size; stage again")
        fix = "a staged copy is a regular file; stage again"
        if hash_file(path, manifest.algorithm, fix) != entry.checksum:
            raise StagingError(f"staged file {path} is corrupt ({manifest.algorithm} mismatch); stage again")

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(check, manifest.files))
    return len(manifest.files), check_source(dest, manifest, workers)


def check_source(dest: Path, held: Manifest, workers: int = 8) -> str:
    """Check a staged copy against its source as it is now: every file's source still has the
    identity it had when it was copied (size, mtime, ctime, inode, device; an archive's for its
    members), its manifest's checksum is still the one the copy was checked against, and a
    source of the whole dataset has no file the copy lacks. Raises on a difference, naming the
    file; returns one line on what was checked (or that the source is not reachable)."""
    try:
        marker = safe_json.load_file(dest / STAGED_MARKER, dict, max_bytes=1 << 20)
    except (OSError, ValueError) as e:
        raise StagingError(f"{dest / STAGED_MARKER}: cannot read the marker ({e}); stage again") from e
    source = marker.get("source")
    if not isinstance(source, str) or not source:
        return f"{dest}'s marker names no source: checked against its own manifest only"
    src = Path(source)
    if not src.exists():
        return f"source {src} is not reachable from here: checked against {dest}'s manifest only"
    records = read_sources(dest)
    kind = archives.archive_kind(src) if src.is_file() else None
    try:
        if kind is not None:
            sidecar = archives.sidecar_manifest(src)
            listed = Manifest.read(sidecar) if sidecar.is_file() else None
        else:
            listed = Manifest.read(src / MANIFEST_NAME) if (src / MANIFEST_NAME).is_file() else None
    except StagingError as e:
        raise StagingError(f"{e} (the source of {dest})") from e
    expected = {f.path: f for f in listed.files} if listed is not None else {}
    archive_now = current_identity(src) if kind is not None else ""

    def judge(record: Staged) -> str:
        """'' when the record's source is unchanged; 'unknown' when nothing can tell."""
        entry = expected.get(record.source)
        if listed is not None and (entry is None or entry.checksum != record.source_checksum):
            where = sidecar if kind is not None else src / MANIFEST_NAME
            raise StagingError(
                f"staged file {dest / record.path} was copied from {record.source}, which {where} now "
                f"lists {'with another checksum' if entry else 'no longer'}; stage again"
            )
        if not record.origin:
            return "" if entry is not None else "unknown"
        now = archive_now if kind is not None else current_identity(src / record.source)
        if now != record.origin:
            what = f"the archive {src}" if kind is not None else f"its source {src / record.source}"
            raise StagingError(
                f"staged file {dest / record.path} is stale: {what} changed or went since it was copied "
                "(size, mtime, ctime or inode); stage again"
            )
        return ""

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        unknown = sum(1 for verdict in pool.map(judge, records) if verdict)
    if marker.get("mode") != "shard" and kind is None:
        names = set(expected) if listed is not None else set(list_dataset_files(src))
        missing = sorted(names - {r.source for r in records})
        if missing and records:
            raise StagingError(
                f"{src} has {len(missing)} file(s) that {dest} lacks (first: {missing[0]}); stage again"
            )
    how = "manifest checksums and identity" if listed is not None else "size, mtime, ctime and inode"
    line = f"checked against source {src}: {len(records) - unknown} files unchanged since staged ({how})"
    return line + (f"; {unknown} without a record of their source (not checked)" if unknown else "")


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
