"""Checking up front that a folder given on the command line can be written, so a read-only or
mistyped `--out` / `--local-dir` is one line naming it, not a traceback minutes into a run; that
no output lands on an input of the same command; and folders a command makes for itself, marked
so that it removes only what it made in the same run."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Mapping, Sequence
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


def output_conflict(
    output: Path | str, inputs: Sequence[Path | str], *, folder: bool = False, suffixes: Sequence[str] = ()
) -> tuple[str, str] | None:
    """Why writing `output` could damage an input, and the fix; None when it cannot. Judged on
    the real tree (every symlink followed, a `..` taken after the link it follows): the output
    may not be an input, lie inside an input folder, or be a hard link to an input file. An
    existing output must be of the kind written: a folder for `folder`, else a regular file whose
    name ends in one of `suffixes` (an existing `result_0.txt` is never replaced by a PNG)."""
    real = os.path.realpath(output)
    elsewhere = "write it outside what this command reads"
    for given in inputs:
        source = os.path.realpath(given)
        if _under(real, source):
            where = "is" if real == source else "is inside"
            return f"{where} the input {shown(given)}", elsewhere
    try:
        status = os.stat(real)
    except OSError:
        return None  # nothing there yet (or unreachable: the write will say so)
    if folder:
        return None if stat.S_ISDIR(status.st_mode) else ("exists and is not a folder", "pass a folder")
    new_name = "pass a new name" + (f" or an existing {' or '.join(suffixes)} file" if suffixes else "")
    if not stat.S_ISREG(status.st_mode):
        return "exists and is not a regular file (a folder, FIFO or device)", new_name
    for given in inputs:
        with contextlib.suppress(OSError):
            theirs = os.stat(given)
            if (theirs.st_dev, theirs.st_ino) == (status.st_dev, status.st_ino):
                return f"is a hard link to the input {shown(given)}", elsewhere
    if suffixes and not real.endswith(tuple(suffixes)):
        return f"exists and does not end in {' or '.join(suffixes)}: not a file this option writes", new_name
    return None


def refuse_output_over_inputs(
    output: Path | str,
    inputs: Sequence[Path | str | None],
    option: str,
    *,
    folder: bool = False,
    suffixes: Sequence[str] = (),
) -> Path:
    """The real path to write `output` to, or a ConfigError naming `option`, why, and the fix.

    The one guard for every option that names an output (see `output_conflict`); any command can
    call it with its own inputs. The caller writes to the returned resolved path, so that a `..`
    after a symlink, or a folder made on the way, cannot land in an input after the judgement.
    `inputs` None entries (options not given) are skipped."""
    given = [Path(p) for p in inputs if p is not None]
    conflict = output_conflict(output, given, folder=folder, suffixes=suffixes)
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
