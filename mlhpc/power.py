"""`mlhpc run --power`: a node's power sampled while a run is timed, written as the MLPerf power logs.

Sources are energy counters read twice: NVML's total energy per GPU (`nvidia-ml-py`, the `power`
extra) and RAPL's per CPU package (`<powercap>/intel-rapl:<n>/energy_uj`, where readable). Each
`power_reading` is their summed energy since the reading before over the time between, in watts:
the components measured, not the wall socket. No source: one line saying so, never a number.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mlhpc.common.cluster.launch import host_label
from mlhpc.common.errors import ConfigError
from mlhpc.common.safeio import safe_read
from mlhpc.common.safeio.fileio import current_umask

POWERCAP_ROOT = Path("/sys/class/powercap")
POWERCAP_ENV = "MLHPC_POWERCAP_ROOT"
"""Where powercap is mounted when not at /sys/class/powercap (a container's bind mount)."""
SAMPLE_INTERVAL_S = 0.5
"""Twice a second: the training power rules want a reading per node at least every second."""
_PACKAGE = re.compile(r"intel-rapl:\d+")  # packages; intel-rapl:0:1 and the like are parts of one
_COUNTER_BYTES = 64
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnergyCounter:
    """A cumulative energy counter in microjoules that wraps to 0 after `wrap_uj` (None: never)."""

    name: str
    read_uj: Callable[[], int]
    wrap_uj: int | None = None


def _read_int(path: Path) -> int:
    return int(safe_read.read_bytes(path, _COUNTER_BYTES, what="a powercap counter").decode().strip())


def rapl_counters(root: Path = POWERCAP_ROOT) -> list[EnergyCounter]:
    """One counter per CPU package whose energy_uj this process can read (often root only)."""
    counters = []
    for zone in sorted(root.glob("intel-rapl:*")):
        if not _PACKAGE.fullmatch(zone.name):
            continue
        energy = zone / "energy_uj"
        try:
            _read_int(energy)
        except (OSError, ValueError):
            continue  # unreadable (permissions) or not a number: not a source
        try:
            wrap: int | None = _read_int(zone / "max_energy_range_uj")
        except (OSError, ValueError):
            wrap = None
        counters.append(EnergyCounter(f"rapl:{zone.name}", lambda path=energy: _read_int(path), wrap))
    return counters


def nvml_counters() -> list[EnergyCounter]:
    """One counter per GPU that reports its total energy (Volta and newer), via NVML if installed."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        return []  # no driver, no GPU
    counters = []
    for index, handle in enumerate(handles):
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError:
            continue  # an older GPU without the counter

        def read(handle: Any = handle) -> int:
            return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)) * 1000  # mJ -> µJ

        counters.append(EnergyCounter(f"nvml:gpu{index}", read))
    return counters


def node_counters(powercap_root: Path = POWERCAP_ROOT) -> list[EnergyCounter]:
    """Every source on this node; a ConfigError saying there is none."""
    counters = nvml_counters() + rapl_counters(powercap_root)
    if not counters:
        raise ConfigError(
            f"no power source on this node {host_label()}: no GPU energy through NVML (pip install "
            f"'mlhpc[power]') and no readable {powercap_root}/intel-rapl:*/energy_uj; leave out --power"
        )
    return counters


def _record(key: str, event: str, time_ms: float, value: Any, metadata: dict[str, Any]) -> str:
    record = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": event,
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return f":::MLLOG {json.dumps(record, allow_nan=False)}\n"  # a NaN is no MLLOG value


class PowerSampler:
    """Samples `counters` every `interval_s` on a thread into `path` (written under a temporary name,
    renamed when the block ends without an error, removed when it ends with one)."""

    def __init__(
        self,
        counters: Sequence[EnergyCounter],
        path: Path,
        *,
        host: str | None = None,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.counters, self.path, self.interval_s, self.clock = list(counters), Path(path), interval_s, clock
        self.host = host or host_label()
        self.metadata = {"host": self.host, "sources": [c.name for c in self.counters]}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mlhpc-power", daemon=True)
        self._last: list[int] = []
        self._last_s = 0.0
        self._handle: TextIO | None = None
        self._tmp: Path | None = None
        self.error: BaseException | None = None
        self.readings = 0

    def __enter__(self) -> PowerSampler:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.fchmod(fd, 0o666 & ~current_umask())  # as any file the user makes, not mkstemp's 0600
        self._tmp, self._handle = Path(name), os.fdopen(fd, "w")
        self._last, self._last_s = self._read(), self.clock()
        self._write("power_measurement_start", "INTERVAL_START", self._last_s, None)
        self._thread.start()
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        self._stop.set()
        self._thread.join()
        assert self._handle is not None and self._tmp is not None
        try:
            if error is None and self.error is None:
                self.sample()
                self._write("power_measurement_stop", "INTERVAL_END", self.clock(), None)
                self._handle.flush()
                os.fsync(self._handle.fileno())
        finally:
            self._handle.close()
        if error is None and self.error is None:
            os.replace(self._tmp, self.path)
            return
        self._tmp.unlink(missing_ok=True)  # ours: made by mkstemp above
        if self.error is not None:  # the run itself went well: keep it, say why energy is missing
            _log.warning(
                "power sampling stopped (%s); %s is not written, the run has no energy", self.error, self.path
            )

    def _read(self) -> list[int]:
        return [c.read_uj() for c in self.counters]

    def _write(self, key: str, event: str, time_s: float, value: Any) -> None:
        assert self._handle is not None
        self._handle.write(_record(key, event, round(time_s * 1000, 3), value, self.metadata))

    def sample(self) -> float | None:
        """One power_reading: the watts since the reading before; None, and nothing written, when
        the clock did not move forward (a step back by NTP: no interval to divide by, and a 0 W
        reading stamped before the last one would be a number no meter gave)."""
        now_uj, now_s = self._read(), self.clock()
        if now_s <= self._last_s:
            self._last, self._last_s = now_uj, now_s
            return None
        joules = 0.0
        for counter, before, after in zip(self.counters, self._last, now_uj, strict=True):
            delta = after - before
            if delta < 0 and counter.wrap_uj:
                delta += counter.wrap_uj + 1
            joules += max(delta, 0) / 1e6
        watts = joules / (now_s - self._last_s)
        if not math.isfinite(watts) or watts <= 0:
            # counters that stood still measured nothing (no node draws 0 W; the checker refuses
            # such a reading): no reading; the next one covers this interval too
            return None
        self._last, self._last_s = now_uj, now_s
        self._write("power_reading", "POINT_IN_TIME", now_s, watts)
        self.readings += 1
        return watts

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.sample()
        except (OSError, ValueError) as e:  # a counter went away: the log would lie from here on
            self.error = e


def power_log_path(entry_dir: Path, index: int, host: str | None = None) -> Path:
    """<entry>/power/result_<index>/node_<host>.txt, where the official summarizer looks."""
    return Path(entry_dir) / "power" / f"result_{index}" / f"node_{host or host_label()}.txt"


def node_power(enabled: bool, local_rank: int) -> list[EnergyCounter] | None:
    """The counters a node's first rank samples with --power (ConfigError when the node has none);
    None without --power and on the node's other ranks. $MLHPC_POWERCAP_ROOT moves powercap."""
    if not enabled or local_rank != 0:
        return None
    return node_counters(Path(os.environ.get(POWERCAP_ENV) or POWERCAP_ROOT))
