"""A thin layer over `mlperf_logging.mllog`: one result file per run, written by global rank 0 only.

The file is written under a temporary name and renamed when the run ends, so a result file
is never half-written; rank 0 also echoes every line to stdout.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from pathlib import Path
from typing import Any

from mlperf_logging import mllog
from mlperf_logging.mllog import constants

_counter = itertools.count()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


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
        self._logger = logging.getLogger(f"mlhpc.mllog.run{next(_counter)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        if enabled and self.result_path is not None:
            self.result_path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp_path = self.result_path.with_name(f".{self.result_path.name}.{os.getpid()}.tmp")
            self._logger.addHandler(logging.FileHandler(self._tmp_path, mode="w", encoding="utf-8"))
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

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self.enabled:
            self._mllogger.start(key=key, value=value, metadata=self._with_base(metadata))

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        if self.enabled:
            self._mllogger.end(key=key, value=value, metadata=self._with_base(metadata))

    def _with_base(self, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        if not self.metadata:
            return metadata
        return {**(metadata or {}), **self.metadata}

    def close(self) -> Path | None:
        """Flush, close and move the finished log to its final name; return that path."""
        for handler in list(self._logger.handlers):
            handler.flush()
            handler.close()
            self._logger.removeHandler(handler)
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
