"""Staging slowed for the overlap tests (`--staging overlap`): each staged file waits until
training has copied a file itself (so staging cannot finish before the first epoch reads), then
`delay` seconds more (a shared file system under load). Patched into this process only."""

from __future__ import annotations

import time
from typing import Any

from mlhpc.staging import parallel
from mlhpc.staging.engine import demand_copies

WAIT_FOR_TRAINING_S = 120.0


def slow_staging(delay: float) -> None:
    real = parallel.copy_once

    def slow(src_root: str, dest_root: str, entry: Any, options: Any, by: str, *rest: Any) -> Any:
        deadline = time.monotonic() + WAIT_FOR_TRAINING_S
        while not demand_copies(options.claims) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        return real(src_root, dest_root, entry, options, by, *rest)

    parallel.copy_once = slow  # type: ignore[assignment]
