"""One judge for every path that comes from outside: archive members, manifests, journals, file lists.

A path from a file we did not write is text until it is judged here: `relative_path` says
whether it names something under a root (no absolute path, drive letter, '..', NUL byte or
backslash), and `landing` says whether writing it would stay under the root on the real tree
(no directory on the way is a symlink, which could lead anywhere). Refusals are StagingErrors
that name where the path came from and what to do about it.
"""

from __future__ import annotations

import os
import re
import stat

from mlhpc.common.errors import StagingError

_DRIVE = re.compile(r"^[A-Za-z]:")


def _problem(name: str) -> str | None:
    """What makes `name` unusable as a relative path, or None."""
    if not isinstance(name, str):
        return "is not a string"
    if "\0" in name:
        return "contains a NUL byte"
    if "\\" in name:
        return "contains a backslash (a Windows separator, or a trick)"
    if name.startswith("/") or _DRIVE.match(name):
        return "has an absolute path"
    return None


def _plain(name: object) -> bool:
    """Whether `name` is already a normalised relative path: no component empty, '.' or '..'
    (nor any starting with '.': those take the long way), no NUL, backslash or drive letter."""
    return (
        isinstance(name, str)
        and name[:1] not in ("", "/", ".")
        and name[1:2] != ":"
        and name[-1] != "/"
        and "/." not in name
        and "//" not in name
        and "\0" not in name
        and "\\" not in name
    )


def relative_path(name: str, where: str, fix: str, *, root_ok: bool = False) -> str:
    """`name` as a normalised '/'-separated path under a root ("" for the root itself when
    `root_ok`); refuses anything that could leave the root. `where` names the source
    ("<file>: member"), `fix` what to do ("rebuild the archive without it")."""
    if _plain(name):
        return name  # the common case, judged in a few substring tests (manifests of 10^6 files)
    problem = _problem(name)
    if problem is None:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            problem = "climbs out with '..'"
        elif not parts and not root_ok:
            problem = "is empty"
        else:
            return "/".join(parts)
    raise StagingError(f"{where} {name!r} {problem}; refused: {fix}")


def link_target(target: str, where: str, fix: str) -> str:
    """A symlink's target as text: relative (it is judged again on the real tree by `inside`),
    '..' allowed; nothing absolute, empty, with a NUL byte or a backslash."""
    problem = _problem(target) if target else "is empty"
    if problem is not None:
        raise StagingError(f"{where} links to {target!r}, which {problem}; refused: {fix}")
    return target


def inside(path: str, real_root: str) -> bool:
    """Whether `path`, resolved on the real tree (every symlink on the way followed), is
    `real_root` or under it; `real_root` is already `os.path.realpath`ed."""
    resolved = os.path.realpath(path)
    return resolved == real_root or resolved.startswith(real_root.rstrip(os.sep) + os.sep)


def landing(root: str, rel: str, where: str, fix: str, known: set[str] | None = None) -> str:
    """Where writing `rel` (from `relative_path`) under `root` really lands: `root/rel`, once no
    directory between them is a symlink (a link could lead out, or to another place under the
    root). The last component is the caller's: a writer replaces it, never goes through it.
    `known`: directories (relative) checked before, skipped; those checked now are added."""
    parent = rel.rpartition("/")[0]
    if not parent or (known is not None and parent in known):
        return os.path.join(root, rel)
    step = ""
    for part in parent.split("/"):
        step = f"{step}/{part}" if step else part
        if known is not None and step in known:
            continue
        try:
            mode = os.lstat(os.path.join(root, step)).st_mode
        except FileNotFoundError:
            break  # made as a real directory when written
        if stat.S_ISLNK(mode):
            raise StagingError(f"{where} {rel!r} goes through the symlink {step!r}; refused: {fix}")
        if not stat.S_ISDIR(mode):
            raise StagingError(f"{where} {rel!r} goes through {step!r}, which is not a directory; {fix}")
        if known is not None:
            known.add(step)
    return os.path.join(root, rel)
