"""Where the loaders read the dataset from, by where staging goes (`--staging`): before run_start,
inside the run before training, or overlapping training (a thread stages while the loaders read
the source's files through the copy it makes; `mlhpc.staging.overlap`).

The overlap keeps the rules' staging interval: staging_start right after run_start, staging_stop
when the copy is complete and verified (during some epoch, logged from the staging thread at
that moment), and run_stop only after it: training that reaches its target first waits for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import DistributedSampler

from mlhpc.common.cluster.distributed import DistContext
from mlhpc.common.contract.registry import DataBundle
from mlhpc.common.errors import ConfigError, StagingError
from mlhpc.common.training import run_events
from mlhpc.common.training.mllogger import MLLog, constants
from mlhpc.common.training.progress import Progress, staging_line
from mlhpc.common.training.timing import PhaseTimer


@dataclass(frozen=True, kw_only=True)
class StagedData:
    """Where staging put the dataset, and what it reports into staging_stop's metadata."""

    path: Path
    metadata: dict[str, Any] = field(default_factory=dict)


class BackgroundStaging(Protocol):
    """A staging under way while training runs (`--staging overlap`)."""

    read_path: Path
    """What the loaders list and open: the source, each file read from its node-local copy."""

    def reading(self) -> contextlib.AbstractContextManager[None]:
        """The loaders read through the copy being made inside this block."""
        ...

    def read_order(self, paths: list[list[str]] | None) -> None:
        """The files each node reads first, in order (`first_reads`), for the copies to follow;
        the staging waits for it (None: no order known)."""
        ...

    @property
    def failed(self) -> bool: ...

    def finish(self) -> StagedData:
        """Wait for the staging to end: what it staged, or its error raised."""
        ...

    def stop(self) -> None:
        """Stop it (training ended early or failed): its copies stop at their next slice."""
        ...

    @property
    def running(self) -> bool: ...

    def seconds(self) -> float: ...

    def demand_copies(self) -> int:
        """Files of this node the loaders copied themselves, before staging reached them."""
        ...


StartStaging = Callable[[Callable[[StagedData], None]], BackgroundStaging]
"""Starts a background staging; the callable it is given runs in the staging thread once the
copy is complete (it logs staging_stop then)."""


@dataclass
class Staging:
    """The dataset for one run, as `data_path` and `check` and `finish` see it in the loop."""

    data_path: Path
    background: BackgroundStaging | None = None
    overlap: dict[str, float | int] = field(default_factory=dict)
    """The overlapped staging's figures for the time breakdown (empty when synchronous)."""

    _checked: bool = False

    def refuse_own_readers(self, loader: str) -> None:
        """DALI reads the files itself, not through the copy being made: refused with overlap."""
        if self.background is not None and loader != "torch":
            raise ConfigError(
                f"--staging overlap reads the dataset through mlhpc's loaders, and data.loader={loader} "
                "reads the files itself; set data.loader=torch or use --staging inside"
            )

    def loaders_built(self, loaders: DataBundle, ctx: DistContext) -> None:
        """Tell the staging what each node's training reads first, as soon as the loaders say."""
        if self.background is None:
            return
        order = None
        try:
            self.refuse_own_readers(loaders.loader)
            order = first_reads(loaders, ctx)
        finally:
            self.background.read_order(order)  # also on an error: the staging waits for it

    def check(self, ctx: DistContext) -> None:
        """At an epoch's end, where the ranks sync anyway: a staging that failed on any rank
        stops every rank's run here, with its message (one small all-reduce an epoch, until
        every rank's staging has ended)."""
        if self.background is None or self._checked:
            return
        state = torch.tensor([float(self.background.failed), float(self.background.running)])
        failed, running = ctx.all_reduce_max(state).tolist()
        if failed:
            self.background.finish()  # raises this rank's error (every rank's, once agreed)
            raise StagingError("staging failed on another rank; its message is in that rank's output")
        self._checked = not running


