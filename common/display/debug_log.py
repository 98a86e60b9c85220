"""Where log records and library warnings go: people see mlhpc's own warnings, a file gets all.

The terminal of a run is for the plan, the epochs and the results (`common/training/progress`). Warnings a
user cannot act on (a library's deprecation notice, a UserWarning from inside torch) and mlhpc's
INFO records go only to a debug log file in the run's folder, one file per process, so that a
failed run still leaves its whole story. `MLHPC_DEBUG=1` also shows everything on stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"
FILE_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


def configure_console(*, debug: bool = False) -> None:
    """stderr shows WARNING and above from mlhpc (everything with `debug`); library warnings are
    routed into logging ('py.warnings'), which reaches stderr only with `debug`."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if debug else logging.INFO)  # INFO: libraries' DEBUG floods (matplotlib)
    console = next((h for h in root.handlers if getattr(h, "mlhpc_console", False)), None)
    if console is None:
        console = logging.StreamHandler(sys.stderr)
        console.mlhpc_console = True  # type: ignore[attr-defined]
        console.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        root.addHandler(console)
    console.setLevel(logging.DEBUG if debug else logging.WARNING)
    console.filters.clear()
    if not debug:
        console.addFilter(lambda record: record.name == "mlhpc" or record.name.startswith("mlhpc."))
    logging.captureWarnings(True)


def debug_log_path(folder: Path, rank: int) -> Path:
    """<folder>/logs/debug-<UTC time>-<host>-rank<rank>-<pid>.log: unique per process, so ranks,
    seeds and Slurm jobs sharing one --out never write one file."""
    # Here, not at the top: every command configures the console, few write a debug log.
    from mlhpc.common.cluster.launch import host_label

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path(folder) / "logs" / f"debug-{stamp}-{host_label()}-rank{rank}-{os.getpid()}.log"


@contextlib.contextmanager
def debug_log(folder: Path, rank: int) -> Iterator[Path | None]:
    """Every log record (INFO and up; DEBUG with MLHPC_DEBUG) and warning of this process into
    `debug_log_path` for the block; yields the path, or None when the folder cannot take it (the
    run goes on). The file is made by the first record only, and the folders made for it are
    removed at the end if they stayed empty: a run with nothing to say leaves no empty log."""
    path = debug_log_path(folder, rank)
    made = _missing_folders(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)  # delay: opened on the first record
    except OSError:
        yield None  # an unwritable --out is reported by the run itself, in one line
        return
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each distinct warning once, into the file
            yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for empty in made:  # deepest first; rmdir refuses a folder anything else wrote into
            with contextlib.suppress(OSError):
                empty.rmdir()


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first (ours to remove)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing
