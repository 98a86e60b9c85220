"""The cluster's network: its subnet and ports, the veth links through the switch host, and
shaping a link with tc (the one parser of tc's rate syntax)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from typing import Any

from .base import DELAY_RE, SUBNET_BASE, VclusterError, in_ns, run
from .state import read_state, root


def pick_index() -> int:
    """A subnet (10.213.K.0/24) and port block K that no other cluster here and no host route uses."""
    taken = set()
    for other in root().iterdir():
        with contextlib.suppress(OSError, VclusterError):
            taken.add(read_state(other).get("index"))
    host_nets = []
    for cmd in (["ip", "-4", "-j", "addr"], ["ip", "-4", "-j", "route"]):
        for entry in json.loads(run(cmd) or "[]"):
            for addr in entry.get("addr_info", []):
                host_nets.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
            if entry.get("dst", "default") != "default":
                host_nets.append(
                    ipaddress.ip_network(
                        entry["dst"] if "/" in entry["dst"] else entry["dst"] + "/32", strict=False
                    )
                )
    for k in range(200):
        net = ipaddress.ip_network(f"10.213.{k}.0/24")
        if k not in taken and not any(net.overlaps(h) for h in host_nets):
            return k
    raise VclusterError(f"no free subnet in {SUBNET_BASE} (200 clusters up?); see scripts/vcluster status")


RATE_RE = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([kmgt]?)(bit|bps)")


def rate_bytes_s(rate: str) -> float:
    """tc's rate syntax (100mbit, 1gbit, 12mbps: bytes) in bytes per second."""
    match = RATE_RE.fullmatch(rate.lower())
    if match is None:
        raise VclusterError(f"--rate {rate}: give it as tc does, e.g. 100mbit, 1gbit or 12mbps")
    value = float(match.group(1)) * 1000 ** " kmgt".index(match.group(2) or " ")
    return value / 8 if match.group(3) == "bit" else value


def check_delay(delay: str | None) -> None:
    if delay is not None and not DELAY_RE.fullmatch(delay):
        raise VclusterError(f"--delay {delay}: give it as tc does, e.g. 5ms, 500us or 0.1s")


def shape_argv(dev: str, rate: str | None, delay: str | None) -> list[str]:
    """netem when there is a delay to add (it can rate-limit too), else a token bucket (tbf),
    which every kernel with traffic control has; its burst: 4 ms at the rate, at least 16 kB."""
    if delay:
        return ["tc", "qdisc", "replace", "dev", dev, "root", "netem", "limit", "10000", "delay", delay] + (
            ["rate", rate] if rate else []
        )
    assert rate is not None
    burst = max(16000, int(rate_bytes_s(rate) * 0.004))
    return [
        "tc",
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        str(burst),
        "latency",
        "50ms",
    ]


def apply_shape(state: dict[str, Any], node: dict[str, Any], rate: str | None, delay: str | None) -> None:
    """Shape both directions of a node's link: its eth0 (out) and its switch port (in)."""
    sw = state["pids"]["switch"]
    if rate or delay:
        for pid, dev in ((node["pid"], "eth0"), (sw, node["name"])):
            try:
                in_ns(pid, shape_argv(dev, rate, delay), what="tc")
            except VclusterError as e:
                if delay and "unknown" in str(e):
                    raise VclusterError(
                        "--delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks; "
                        "shape the bandwidth only (--rate)"
                    ) from e
                raise
    else:
        for pid, dev in ((node["pid"], "eth0"), (sw, node["name"])):
            with contextlib.suppress(VclusterError):  # nothing to clear
                in_ns(pid, ["tc", "qdisc", "del", "dev", dev, "root"])
    node["shape"] = {"rate": rate, "delay": delay} if rate or delay else None


def connect_hosts(state: dict[str, Any], rate: str | None, delay: str | None) -> None:
    """Every host's eth0, a veth into the switch's bridge, addressed; each node's link shaped."""
    # links: each veth is made inside the switch namespace and its other end moved straight into
    # the host's namespace, so the machine's own network namespace never holds either end
    batch = []
    for name, pid in [("login", state["login"]["pid"]), *((n["name"], n["pid"]) for n in state["nodes"])]:
        batch += [
            f"link add {name} type veth peer name eth0 netns {pid}",
            f"link set {name} master br0",
            f"link set {name} up",
        ]
    in_ns(state["pids"]["switch"], ["ip", "-batch", "-"], input="\n".join(batch) + "\n", what="ip (switch)")
    prefix = ipaddress.ip_network(state["subnet"]).prefixlen
    for host in [state["login"], *state["nodes"]]:
        in_ns(
            host["pid"],
            ["ip", "-batch", "-"],
            input=f"addr add {host['address']}/{prefix} dev eth0\nlink set eth0 up\n",
        )
    if rate or delay:
        for node in state["nodes"]:
            apply_shape(state, node, rate, delay)