@contextlib.contextmanager
def staged_data(
    where: str,
    stage: Callable[[], StagedData],
    start: StartStaging | None,
    staged_before: StagedData | None,
    *,
    log: MLLog,
    timer: PhaseTimer,
    progress: Progress,
    ctx: DistContext,
) -> Iterator[Staging]:
    """Inside run_start..run_stop: the dataset staged (inside), staged already (before), or
    being staged while the block trains (overlap: the block ends once the staging did)."""
    if where != "overlap" or start is None:
        staged = staged_before or stage_now(stage, log, timer, progress)
        yield Staging(staged.path)
        return
    stop_logged = _StopOnce(log)
    log.start(constants.STAGING_START)
    background = start(lambda staged: stop_logged(staged.metadata))
    try:
        with background.reading():
            staging = Staging(background.read_path, background)
            yield staging
            waited = time.perf_counter()
            with progress.say_if_slow("waiting for staging to finish"), timer.phase("staging"):
                staged = background.finish()
            waited = time.perf_counter() - waited
        progress.say(staging_line(staged.metadata))
        staging.overlap = _overlap_figures(background, waited, ctx)
    except BaseException:
        background.stop()
        stop_logged({"status": "aborted"})
        raise


def stage_now(
    stage: Callable[[], StagedData], log: MLLog, timer: PhaseTimer, progress: Progress
) -> StagedData:
    """staging_start .. staging_stop around the caller's `stage`, its metadata on staging_stop."""
    with run_events.staging(log) as stop_metadata, timer.phase("staging"):
        staged = stage()
        stop_metadata.update(staged.metadata)
    progress.say(staging_line(staged.metadata))
    return staged


class _StopOnce:
    """staging_stop, logged once: by the staging thread when the copy is complete, or by the
    training thread when the run ends without it."""

    def __init__(self, log: MLLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._logged = False

    def __call__(self, metadata: dict[str, Any]) -> None:
        with self._lock:
            if not self._logged:
                self._logged = True
                self._log.end(constants.STAGING_STOP, metadata={**metadata, "synchronous_staging": False})


class SampleFiles(Protocol):
    """A dataset that says which files each sample is read from (the benchmarks' file datasets)."""

    def __len__(self) -> int: ...

    def sample_files(self, index: int) -> tuple[Path, ...]: ...


def first_reads(loaders: DataBundle, ctx: DistContext) -> list[list[str]] | None:
    """Per node, the files its ranks read in the first epoch and then in the first evaluation,
    in the order they read them (its ranks taking turns); None when the loaders do not say.

    Worked out as torch's DistributedSampler deals the shuffled indices (the permutation of
    seed + epoch 1, cut to whole global batches, index j to rank j mod world) and as the bundle
    shards validation (rank r: indices r, r + world, ...). A wrong guess costs speed only:
    every file is staged and verified whatever the order."""
    train, validation = loaders.train, loaders.validation
    dataset, sampler = getattr(train, "dataset", None), getattr(train, "sampler", None)
    if not isinstance(sampler, DistributedSampler) or not hasattr(dataset, "sample_files"):
        return None
    world = ctx.world_size
    node_of = {rank: n for n, ranks in enumerate(ctx.node_layout.nodes) for rank in ranks}
    whole = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=sampler.shuffle, seed=sampler.seed)
    whole.set_epoch(1)
    order = list(whole)
    order = order[: len(order) // world * world] if sampler.drop_last else order
    nodes: list[list[str]] = [[] for _ in ctx.node_layout.nodes]
    for j, index in enumerate(order):
        nodes[node_of[j % world]].extend(str(p) for p in dataset.sample_files(index))
    shard = getattr(validation, "dataset", None)
    base = getattr(shard, "dataset", None)
    if hasattr(base, "sample_files"):
        for index in range(len(base)):
            nodes[node_of[index % world]].extend(str(p) for p in base.sample_files(index))
    return [list(dict.fromkeys(paths)) for paths in nodes]


def _overlap_figures(
    background: BackgroundStaging, waited_s: float, ctx: DistContext
) -> dict[str, float | int]:
    """How the staging and the training overlapped: the staging's seconds, those it ran beside
    training, those training waited for it at the end, and the files read from the source for
    training (each node counted once, by its first rank). What the overlap cost training shows
    in its own phases (data_wait: the reads for training; the compute, sharing the CPUs)."""
    mine = background.demand_copies() if ctx.local_rank == 0 else 0
    demand = int(ctx.all_reduce_sum(torch.tensor([float(mine)])).item())
    staging_s = background.seconds()
    return {
        "staging_s": staging_s,
        "overlapped_s": max(0.0, staging_s - waited_s),
        "waited_s": waited_s,
        "files_read_for_training": demand,
    }
