"""Staging slowed for the overlap tests (`--staging overlap`): each staged file waits until
training has copied a sample itself (so staging cannot finish before the first epoch reads),
then `delay` seconds more (a shared file system under load). Patched into this process only."""

from __future__ import annotations

import time
from typing import Any

from mlhpc.staging import parallel
from mlhpc.staging.engine import demand_copies

WAIT_FOR_TRAINING_S = 120.0
LISTS = 4
"""CosmoFlow's file lists (data and labels of two splits), which the loaders read at setup:
training has read a sample once it copied more files than these."""


def slow_staging(delay: float) -> None:
    real = parallel.copy_once
    training_read: list[bool] = []

    def slow(src_root: str, dest_root: str, entry: Any, options: Any, by: str, *rest: Any) -> Any:
        deadline = time.monotonic() + WAIT_FOR_TRAINING_S
        while not training_read and time.monotonic() < deadline:
            if demand_copies(options.claims) > LISTS:  # a scan of the claims: only until it says yes
                training_read.append(True)
            time.sleep(0.01)
        time.sleep(delay)
        return real(src_root, dest_root, entry, options, by, *rest)

    parallel.copy_once = slow  # type: ignore[assignment]
