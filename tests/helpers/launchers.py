"""Launching a command over two local ranks under torchrun, as the distributed tests do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import cli_env


def torchrun(
    args: list[str], cwd: Path, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=cli_env(**env)
    )
