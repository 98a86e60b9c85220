"""Small trust items: the job's store listens only on the interface the ranks use (never every
interface), and argparse's usage errors show the user's words as data."""

from __future__ import annotations

import contextlib
import datetime
import io
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.common.cluster.liveness import bind_address, host_store
from mlhpc.common.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for row in handle.read().splitlines()[1:]:
                fields = row.split()
                address, hex_port = fields[1].rsplit(":", 1)
                if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    found.append(address)
    return found


def test_the_store_listens_on_loopback_only_for_a_loopback_job() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = host_store("127.0.0.1", port, 1, datetime.timedelta(seconds=10), local_world_size=1)
    store.set("k", "v")
    assert _listening(port) == ["0100007F"]  # 127.0.0.1, not 00000000 (every interface)
    # the control: a socket torch binds itself listens on every interface
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        other = probe.getsockname()[1]
    theirs = dist.TCPStore("127.0.0.1", other, 1, True, timeout=datetime.timedelta(seconds=10))
    assert set(_listening(other)) & {"00000000", "00000000000000000000000000000000"}
    del store, theirs


def test_a_name_resolving_only_to_loopback_is_refused_for_a_multi_node_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))]
    )
    with pytest.raises(ConfigError, match=r"MASTER_ADDR=node01 resolves here only to 127\.0\.1\.1"):
        bind_address("node01", world_size=8, local_world_size=4)
    assert bind_address("node01", world_size=4, local_world_size=4) == "127.0.1.1"  # one node
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda *a, **k: [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 0)),
        ],
    )
    assert bind_address("node01", world_size=8, local_world_size=4) == "10.1.2.3"  # the outward one


@settings(max_examples=100, deadline=None)
@given(addr=st.text(max_size=40))
def test_any_master_addr_is_an_address_or_one_line(addr: str) -> None:
    try:
        where = bind_address(addr, world_size=2, local_world_size=1)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).startswith("MASTER_ADDR=")
        return
    assert where and socket.inet_pton(
        socket.AF_INET6 if ":" in where else socket.AF_INET, where.split("%")[0]
    )


WORDS = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20)


@settings(max_examples=50, deadline=None)
@given(word=WORDS)
def test_an_unrecognized_argument_is_shown_as_data(word: str) -> None:
    from mlhpc.cli import build_parser

    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(err):
        build_parser().parse_args(["check", "x", "--nope", word])
    assert exit_.value.code == 2
    line = err.getvalue()
    assert line.count("\n") == 1 and line.startswith("mlhpc: error: ")
    bad = [c for c in line[:-1] if ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or 0x202A <= ord(c) <= 0x202E]
    assert not bad, line


def test_an_escape_code_in_an_argument_reaches_the_terminal_as_text() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mlhpc", "check", "x", "\x1b]0;owned\x07", "--\x1b[2J"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    assert "\x1b" not in done.stderr and "\\x1b]0;owned\\x07" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
