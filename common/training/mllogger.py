"""A thin layer over `mlperf_logging.mllog`: one result file per run, written by global rank 0 only.

The file is written under a temporary name and renamed when the run ends, so a result file
is never half-written; rank 0 also echoes every line to stdout.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
from pathlib import Path
from typing import Any

from mlperf_logging import mllog
from mlperf_logging.mllog import constants

from mlhpc.common.errors import SubmissionError

_counter = itertools.count()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


class _ResultFileHandler(logging.FileHandler):
    """The result log's handler: a failed write (a full disk, a quota) is kept as one SubmissionError
    naming the file, where logging would print a "--- Logging error ---" block for every line.

    mllog swallows what a handler raises, so `MLLog` raises the kept error after each event.
    """

    def __init__(self, tmp_path: Path, result_path: Path) -> None:
        super().__init__(tmp_path, mode="w", encoding="utf-8")
        self.result_path = result_path
        self.error: SubmissionError | None = None

    def fail(self, error: BaseException | None) -> SubmissionError:
        if self.error is None:
            why = getattr(error, "strerror", None) or error
            self.error = SubmissionError(
                f"cannot write the result log {self.result_path}: {why}; free space on "
                f"{self.result_path.parent} (or check its quota and permissions), or pass another --out"
            )
            self.error.__cause__ = error
        return self.error

    def emit(self, record: logging.LogRecord) -> None:
        if self.error is None:  # one report; the run is stopping
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        self.fail(sys.exc_info()[1])

    def close(self) -> None:
        if self.error is None:
            super().close()
            return
        with contextlib.suppress(OSError):  # the buffered rest cannot be written either
            super().close()


class MLLog:
    """One run's MLLOG stream; `enabled=False` (ranks other than 0) logs nothing."""

    def __init__(
        self,
        result_path: Path | None,
        *,
        enabled: bool,
        echo: bool = True,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.result_path = Path(result_path) if result_path is not None else None
        self.enabled = enabled
        self.metadata = dict(metadata or {})
        """Added to every event's metadata, e.g. {"instance": 3} in a weak-scaling job."""
        self._tmp_path: Path | None = None
        self._file: _ResultFileHandler | None = None
        self._raised = False
        self._logger = logging.getLogger(f"mlhpc.mllog.run{next(_counter)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        if enabled and self.result_path is not None:
            self.result_path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp_path = self.result_path.with_name(f".{self.result_path.name}.{os.getpid()}.tmp")
            self._file = _ResultFileHandler(self._tmp_path, self.result_path)
            self._logger.addHandler(self._file)
        if enabled and echo:
            self._logger.addHandler(logging.StreamHandler(sys.stdout))
        if not self._logger.handlers:
            self._logger.addHandler(logging.NullHandler())
        # mllog keeps one module-level logger: point it at this run's handlers.
        mllog.config(logger=self._logger, default_stack_offset=2, root_dir=_PACKAGE_ROOT)
        self._mllogger = mllog.get_mllogger()

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self.enabled:
            self._mllogger.event(key=key, value=value, metadata=self._with_base(metadata))
            self._raise_write_error()

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self.enabled:
            self._mllogger.start(key=key, value=value, metadata=self._with_base(metadata))
            self._raise_write_error()

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self.enabled:
            self._mllogger.end(key=key, value=value, metadata=self._with_base(metadata))
            self._raise_write_error()

    def _raise_write_error(self) -> None:
        """Raise a failed write once; the lines logged after it (while the run stops) are dropped."""
        if self._file is not None and self._file.error is not None and not self._raised:
            self._raised = True
            raise self._file.error

    def _with_base(self, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        if not self.metadata:
            return metadata
        return {**(metadata or {}), **self.metadata}

    def close(self) -> Path | None:
        """Flush, close and move the finished log to its final name; return that path.

        A log that could not be written whole is removed (SubmissionError): never half a result.
        """
        for handler in list(self._logger.handlers):
            try:
                handler.flush()
                handler.close()
            except OSError as e:
                if handler is not self._file:
                    raise
                self._file.fail(e)
            self._logger.removeHandler(handler)
        if self._file is not None and self._file.error is not None:
            error = self._file.error
            self.discard()
            raise error
        if self._tmp_path is None or self.result_path is None:
            return None
        os.replace(self._tmp_path, self.result_path)
        self._tmp_path = None
        return self.result_path

    def discard(self) -> None:
        """Drop an unfinished log (the run never started): nothing is left behind."""
        for handler in list(self._logger.handlers):
            handler.close()
            self._logger.removeHandler(handler)
        if self._tmp_path is not None:
            self._tmp_path.unlink(missing_ok=True)
            self._tmp_path = None


__all__ = ["MLLog", "constants"]
