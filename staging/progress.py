"""The staging progress bar: files, bytes and MB/s, on rank 0 at a terminal only."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from types import TracebackType

from mlhpc.staging.sink import Staged


class StageProgress:
    """A rich progress bar over this rank's share; does nothing unless enabled at a terminal."""

    def __init__(self, enabled: bool, files: int, total_bytes: int, label: str) -> None:
        self._bar = None
        self._lock = threading.Lock()
        self._files = 0
        self._total_files = files
        if not (enabled and sys.stderr.isatty()):
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[files]}"),
            DownloadColumn(),
            TransferSpeedColumn(),
            transient=False,
        )
        self._task = self._bar.add_task(label, total=total_bytes, files=f"0/{files} files")

    def advance(self, staged: Sequence[Staged]) -> None:
        if self._bar is None:
            return
        with self._lock:
            self._files += len(staged)
            self._bar.update(
                self._task,
                advance=sum(s.size for s in staged),
                files=f"{self._files}/{self._total_files} files",
            )

    def __enter__(self) -> StageProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
