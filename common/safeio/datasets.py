"""Checks every benchmark's dataset reader starts with, and the opening of its sample files (no
torch here)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from mlhpc.common.errors import DataError
from mlhpc.common.printable import shown

DATASET_COMPLETE = ".mlhpc_generated"
"""In a dataset folder mlhpc generated, written last (see `mlhpc.generation`)."""
DATASET_GENERATING = ".mlhpc_generating"
"""In a dataset folder mlhpc is generating (or was, when killed), written first."""


def existing_data_dir(data_dir: Path | str, benchmark: str) -> Path:
    """`data_dir` as a Path; a DataError with the way out when it is missing."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(
            f"data directory {data_dir} does not exist; drop --data to generate synthetic data "
            f"or run `mlhpc generate {benchmark} --out DIR`"
        )
    return data_dir


# ---------------------------------------------------------------- sample files, never a FIFO
# open() of a FIFO waits for a writer; under h5py it waits holding the GIL, so no signal handler
# runs and SIGTERM and Ctrl-C are ignored. Every sample is judged by its type twice: when the
# dataset is listed (one scandir, no stat per file) and on the descriptor that is then read.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def not_a_file(path: Path | str, mode: int) -> DataError:
    """The one line for a dataset entry that is not a regular file."""
    return DataError(
        f"{shown(path)} is {_kind(mode)}, not a regular file; replace it with the sample's file "
        "or remove it from the dataset"
    )


def _entry_mode(entry: os.DirEntry[str]) -> int | None:
    """The entry's file type (following a link), read from the listing where it says it; None if gone."""
    try:
        if entry.is_file():
            return stat.S_IFREG
        return entry.stat().st_mode
    except OSError:
        return None  # a dangling link or a name gone since the listing: the open says which


def list_samples(folder: Path, matches: Callable[[str], bool]) -> dict[str, Path]:
    """The entries of `folder` whose names `matches`, by name; DataError naming the first one that
    is a FIFO, device, socket or folder. One scandir: the types come from the listing."""
    found: dict[str, Path] = {}
    try:
        with os.scandir(folder) as listing:
            entries = sorted((e for e in listing if matches(e.name)), key=lambda e: e.name)
    except OSError as e:
        raise DataError(f"cannot list {shown(folder)} ({e.strerror or e}); check --data") from e
    for entry in entries:
        mode = _entry_mode(entry)
        if mode is not None and not stat.S_ISREG(mode):
            raise not_a_file(entry.path, mode)
        found[entry.name] = Path(entry.path)
    return found


def _mode_or_none(path: Path | str) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


# ---------------------------------------------------------------- a copy still being made
class ReadThrough(Protocol):
    """A node-local copy of a dataset that staging is still making (`--staging overlap`): the
    loaders list the source, and each of its files is read from the copy, which the read makes
    first when staging has not reached it yet (`mlhpc.staging.overlap`)."""

    def local_path(self, path: str) -> str | None:
        """Where the source file `path` is read from, copied now if need be; None for a path
        that is not one of the dataset's files."""
        ...


_READ_THROUGH: list[ReadThrough] = []
"""The copies being made in this process (inherited by a forked DataLoader worker)."""


@contextlib.contextmanager
def reading_through(copy: ReadThrough) -> Iterator[None]:
    """Read the dataset's files through `copy` (`open_sample`, `open_h5`) in this block."""
    _READ_THROUGH.append(copy)
    try:
        yield
    finally:
        _READ_THROUGH.remove(copy)


@dataclass(frozen=True)
class RestoreReadThrough:
    """A DataLoader `worker_init_fn` that brings this process's copies into a worker started
    without them (the spawn and forkserver start methods; a forked worker has them already)."""

    copies: tuple[ReadThrough, ...] = field(default_factory=lambda: tuple(_READ_THROUGH))

    def __call__(self, worker_id: int) -> None:
        _READ_THROUGH.extend(c for c in self.copies if c not in _READ_THROUGH)


def _read_from(path: Path | str) -> Path | str:
    for copy in _READ_THROUGH:
        local = copy.local_path(os.fspath(path))
        if local is not None:
            return local
    return path


