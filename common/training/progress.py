"""What a person watching `mlhpc run` sees: the plan, one line per epoch, one line per seed.

MLLOG events are for the result files (and for stdout with `--mllog-stdout`, as the reference
trainers print them); this is the channel for people, written by global rank 0 only. At a terminal
the lines are coloured through rich; into a batch job's output file they are plain text, one
line per event, with no bars and no escape codes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from mlhpc.common.contract.catalog import Target


HEARTBEAT_S = 10.0
"""How long an epoch runs before its first `still training` line, and between two of them."""


def clock(seconds: float) -> str:
    """1:02:03 or 4:05 (minutes:seconds under an hour)."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def epoch_line(
    *,
    epoch: int,
    max_epochs: int,
    target: Target,
    threshold: float,
    value: float,
    samples_per_s: float,
    elapsed_s: float,
) -> str:
    """`epoch  3/30  eval_accuracy 0.7731 (target >= 0.82)   412.5 samples/s  1:02` for one epoch."""
    sign = "<=" if target.direction == "min" else ">="
    mark = "  reached" if target.reached(value, threshold) else ""
    width = len(str(max_epochs))
    return (
        f"epoch {epoch:>{width}}/{max_epochs}  {target.metric} {value:.4f} (target {sign} {threshold:g})"
        f"  {samples_per_s:9.1f} samples/s  {clock(elapsed_s)}{mark}"
    )


def staging_line(metadata: dict[str, object]) -> str:
    """`staged 1,032 files (268.4 MB) in 2.1 s` from a run's staging_stop metadata."""
    files, size, seconds = (metadata.get(k) for k in ("staged_files", "staged_bytes", "staging_duration"))
    size_text = f" ({size / 1e6:,.1f} MB)" if isinstance(size, int | float) else ""
    time_text = f" in {seconds:.1f} s" if isinstance(seconds, int | float) else ""
    count = f"{files:,}" if isinstance(files, int) else "?"
    return f"staged {count} files{size_text}{time_text}"


def seed_line(*, seed: int, status: str, epochs: int, run_seconds: float, detail: str | None = None) -> str:
    """The closing line of one seeded run."""
    why = f": {detail}" if detail else ""
    return f"seed {seed}: {status} after {epochs} epoch(s) in {run_seconds / 60:.2f} min{why}"


@dataclass
class CampaignClock:
    """Where a campaign of `total` seeded runs stands, and the time left from the runs so far."""

    total: int
    seconds: list[float] = field(default_factory=list)
    """Wall time of each run finished in this process (staging, training, writing: all of it)."""

    def finished(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def left_s(self) -> float | None:
        """Seconds the runs not yet finished should take at the mean so far; None before the first."""
        if not self.seconds:
            return None
        return (self.total - len(self.seconds)) * sum(self.seconds) / len(self.seconds)

    def line(self, position: int) -> str:
        """`seed 3 of 10, about 4:48 left (0:36 a seed so far)` as the `position`-th run starts."""
        left = self.left_s()
        if left is None:
            return f"seed {position} of {self.total}"
        mean = sum(self.seconds) / len(self.seconds)
        return f"seed {position} of {self.total}, about {clock(left)} left ({clock(mean)} a seed so far)"


@dataclass(eq=False)  # compared by identity: SILENT serves as a dataclass field's default
class Progress:
    """Prints lines for people on the main rank; silent elsewhere (enabled=False)."""

    enabled: bool
    stream: TextIO = field(default_factory=lambda: sys.stdout)

    def __post_init__(self) -> None:
        self._console = None
        if self.enabled:
            from rich.console import Console

            # soft_wrap: a long line stays one line in a job's output file (rich would cut at 80).
            self._console = Console(file=self.stream, highlight=False, soft_wrap=True)

    @property
    def at_terminal(self) -> bool:
        return self._console is not None and self._console.is_terminal

    def say(self, text: str, style: str | None = None) -> None:
        if self._console is not None:
            self._console.print(text, style=style if self.at_terminal else None, markup=False)

    def epoch(
        self, epoch: int, max_epochs: int, target: Target, threshold: float, value: float,
        samples_per_s: float, elapsed_s: float,
    ) -> None:  # fmt: skip
        """One epoch's line (see `epoch_line`); green when the target is reached."""
        if self._console is not None:
            line = epoch_line(
                epoch=epoch, max_epochs=max_epochs, target=target, threshold=threshold, value=value,
                samples_per_s=samples_per_s, elapsed_s=elapsed_s,
            )  # fmt: skip
            self.say(line, "green" if target.reached(value, threshold) else None)

    def say_if_slow(self, what: str) -> contextlib.AbstractContextManager[None]:
        """common/display/waiting.py's `say_if_slow` on this channel: `what` once the body has taken 2 s
        (a spinner at a terminal), on the main rank only."""
        if self._console is None:
            return contextlib.nullcontext()
        from mlhpc.common.display.waiting import say_if_slow

        return say_if_slow(what, stream=self.stream)

    @contextlib.contextmanager
    def heartbeat(self, what: str, every_s: float | None = None) -> Iterator[None]:
        """While the body runs, a line every `every_s` (`epoch  1/20  still training, 0:10 in`), so a
        long epoch is not a silent stretch; a thread that only waits and prints (the training
        loop never syncs with it); nothing when disabled or when the body ends sooner."""
        if self._console is None:
            yield
            return
        every = HEARTBEAT_S if every_s is None else every_s
        done = threading.Event()
        started = time.perf_counter()

        def beat() -> None:
            while not done.wait(every):
                self.say(f"{what}  still training, {clock(time.perf_counter() - started)} in")

        thread = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


SILENT = Progress(enabled=False)
"""For library callers and tests that want no lines."""
