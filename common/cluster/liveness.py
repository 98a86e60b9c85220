"""Which ranks still answer: the name of the node a failed collective lost.

A collective's own error names no node: gloo names a peer's address when its socket closed and
nobody when the collective timed out (a node whose link went down). So every rank beats: a
thread adds 1 to the rank's counter in the job's TCP store (the rendezvous that rank 0 holds)
once a second, on its own connection, also while the rank waits inside a collective (torch
releases the GIL there). After a collective failed, a rank reads every counter twice, a few
beats apart: a rank whose counter stood still has died or cannot reach the store, and is named
by the host name it left in the store when it joined. A store that cannot be reached at all is
rank 0's node gone, or this node's own link.

One heartbeat per process (the job's default group), started by `common.cluster.distributed` when it
joins a group and stopped before the group is destroyed.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from mlhpc.common.errors import ConfigError
from mlhpc.common.printable import shown

T = TypeVar("T")

BEAT_S = 1.0
"""How often a rank adds to its counter."""
LISTEN_S = 3.5
"""How long a rank watches the counters after a failure: a rank that is alive beats 3 times."""
STORE_TIMEOUT_S = 5.0
"""How long one look at the store may take before the store counts as unreachable."""
HOST_WAIT_S = 10.0
"""How long the rank that holds the store waits, after its own look, for the others' looks."""


def _key(kind: str, rank: int) -> str:
    return f"mlhpc/liveness/{kind}/{rank}"


@dataclass(frozen=True)
class Silence:
    """What a look at the counters found."""

    silent: dict[int, str]
    """The ranks whose counters stood still (and that did not say they were alive), with their
    host names."""
    store_host: str | None = None
    """The store's host, when the store itself did not answer."""
    store_closed: bool = False
    """The store's connection was closed at once (its rank ended), rather than timing out."""

    def words(self) -> str:
        """The lost node(s) and what to do, for one line."""
        if self.store_host is not None and self.store_closed:
            return (
                f"the job's rendezvous on {self.store_host} (rank 0) closed: rank 0 died, was killed "
                f"or ended first; check {self.store_host}"
            )
        if self.store_host is not None:
            return (
                f"{self.store_host} (rank 0, which holds the job's rendezvous) cannot be reached: it "
                f"died or its link, or this node's, is down; check {self.store_host} and this node's link"
            )
        if not self.silent:
            return "every rank still answers: see the other ranks' lines for the cause"
        hosts = list(dict.fromkeys(self.silent.values()))
        ranks = ", ".join(str(r) for r in self.silent)
        return (
            f"{', '.join(hosts)} (rank{'s' if len(self.silent) > 1 else ''} {ranks}) stopped answering: "
            f"a process there died or was killed, or the node's link is down; check {', '.join(hosts)}"
        )


