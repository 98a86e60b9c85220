"""Checking up front that a folder given on the command line can be written, so a read-only or
mistyped `--out` / `--local-dir` is one line naming it, not a traceback minutes into a run; that
no output lands on an input of the same command; and folders a command makes for itself, marked
so that it removes only what it made in the same run."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import ConfigError
from mlhpc.common.printable import shown

# Where `staging.localdir.resolve_local_dir` looks, in its order: to name the one a path came from.
LOCAL_DIR_SOURCES = ("MLHPC_LOCAL_DIR", "SLURM_TMPDIR", "LOCAL_SCRATCH", "TMPDIR")


def check_writable_dir(path: Path | str, name: str) -> Path:
    """`path` if it is a folder (or can become one) that this process can create files in, else
    a ConfigError naming `name` (e.g. "--out"), the path and the fix. Creates nothing that stays."""
    path = Path(path)
    fix = f"pass a folder you can write to as {name}"
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name} {path} is a file, not a folder; {fix} (or move the file away)")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{name} {path}: {existing} is a file, not a folder; {fix}")
    # Try it: access() says yes to root on a read-only mount's folders and on chmod 555.
    try:
        fd, probe = tempfile.mkstemp(prefix=".mlhpc-write-test-", dir=existing)
    except OSError as e:
        raise ConfigError(
            f"{name} {path}: cannot create files in {existing} ({e.strerror or e}); {fix}"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return path


def local_dir_name(flag: Path | str | None, env: Mapping[str, str] | None = None) -> str:
    """How the user gave the node-local folder: "--local-dir", "$MLHPC_LOCAL_DIR", ..."""
    env = os.environ if env is None else env
    if flag:
        return "--local-dir"
    for variable in LOCAL_DIR_SOURCES:
        if env.get(variable):
            return f"${variable}"
    return "the system temp folder"


def _under(path: str, root: str) -> bool:
    """Whether the resolved `path` is the resolved `root` or below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


HEAD_BYTES = 64 << 10
"""How much of an existing file is read to know its kind: every signature sits in its start."""


@dataclass(frozen=True)
class OutputKind:
    """What one output option writes, and how an existing file is known to be one of its own by
    content, not name: a campaign.json, a systems JSON, a result log, the results store, a
    manifest or a marker carries none of these signatures, so no output option replaces it."""

    what: str
    """Named in the refusal: "a `mlhpc check --json` report"."""
    suffixes: tuple[str, ...]
    owns: Callable[[bytes], bool]
    """Given the first HEAD_BYTES of an existing file: whether this option wrote it."""


def json_kind(fmt: str, suffix: str = ".json") -> OutputKind:
    """A JSON object whose first key is `"format": fmt` (the writer puts it first)."""
    pattern = re.compile(rb'\A\s*\{\s*"format"\s*:\s*' + re.escape(json.dumps(fmt).encode()) + rb"\s*[,}]")
    return OutputKind(f'a JSON with "format": "{fmt}"', (suffix,), lambda head: bool(pattern.match(head)))


def csv_kind(header: str, what: str) -> OutputKind:
    """A CSV whose first line is exactly `header` (the writer's columns)."""
    first = header.encode()
    return OutputKind(what, (".csv",), lambda head: head.split(b"\n", 1)[0].rstrip(b"\r") == first)


def page_kind(generator: str) -> OutputKind:
    """An HTML page carrying `<meta name="generator" content="{generator}">` in its head."""
    meta = generator_meta(generator).encode()
    return OutputKind(f"a page of {generator}", (".html",), lambda head: meta in head)


def generator_meta(generator: str) -> str:
    """The tag a page writer puts in its <head>, so page_kind knows the page again."""
    return f'<meta name="generator" content="{html.escape(generator)}">'


PNG_KIND = OutputKind("a PNG", (".png",), lambda head: head.startswith(b"\x89PNG\r\n\x1a\n"))
"""Every mlhpc plot (common/display/plots.write_png); no other mlhpc record is a PNG."""
SQLITE_KIND = OutputKind("an SQLite database", (), lambda head: head.startswith(b"SQLite format 3\x00"))
"""The results store, under any name; its schema is proven by mlhpc.results.store before any write."""
SEED_KIND = OutputKind(
    "a seed file (one integer a line)",
    (".seed",),
    lambda head: len(head) < HEAD_BYTES and re.fullmatch(rb"(\d{1,30}\n)*", head) is not None,
)


