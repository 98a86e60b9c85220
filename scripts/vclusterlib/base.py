"""The words of vcluster every module uses: its error, names shown as data, the patterns
every outside value is matched against (fullmatch), and running a command on a host."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

# every pattern is used with fullmatch: `$` also matches before a trailing newline
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,23}")
ROOT_RE = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9._-]{0,63}){1,16}")  # lands in shell lines and slurm.conf
SIZE_RE = re.compile(r"([0-9]{1,15})([KkMmGg]?)")  # [0-9]: `\d` also takes other scripts' digits
DELAY_RE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?(us|ms|s)")
STATE_MAX_BYTES = 1 << 20
SUBNET_BASE = ipaddress.ip_network("10.213.0.0/16")
LOGIN_HOST = 254
TOOLS = {  # command -> the Debian package that has it
    "slurmd": "slurmd (or slurm-wlm)",
    "slurmctld": "slurmctld (or slurm-wlm)",
    "sinfo": "slurm-client (or slurm-wlm)",
    "munged": "munge",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ip": "iproute2",
    "tc": "iproute2",
}


class VclusterError(Exception):
    """A failure the user can act on: printed as one line, exit status 1."""


def shown(text: object) -> str:
    """`text` with control and format characters written as escapes, so a name from outside prints
    as data (common/printable.py's rule; root runs this tool without mlhpc installed)."""
    return "".join(
        char
        if unicodedata.category(char) not in ("Cc", "Cf", "Zl", "Zp")
        else f"\\x{ord(char):02x}"
        if ord(char) < 0x100
        else f"\\u{ord(char):04x}"
        for char in str(text)
    )


def run(argv: list[str], *, input: str | None = None, what: str = "") -> str:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise VclusterError(
            f"{what or argv[0]} failed: {' '.join(argv)}: {detail[-1] if detail else proc.returncode}"
        )
    return proc.stdout


def in_ns(pid: int, argv: list[str], **kw: Any) -> str:
    """Run a command inside the namespaces of a cluster host (never in the host's own)."""
    return run(["nsenter", "-t", str(pid), "-u", "-m", "-n", "--", *argv], **kw)


def checkpoint(phase: str) -> None:
    """Fault injection for the tests: VCLUSTER_FAIL_AT=phase fails `up` there, VCLUSTER_HANG_AT
    makes it wait there (to be killed)."""
    if os.environ.get("VCLUSTER_FAIL_AT") == phase:
        raise VclusterError(f"injected failure at {phase} (VCLUSTER_FAIL_AT)")
    if os.environ.get("VCLUSTER_HANG_AT") == phase:
        print(f"vcluster: hanging at {phase} (VCLUSTER_HANG_AT)", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(check: Any, what: str, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            tail = f"; {log}: {log_tail(log)}" if log else ""
            raise VclusterError(f"{what} not ready after {timeout_s:.0f} s{tail}")
        time.sleep(0.05)


# --- up ---------------------------------------------------------------------------------------
