"""The MLLOG intervals of one run, kept well formed: every *_start gets its *_stop, in order,
with the same epoch_num, also when the run aborts or fails inside the interval."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mlhpc.common.training.mllogger import MLLog, constants


@contextlib.contextmanager
def interval(log: MLLog, start: str, stop: str, metadata: dict[str, Any] | None = None) -> Iterator[dict]:
    """Log `start`, run the body, log `stop` however the body ends. The body may add to the yielded
    dict: it is `stop`'s metadata (staging_stop's report, run_stop's status)."""
    log.start(start, metadata=dict(metadata) if metadata else None)
    stop_metadata: dict[str, Any] = dict(metadata or {})
    try:
        yield stop_metadata
    finally:
        log.end(stop, metadata=stop_metadata or None)


def epoch(log: MLLog, number: int) -> contextlib.AbstractContextManager[dict]:
    return interval(log, constants.EPOCH_START, constants.EPOCH_STOP, {constants.EPOCH_NUM: number})


def evaluation(log: MLLog, number: int) -> contextlib.AbstractContextManager[dict]:
    return interval(log, constants.EVAL_START, constants.EVAL_STOP, {constants.EPOCH_NUM: number})


def staging(log: MLLog) -> contextlib.AbstractContextManager[dict]:
    return interval(log, constants.STAGING_START, constants.STAGING_STOP)


def init(log: MLLog) -> contextlib.AbstractContextManager[dict]:
    return interval(log, constants.INIT_START, constants.INIT_STOP)


@contextlib.contextmanager
def run(log: MLLog) -> Iterator[dict]:
    """run_start .. run_stop; run_stop says aborted at epoch 0 unless the body says otherwise."""
    log.start(constants.RUN_START)
    stop_metadata: dict[str, Any] = {constants.STATUS: constants.ABORTED, constants.EPOCH_NUM: 0}
    try:
        yield stop_metadata
    finally:
        log.end(constants.RUN_STOP, metadata=stop_metadata)