def _head(real: str) -> bytes | None:
    """The first HEAD_BYTES of the regular file `real`, opened without blocking; None if unreadable."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        return os.read(fd, HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _inside_inputs(real: str, inputs: Sequence[Path | str]) -> tuple[str, str] | None:
    for given in inputs:
        source = os.path.realpath(given)
        if _under(real, source):
            where = "is" if real == source else "is inside"
            return f"{where} the input {shown(given)}", "write it outside what this command reads"
    return None


def _hard_link_to(status: os.stat_result, inputs: Sequence[Path | str]) -> tuple[str, str] | None:
    for given in inputs:
        with contextlib.suppress(OSError):
            theirs = os.stat(given)
            if (theirs.st_dev, theirs.st_ino) == (status.st_dev, status.st_ino):
                return (
                    f"is a hard link to the input {shown(given)}",
                    "write it outside what this command reads",
                )
    return None


def output_conflict(
    output: Path | str,
    inputs: Sequence[Path | str],
    *,
    folder: bool = False,
    suffixes: Sequence[str] = (),
    kind: OutputKind | None = None,
    writes: Mapping[str, OutputKind] | None = None,
) -> tuple[str, str] | None:
    """Why writing `output` could damage an input or another record, and the fix; None when it
    cannot. Judged on the real tree (every symlink followed, a `..` taken after the link it
    follows): the output may not be an input, lie inside an input folder, or be a hard link to
    an input file. An existing output must be of the kind written: a folder for `folder` (and
    each file `writes` names in it judged as an output of its kind), else a regular file that
    `kind` recognizes by content as this option's own (or, without `kind`, whose name ends in
    one of `suffixes`)."""
    real = os.path.realpath(output)
    inside = _inside_inputs(real, inputs)
    if inside is not None:
        return inside
    try:
        status = os.stat(real)
    except OSError:
        return None  # nothing there yet (or unreachable: the write will say so)
    if folder:
        if not stat.S_ISDIR(status.st_mode):
            return "exists and is not a folder", "pass a folder"
        for name, inner in (writes or {}).items():
            conflict = output_conflict(Path(real) / name, inputs, kind=inner)
            if conflict is not None:
                return f"holds {name}, which {conflict[0]}", conflict[1]
        return None
    if kind is not None:
        suffixes = kind.suffixes
    new_name = "pass a new name" + (f" or an existing {' or '.join(suffixes)} file" if suffixes else "")
    if not stat.S_ISREG(status.st_mode):
        return "exists and is not a regular file (a folder, FIFO or device)", new_name
    linked = _hard_link_to(status, inputs)
    if linked is not None:
        return linked
    if suffixes and not real.endswith(tuple(suffixes)):
        return f"exists and does not end in {' or '.join(suffixes)}: not a file this option writes", new_name
    if kind is not None:
        head = _head(real)
        if head is None or not kind.owns(head):
            return f"exists and is not {kind.what}: not a file this option wrote", "pass a new name"
    return None


def refuse_output_over_inputs(
    output: Path | str,
    inputs: Sequence[Path | str | None],
    option: str,
    *,
    folder: bool = False,
    suffixes: Sequence[str] = (),
    kind: OutputKind | None = None,
    writes: Mapping[str, OutputKind] | None = None,
) -> Path:
    """The real path to write `output` to, or a ConfigError naming `option`, why, and the fix.

    The one guard for every option that names an output (see `output_conflict`); any command can
    call it with its own inputs and the OutputKind it writes. The caller writes to the returned
    resolved path, so that a `..` after a symlink, or a folder made on the way, cannot land in an
    input after the judgement. `inputs` None entries (options not given) are skipped."""
    given = [Path(p) for p in inputs if p is not None]
    conflict = output_conflict(output, given, folder=folder, suffixes=suffixes, kind=kind, writes=writes)
    if conflict is not None:
        why, fix = conflict
        raise ConfigError(f"{option} {shown(output)} {why}; {fix}")
    return Path(os.path.realpath(output))


MADE_MARKER = ".mlhpc-made-by"
"""The file in a folder mlhpc made for itself; it holds the token of the run that made it."""


@dataclass(frozen=True)
class MadeDir:
    """A folder this run made (under a fresh name) and the token its marker holds."""

    path: Path
    token: str


def make_marked_dir(parent: Path | str, prefix: str) -> MadeDir:
    """A new folder under `parent` with a name no one else has (mkdtemp: created here, mode 0700),
    marked with a token of this run, for `remove_marked_dir` to prove it is ours."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    (path / MADE_MARKER).write_text(token + "\n")
    return MadeDir(path, token)


def carries_marker(made: MadeDir) -> bool:
    """Whether `made.path` is still a real folder (not a link) holding our marker with our token."""
    marker = made.path / MADE_MARKER
    try:
        if not stat.S_ISDIR(os.lstat(made.path).st_mode) or not stat.S_ISREG(os.lstat(marker).st_mode):
            return False
        with open(marker, "rb") as handle:
            return handle.read(200).decode("utf-8", "replace").strip() == made.token
    except OSError:
        return False


def remove_marked_dir(made: MadeDir) -> bool:
    """Remove `made.path` and everything in it when it still carries this run's marker; a folder
    that lost it (replaced, or a link put in its place) is left alone. True when removed."""
    if not carries_marker(made):
        return False
    shutil.rmtree(made.path, ignore_errors=True)
    return True
