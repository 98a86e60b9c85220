"""What a failed mlhpc command must look like: one stderr line, exit 2, no traceback."""

from __future__ import annotations

import subprocess


def one_error_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line of a failed command, checked: exit 2, `mlhpc: error:`, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