def open_sample(path: Path | str) -> BinaryIO:
    """`open(path, "rb")` of a regular file only, never waiting on a FIFO that appeared since the
    listing: opened non-blocking and judged on the descriptor. FileNotFoundError passes on.
    A file of a dataset being staged is read from its node-local copy (`reading_through`)."""
    path = _read_from(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:  # a socket cannot be opened at all (ENXIO): say what it is
        mode = _mode_or_none(path) if not isinstance(e, FileNotFoundError) else None
        if mode is not None and not stat.S_ISREG(mode):
            raise not_a_file(path, mode) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_a_file(path, mode)
        os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def open_h5(path: Path | str) -> Any:
    """`h5py.File(path, "r")` of a regular file only (see `open_sample`), and only when everything
    in it lives in it (`refuse_reaching_out`). Read-only, h5py's default locking (a shared lock,
    taken without waiting; another open of the same file in this process must use the same flag).
    h5py opens the checked descriptor where Linux shows it (/proc/self/fd: the same file, whatever
    `path` names by now). Every HDF5 sample, stats or year file mlhpc reads is opened here."""
    import h5py  # only the readers of HDF5 datasets pay for it

    with open_sample(path) as handle:
        proc = f"/proc/self/fd/{handle.fileno()}"
        h5 = h5py.File(proc if os.path.exists(proc) else path, "r")
    try:
        refuse_reaching_out(h5, path)
    except BaseException:
        h5.close()
        raise
    return h5


# ---------------------------------------------------------------- HDF5 that reads outside itself
# A dataset with external storage reads raw bytes from any file it names (a FIFO: a read that
# blocks holding the GIL, past SIGTERM and Ctrl-C; /etc/shadow: trained on); a virtual dataset
# opens other HDF5 files, an external link another file. The check walks links and dataset
# creation properties only, which h5py reads from this file's own metadata: no external file is
# opened until data is read or (an unlimited virtual dataset) its extent is asked, which it never
# is here. So it cannot hang, and it costs one walk per open, not per sample read.
MAX_H5_LINKS = 1024
"""More links than any sample, stats or year file holds (they hold 2-6): a bound on the walk."""
_H5_FIX = "rewrite it with all its data inside the file, or regenerate the dataset"


def refuse_reaching_out(h5: Any, path: Path | str) -> None:
    """DataError naming `path`, the object and the fix for an external or user-defined link, a
    dataset with external storage or a virtual dataset anywhere in the open file `h5`. A soft link
    stays in the file: whatever it names is reached by hard links too, and checked there."""
    from h5py import h5l

    links: list[tuple[bytes, int]] = []

    def note(name: bytes, info: Any) -> bool | None:
        # Raising inside h5py's visit callback surfaces as a SystemError: judge after the walk.
        links.append((name, info.type))
        return True if len(links) > MAX_H5_LINKS else None  # a true value stops the walk

    h5.id.links.visit(note, info=True)
    if len(links) > MAX_H5_LINKS:
        raise DataError(f"{shown(path)} holds more than {MAX_H5_LINKS} objects; {_H5_FIX}")
    for name, kind in links:
        if kind == h5l.TYPE_EXTERNAL:
            target = h5.id.links.get_val(name)[0].decode(errors="replace")
            _refuse(path, name, f"is an external link to {shown(target)}")
        elif kind not in (h5l.TYPE_HARD, h5l.TYPE_SOFT):
            _refuse(path, name, f"is a user-defined link (type {kind})")
    for name, kind in links:
        if kind == h5l.TYPE_HARD:
            _judge_object(h5, path, name)


def _judge_object(h5: Any, path: Path | str, name: bytes) -> None:
    """A dataset's creation properties, read through the low-level id: the high-level Dataset asks
    for the extent, which opens the source files of an unlimited virtual dataset."""
    from h5py import h5d, h5o

    dataset = h5o.open(h5.id, name)
    if not isinstance(dataset, h5d.DatasetID):
        return
    dcpl = dataset.get_create_plist()
    if dcpl.get_external_count() > 0:
        target = dcpl.get_external(0)[0].decode(errors="replace")
        _refuse(path, name, f"keeps its data in another file ({shown(target)}, HDF5 external storage)")
    if dcpl.get_layout() == h5d.VIRTUAL:
        target = dcpl.get_virtual_filename(0) if dcpl.get_virtual_count() else "?"
        _refuse(path, name, f"is a virtual dataset reading {shown(target)}")


def _refuse(path: Path | str, name: bytes, what: str) -> None:
    raise DataError(f"{shown(path)}: {shown(name.decode(errors='replace'))} {what}; {_H5_FIX}")
