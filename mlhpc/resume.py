"""What a resumed campaign keeps: the finished runs already in its results folder and the seeds
they fix. Torch-free, so `mlhpc run --slurm` can plan on a login node."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mlhpc.common.errors import ConfigError


def finished_runs(paths: Iterable[Path]) -> dict[int, int]:
    """{result index: seed} of the result_<i>.txt logs that reached run_stop with status success."""
    from mlhpc.submission_checker.logparse import parse_log

    finished: dict[int, int] = {}
    for path in paths:
        index = path.stem.rsplit("_", 1)[-1]
        log = parse_log(path)
        if not index.isdigit() or log.run_stop_status != "success" or not log.seeds:
            continue
        finished[int(index)] = int(log.seeds[0][0])
    return finished


def resumed_first_seed(
    finished: dict[int, int], count: int, first_seed: int | None, where: Path
) -> int | None:
    """The campaign's first seed as its finished runs fix it (index i ran first + i), or
    `first_seed` when nothing is finished; a ConfigError when they disagree."""
    if not finished:
        return first_seed
    index, seed = min(finished.items())
    first = seed - index
    if first_seed is not None and first_seed != first:
        raise ConfigError(
            f"{where / f'result_{index}.txt'} ran seed {seed}, so this campaign's first seed is "
            f"{first}, not --first-seed {first_seed}; drop --first-seed to resume"
        )
    clash = [i for i, s in finished.items() if i >= count or s != first + i]
    if clash:
        raise ConfigError(
            f"{where / f'result_{clash[0]}.txt'} does not belong to a campaign of {count} seeds from "
            f"{first}; pass the campaign's --seeds, or a new --out"
        )
    return first