class Heartbeat:
    """This rank's beating thread and the look at everyone's counters. Both connections to the
    store are made when the rank joins: after a failure, a new connection to an unreachable
    store would retry for minutes, logging each try."""

    def __init__(self, store: Any, rank: int, *, hosts_store: bool, host: str | None = None) -> None:
        self.rank = rank
        self._hosts_store = hosts_store
        self._store_host = _store_host(store)
        self._stop = threading.Event()
        self._beats = _client(store)
        self._probe = _client(store)
        self._probe.set(_key("host", rank), host or socket.gethostname())
        self._beats.add(_key("beat", rank), 1)
        self._thread = threading.Thread(target=self._run, name="mlhpc-heartbeat", daemon=True)
        self._thread.start()
        # A daemon thread still inside a store call when the interpreter ends is made to exit
        # through torch's C++ frames, which aborts the process ("terminate called without an
        # active exception", after the run's work was done): the beating ends before that.
        atexit.register(self._end)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._beats.add(_key("beat", self.rank), 1)
            except Exception:  # the store is gone (rank 0 ended) or out of reach: stop quietly
                return

    def stop(self) -> None:
        """Stop beating, saying so first: a rank that ended is not a lost one."""
        _bounded(lambda: self._probe.set(_key("ended", self.rank), "1"), STORE_TIMEOUT_S)
        self._end()

    def _end(self) -> None:
        """Stop the beating thread and wait for it (its last call to the store is bounded)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=STORE_TIMEOUT_S)

    def silence(self, ranks: Sequence[int], listen_s: float = LISTEN_S) -> Silence:
        """Which of `ranks` (global ranks; this one left out) stopped beating, watched for
        `listen_s`. A rank that says it ended, or that is looking too, answered. The look runs
        in a thread of its own: a store on a node whose link went down does not answer, and
        TCPStore's add waits for its answer without a timeout."""
        started = time.monotonic()
        bound = listen_s + 2 * STORE_TIMEOUT_S + (HOST_WAIT_S if self._hosts_store else 0)
        outcome = _bounded(lambda: self._look(ranks, listen_s), bound)
        if outcome is not None:
            return outcome
        closed = time.monotonic() - started < STORE_TIMEOUT_S * 0.8
        return Silence({}, store_host=self._store_host, store_closed=closed)

    def _look(self, ranks: Sequence[int], listen_s: float) -> Silence:
        others = [r for r in ranks if r != self.rank]
        probe = self._probe
        started = time.monotonic()
        try:
            probe.set(_key("ended", self.rank), "1")  # alive and looking: whatever comes next
            before = [probe.add(_key("beat", r), 0) for r in others]
            time.sleep(listen_s)
            after = [probe.add(_key("beat", r), 0) for r in others]
            still = [r for r, b, a in zip(others, before, after, strict=True) if a == b]
            silent = {r: _host(probe, r) for r in still if not probe.check([_key("ended", r)])}
            probe.set(_key("looked", self.rank), "1")
        except Exception:  # the store does not answer: rank 0's node, or this node's link
            closed = time.monotonic() - started < STORE_TIMEOUT_S * 0.8
            return Silence({}, store_host=self._store_host, store_closed=closed)
        if self._hosts_store:  # the others look in this process's store: keep it up until they did
            waiting = [r for r in others if r not in silent]
            deadline = time.monotonic() + HOST_WAIT_S
            with contextlib.suppress(Exception):
                while waiting and time.monotonic() < deadline:
                    waiting = [r for r in waiting if not probe.check([_key("looked", r)])]
                    time.sleep(0.2)
        return Silence(silent)


def _bounded(call: Callable[[], T], seconds: float) -> T | None:
    """`call()` in a daemon thread, given up on after `seconds` (None then, or if it raised)."""
    outcome: list[T] = []

    def run() -> None:
        with contextlib.suppress(Exception):
            outcome.append(call())

    thread = threading.Thread(target=run, name="mlhpc-liveness", daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else None


def _client(store: Any) -> Any:
    """A connection of our own to the job's store, quick to give up."""
    client = store.clone()
    client.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
    return client


def _host(probe: Any, rank: int) -> str:
    if probe.check([_key("host", rank)]):
        return bytes(probe.get(_key("host", rank))).decode(errors="replace")
    return f"the node of rank {rank}"  # it never joined the heartbeat


def _store_host(store: Any) -> str:
    try:
        return str(store.host)
    except Exception:
        return "the rendezvous host"


def bind_address(addr: str, world_size: int, local_world_size: int | None) -> str:
    """The one address the job's store listens on: MASTER_ADDR as it resolves here, the interface
    the ranks connect to (a non-loopback one first), never every interface, so that a third
    process on another network cannot write a rank's name or beats. A name that resolves here
    only to loopback is refused when ranks may run on other nodes (they could not reach it)."""
    try:
        found = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as e:  # ValueError: a NUL in the name
        raise ConfigError(
            f"MASTER_ADDR={shown(addr)} does not resolve here ({e}); set it to rank 0's address"
        ) from None
    addresses = [str(info[4][0]) for info in found]
    if not addresses:
        raise ConfigError(f"MASTER_ADDR={shown(addr)} does not resolve here; set it to rank 0's address")
    outward = [a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if outward:
        return outward[0]
    if not _is_loopback_literal(addr) and (local_world_size is None or local_world_size < world_size):
        raise ConfigError(
            f"MASTER_ADDR={shown(addr)} resolves here only to {addresses[0]} (loopback), which ranks on "
            "other nodes cannot reach; set MASTER_ADDR to rank 0's address on the ranks' network"
        )
    return addresses[0]


def _is_loopback_literal(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def host_store(
    addr: str, port: int, world_size: int, timeout: datetime.timedelta, local_world_size: int | None = None
) -> Any:
    """Rank 0's TCP store for the job, listening on `bind_address` only (torch's own listens on
    every interface): the socket is bound here and handed to the store, which owns it after."""
    import torch.distributed as dist

    where = bind_address(addr, world_size, local_world_size)
    family = socket.AF_INET6 if ":" in where else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((where, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"the job's store cannot listen on {where}:{port} ({e.strerror or e}); pick another MASTER_PORT"
        ) from None
    fd = sock.detach()
    try:
        return dist.TCPStore(where, port, world_size, True, timeout=timeout, master_listen_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
