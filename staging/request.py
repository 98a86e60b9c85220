"""What a staging job is asked to do (`StageRequest`), how it copies once decided
(`CopyOptions`), and what it did (`StageReport`)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from mlhpc.common.errors import StagingError
from mlhpc.common.vocabulary import IO_CHOICES, STAGING_MODES, STAGING_WORKERS, StagingMode

DEFAULT_WORKERS = STAGING_WORKERS
DEFAULT_CHUNK_BYTES = 16 << 20
IDENTITY_PROMISE = (
    "without a manifest a file already staged is kept when its source's size, mtime, ctime and "
    "inode are unchanged since it was copied (not its bytes)"
)


@dataclass(frozen=True)
class StageRequest:
    """One staging job: copy `src` into `dest`, how, and how hard. Every rank passes the same one."""

    src: Path
    """The dataset: a directory or a .tar, .tar.gz or .tar.zst archive (a `str` is made a Path)."""
    dest: Path
    """The node-local folder that ends up holding it (a `str` is made a Path)."""
    _: KW_ONLY
    mode: StagingMode = "replicate"
    """What each node ends with (`plan.MODES`): the whole dataset read once, its share, or a copy."""
    workers: int = DEFAULT_WORKERS
    """Threads copying and hashing on each rank."""
    processes: int | None = None
    """Worker processes on each rank (0 or None: chosen by the file count)."""
    decompress: bool = False
    """Stage `x.gz`/`x.zst` files of a directory as `x`, decompressed."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Bytes one exchange message carries between nodes."""
    progress: bool = False
    """Show a progress bar (rank 0 only, at a terminal)."""
    io: str = "auto"
    """The I/O path (`vocabulary.IO_CHOICES`): "auto" or "buffered", both the one page-cache path
    (O_DIRECT and the kernel copy were removed on measurement, perf/RESULTS.md)."""
    durable: bool = False
    """Put the copy on disk (syncfs) before the completion marker is written."""
    claims: Path | None = None
    """While training reads the dataset (--staging overlap, `overlap.py`): the node-local folder,
    outside DEST, of the claims every copy takes (`CopyOptions.claims`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "src", Path(self.src))  # frozen: the one place a field is normalised
        object.__setattr__(self, "dest", Path(self.dest))
        _refuse_count("workers", self.workers, 1, "pass 1 or more threads")
        _refuse_count("chunk_bytes", self.chunk_bytes, 1, "pass 1 or more bytes (the default is 16 MiB)")
        if self.processes is not None:
            _refuse_count("processes", self.processes, 0, "pass 0 or None to choose automatically")
        if self.mode not in STAGING_MODES:
            raise StagingError(f"mode={self.mode!r} is unknown; use one of {', '.join(STAGING_MODES)}")
        refuse_unknown_io(self.io)


def _refuse_count(field: str, value: object, least: int, fix: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise StagingError(f"{field}={value!r} must be a whole number of at least {least}; {fix}")


CACHED_FRACTION = 0.9
"""The share of the sampled source bytes that must be in the page cache for the source to count
as cached (a dataset just generated, or staged a moment ago)."""


@dataclass(frozen=True)
class IoPlan:
    """The I/O path of one job, and the facts it was taken on. There is one path, through the
    page cache (`engine.py` says why); `--io auto` and `--io buffered` both take it. How much of
    the source is cached sets the copy threads: a cached source is copied at CPU speed, so
    threads beyond the CPUs only queue."""

    reason: str
    cached: float = 0.0
    """The fraction of the sampled source bytes found in the page cache."""

    label = "buffered"

    @property
    def source_cached(self) -> bool:
        return self.cached >= CACHED_FRACTION

    def metadata(self) -> dict[str, str]:
        return {"staging_io": self.label, "staging_io_reason": self.reason}


def refuse_unknown_io(io: str) -> None:
    if io not in IO_CHOICES:
        raise StagingError(
            f"io={io!r} is unknown; use one of {', '.join(IO_CHOICES)} (direct and kernel were "
            "removed: measured slower than the page-cache path)"
        )


def decide_io(io: str, share_bytes: int, cached: float) -> IoPlan:
    """The path for `io` ("auto" or "buffered": the same one), with the facts in its reason."""
    refuse_unknown_io(io)
    facts = f"share {share_bytes >> 20} MiB, source {cached:.0%} cached"
    return IoPlan(f"{io}: through the page cache ({facts})", cached)


@dataclass(frozen=True)
class CopyOptions:
    """How this rank copies, decided once from the request and the node's facts (`stage.py`)
    and carried unchanged to every writer: the engine, the worker processes (as JSON), the
    exchange and the extractor."""

    mode: StagingMode = "copy"
    algorithm: str = "xxh3_128"
    decompress: bool = False
    """Decompress `.gz`/`.zst` files; the staged file drops the suffix."""
    umask: int | None = None
    """The umask staging runs under (None: unknown). A staged file keeps its source's mode; only
    when the umask strips some of its bits does that take a `fchmod` more."""
    run_token: str = ""
    """This staging's token, recorded in DEST before any temporary file is made and carried in
    every temporary file's name: a later run removes a temporary file only when its name carries
    a token DEST's bookkeeping records (`engine.partial_name`), never a user's file of a similar name."""
    threads: int = 8
    """Copies at once in each process."""
    processes: int = 1
    """Worker processes copying (1: the copies run in this one)."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    progress: bool = False
    claims: str = ""
    """The claims folder while training reads the dataset (--staging overlap): each copy takes
    its file's claim first (`engine.copy_once`); "" when nobody else copies."""


@dataclass(frozen=True)
class StageReport:
    """What staging did; `files`/`bytes` are what this node holds, the rest this rank's work."""

    dest: Path
    files: int
    bytes: int
    seconds: float
    mode: str = "copy"
    copied_files: int = 0
    """Files this rank wrote (resumed ones excluded)."""
    skipped_files: int = 0
    """Files this rank found staged and verified already (a resumed run)."""
    read_bytes: int = 0
    """Bytes this rank read from the source."""
    job_read_bytes: int = 0
    """Bytes all ranks together read from the source (replicate: the dataset once)."""
    node: int = 0
    num_nodes: int = 1
    io: IoPlan | None = None
    """The I/O path this rank took, and why."""
    durable: bool = False
    """Whether the copy was on disk before the marker was written (`--durable`)."""
    checked_by: str = "checksums"
    """What a kept file was judged on: "checksums" (a manifest) or "identity" (size, mtime,
    ctime and inode of its source, `IDENTITY_PROMISE`)."""
    warnings: tuple[str, ...] = ()
    """What the staging cannot promise about this source, one line each (a checksum-less archive)."""

    def metadata(self) -> dict[str, float | int | str | bool]:
        io = self.io.metadata() if self.io else {}
        return {
            "staging_duration": self.seconds,
            "staged_files": self.files,
            "staged_bytes": self.bytes,
            **io,
            "staging_durable": self.durable,
        }
