"""Reading files that other programs wrote without hanging, crashing or following links out: every
command that reads results (`check`, `variability`, `report`, `run --resume`) goes through here.

`open()` on a FIFO blocks until a writer comes and a symbolic link loop fails every `stat`, so a
file is looked at with `stat` first, opened non-blocking, and looked at again on the open
descriptor (the name may point elsewhere by then). Torch-free, like the checker.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

RefusalKind = Literal["missing", "unreadable", "not-a-file", "too-big", "link-out", "link-loop"]


@dataclass(frozen=True)
class Refusal:
    """Why a file is not read, and what fixes that."""

    kind: RefusalKind
    reason: str
    fix: str

    def line(self, path: Path | str) -> str:
        """One line for a warning or an error: the path, what is wrong, the fix."""
        return f"{path}: {self.reason}; {self.fix}"


class RefusedFile(OSError):
    """`open_text`/`open_binary` met a file `refusal` refuses; `strerror` is the reason."""

    def __init__(self, path: Path | str, refused: Refusal) -> None:
        super().__init__(errno.EINVAL, refused.reason, str(path))
        self.refusal = refused


def _size_text(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size} bytes"


def _judge(info: os.stat_result, max_bytes: int | None, what: str) -> Refusal | None:
    if not stat.S_ISREG(info.st_mode):
        return Refusal("not-a-file", "not a regular file", "replace it with the file itself, or move it away")
    if max_bytes is not None and info.st_size > max_bytes:
        return Refusal(
            "too-big",
            f"{_size_text(info.st_size)}, more than the {_size_text(max_bytes)} {what} may have",
            "move it away",
        )
    return None


def refusal(path: Path | str, max_bytes: int | None = None, *, what: str = "such a file") -> Refusal | None:
    """Why `path` must not be read (cannot stat it, not a regular file, bigger than `max_bytes`), or None.

    Follows links (a loop cannot be stat'ed: unreadable); `link_out` judges where they lead.
    """
    try:
        info = os.stat(path)
    except OSError as e:
        return _stat_refusal(e)
    return _judge(info, max_bytes, what)


def _stat_refusal(error: OSError) -> Refusal:
    """A name that cannot be stat'ed: "missing" (not there) is told apart, for `_open_fd`."""
    kind: RefusalKind = "missing" if error.errno == errno.ENOENT else "unreadable"
    return Refusal(kind, f"cannot read the file: {error.strerror or error}", "make it a readable file")


def link_out(path: Path | str, root: Path | str, *, outside: str | None = None) -> str | None:
    """Why the link `path` must not be followed (it leads out of `root`, or loops), or None.

    `outside` names `root` in the message (default: its path).
    """
    path, root = Path(path), Path(root).resolve()
    if not path.is_symlink():
        return None
    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # Python 3.11 raises RuntimeError on a loop
        return "is a symbolic link loop"
    if target == root or root in target.parents:
        return None
    return f"is a symbolic link to {target}, outside {outside or root}"


def link_refusal(why: str) -> Refusal:
    """A `link_out` answer as a Refusal."""
    if why.endswith("loop"):
        return Refusal("link-loop", why, "remove the link")
    return Refusal("link-out", why, "copy the file into the folder instead of linking it")


def judge(
    path: Path | str, root: Path | str, max_bytes: int | None = None, *, what: str = "such a file"
) -> Refusal | None:
    """Why `path`, found under `root`, must not be read: a link out of `root` or a loop, else
    what `refusal` says; None when it may be read."""
    why = link_out(path, root)
    return link_refusal(why) if why is not None else refusal(path, max_bytes, what=what)


def _open_fd(path: Path | str, max_bytes: int | None, what: str, *, follow: bool = True) -> int:
    """A descriptor of the regular file `path`; RefusedFile for what must not be read, and
    FileNotFoundError, as `open` gives, for a name that is not there (a caller may expect that)."""
    refused = refusal(path, max_bytes, what=what) if follow else _lrefusal(path, max_bytes, what)
    if refused is not None:
        if refused.kind == "missing":
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        raise RefusedFile(path, refused)
    # Non-blocking: if the name became a FIFO since the stat, open returns instead of waiting.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno != errno.ELOOP or follow:
            raise
        raise RefusedFile(path, Refusal("not-a-file", "a symbolic link", "remove the link")) from None
    try:
        refused = _judge(os.fstat(fd), max_bytes, what)
        if refused is not None:
            raise RefusedFile(path, refused)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lrefusal(path: Path | str, max_bytes: int | None, what: str) -> Refusal | None:
    """`refusal` of the name itself: a symbolic link is refused, not followed."""
    try:
        info = os.lstat(path)
    except OSError as e:
        return _stat_refusal(e)
    if stat.S_ISLNK(info.st_mode):
        return Refusal("not-a-file", "a symbolic link", "remove the link")
    return _judge(info, max_bytes, what)


def open_text(
    path: Path | str, max_bytes: int | None = None, *, encoding: str = "latin-1", what: str = "such a file"
) -> IO[str]:
    """`open(path, encoding=encoding)` of a regular file only; RefusedFile (an OSError) otherwise."""
    return open(_open_fd(path, max_bytes, what), encoding=encoding, closefd=True)


def read_bytes(path: Path | str, max_bytes: int | None = None, *, what: str = "such a file") -> bytes:
    """The bytes of a regular file of at most `max_bytes`; RefusedFile (an OSError) otherwise."""
    with open(_open_fd(path, max_bytes, what), "rb", closefd=True) as handle:
        data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:  # it grew after the check
        raise RefusedFile(path, Refusal("too-big", f"more than {_size_text(max_bytes)}", "move it away"))
    return data


def read_bytes_stat(
    path: Path | str, max_bytes: int, *, what: str = "such a file", follow: bool = True
) -> tuple[bytes, os.stat_result]:
    """`read_bytes`, and the `fstat` of the very file read (its owner, for a file in a folder
    others write to); with `follow=False` a symbolic link is refused, not followed."""
    fd = _open_fd(path, max_bytes, what, follow=follow)
    with open(fd, "rb", closefd=True) as handle:
        info = os.fstat(fd)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise RefusedFile(path, Refusal("too-big", f"more than {_size_text(max_bytes)}", "move it away"))
    return data, info


def find_files(
    folder: Path | str, pattern: str, max_bytes: int | None = None, *, what: str = "such a file"
) -> tuple[list[Path], list[tuple[Path, Refusal]]]:
    """The readable files under `folder` whose name matches `pattern` (fnmatch), and those refused.

    Links to folders are followed only inside `folder`, and each folder is listed once, so a
    link loop ends the walk there. A matching name that is a link out or a loop, not a regular
    file, too big or unreadable comes back refused; an unreadable folder too.
    """
    root = Path(folder).resolve()
    found: list[Path] = []
    refused: list[tuple[Path, Refusal]] = []
    seen: set[tuple[int, int]] = set()
    stack = [Path(folder)]
    while stack:
        current = stack.pop()
        try:
            info = current.stat()
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(current) as listing:
                entries = sorted(listing, key=lambda e: e.name, reverse=True)
        except OSError as e:
            refused.append(
                (current, Refusal("unreadable", f"cannot list it: {e.strerror or e}", "make it readable"))
            )
            continue
        for entry in entries:
            path = Path(entry.path)
            matches = fnmatch.fnmatchcase(entry.name, pattern)
            why = link_out(path, root) if entry.is_symlink() else None
            if why is not None:
                if matches:
                    refused.append((path, link_refusal(why)))
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                stack.append(path)
            elif matches:
                problem = refusal(path, max_bytes, what=what)
                if problem is None:
                    found.append(path)
                else:
                    refused.append((path, problem))
    return sorted(found), refused
