"""How OpenMP threads wait: spin briefly, then sleep (see threads.py for why).

Apart from threads.py so that `mlhpc/__init__.py`, which must set this before anything imports
torch, costs every command (`mlhpc stage --help` too) one `os` import, not threads' dataclasses.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping  # not typing's TYPE_CHECKING: typing costs ~5 ms

SHORT_SPIN = {"GOMP_SPINCOUNT": "3000", "KMP_BLOCKTIME": "0"}
"""Spin ~3,000 iterations (microseconds) before sleeping: as fast as torch's default on an idle
machine, and 20x faster than it when another process holds the cores (perf/threads.py)."""


def wait_briefly(environ: MutableMapping[str, str] | None = None) -> None:
    """Have OpenMP threads sleep soon after a parallel region (before torch is imported)."""
    environ = os.environ if environ is None else environ
    for name, value in SHORT_SPIN.items():
        environ.setdefault(name, value)
