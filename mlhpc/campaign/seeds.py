"""A campaign's seeds, written once: the rule "result index i runs first seed + i", the one way a
first seed is drawn, the bounds every seed keeps, and how a campaign's first seed follows from
--first-seed, what the campaign file records and what the finished runs ran. The planner (campaign/plan.py) alone calls these; scripts and
Slurm jobs receive the seeds it gives and do no arithmetic. Pure and torch-free."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

from mlhpc.common.errors import ConfigError, SubmissionError

MAX_SEED = 2**32 - 1
"""The largest seed a run takes: NumPy's legacy seed is 32 bits, and torch's generators overflow
at 2**64 (a sampler adds the epoch to the seed)."""
MAX_RUNS = 10_000
"""The most results one campaign entry holds (--seeds, --instances, --index + 1): a bound far
above any rule's (10 seeds), so that `--index 1000000000` is refused instead of planned."""


def seed_of(first_seed: int, index: int) -> int:
    """The seed of result_<index>.txt in a campaign from `first_seed`: the one place the rule
    "index i runs first_seed + i" is written (scripts and jobs receive the seeds it gives)."""
    return first_seed + index


def first_seed_of(seed: int, index: int) -> int:
    """The first seed of the campaign in which result_<index>.txt runs `seed` (seed_of's inverse)."""
    return seed - index


def draw_first_seed() -> int:
    """A random first seed, the one place one is drawn: up to 2**24, leaving every later seed
    (first + index, index below MAX_RUNS) far under MAX_SEED."""
    return secrets.randbelow(1 << 24) + 1


def check_numbers(*, num_runs: int, first_seed: int | None, index: int | None, flag: str = "--seeds") -> None:
    """A ConfigError (one line, the flag, its value and the fix) unless every run of a campaign
    of `num_runs` runs (and `index`) from `first_seed` has a seed torch and NumPy accept. Called
    where the options are checked (options.check_options) and again by the planner, before
    anything is recorded."""
    if not 1 <= num_runs <= MAX_RUNS:
        raise ConfigError(f"{flag} {num_runs} must be from 1 to {MAX_RUNS}; pass a count in that range")
    if index is not None and not 0 <= index < MAX_RUNS:
        raise ConfigError(
            f"--index {index} must be from 0 to {MAX_RUNS - 1}; pass the run's index in its campaign"
        )
    last = max(num_runs, (index or 0) + 1) - 1
    if first_seed is not None and not 1 <= first_seed <= MAX_SEED - last:
        raise ConfigError(
            f"--first-seed {first_seed} must be from 1 to {MAX_SEED - last} (every seed, first seed + index, "
            f"is at most {MAX_SEED}); pass a --first-seed in that range, or none for a random one"
        )


def campaign_first_seed(
    wanted: int | None,
    recorded: int | None,
    finished: Mapping[int, int],
    count: int,
    where: Path,
    folder: Path,
) -> int | None:
    """The campaign's first seed: its finished runs' (checked against --first-seed, `wanted`, and
    the campaign file's `recorded` one), else the recorded one (the first run into --out fixed
    it: a different --first-seed is refused, none follows it), else --first-seed; None: draw one.
    `where` is the campaign file, `folder` the entry's results."""
    first = _finished_first_seed(finished, count, wanted, folder)
    if recorded is not None and finished and first != recorded:
        index = min(finished)
        raise SubmissionError(
            f"{where} records first seed {recorded}, but {folder / f'result_{index}.txt'} ran seed "
            f"{finished[index]} (first seed {first}); the results are what ran: move the results "
            "or campaign.json away, or pass a new --out"
        )
    if recorded is not None and not finished:
        if wanted is not None and wanted != recorded:
            raise ConfigError(
                f"--first-seed {wanted} differs from the first seed {recorded} {where} records for this "
                f"campaign (the first run into --out fixed it); drop --first-seed to follow it, pass "
                f"--first-seed {recorded}, or a new --out"
            )
        first = recorded
    if first is not None and not 1 <= first <= MAX_SEED - (count - 1):
        raise SubmissionError(
            f"the results in {folder} fix this campaign's first seed at {first}, so its seeds leave "
            f"1..{MAX_SEED}; move those results away, or pass a new --out"
        )
    return first


def _finished_first_seed(
    finished: Mapping[int, int], count: int, wanted: int | None, folder: Path
) -> int | None:
    """The first seed the finished runs fix (index i ran first + i), or --first-seed (`wanted`)
    when none finished; a ConfigError when they disagree."""
    if not finished:
        return wanted
    index, seed = min(finished.items())
    first = first_seed_of(seed, index)
    if wanted is not None and wanted != first:
        raise ConfigError(
            f"{folder / f'result_{index}.txt'} ran seed {seed}, so this campaign's first seed is "
            f"{first}, not --first-seed {wanted}; drop --first-seed to resume"
        )
    clash = [i for i, s in finished.items() if i >= count or s != seed_of(first, i)]
    if clash:
        raise ConfigError(
            f"{folder / f'result_{clash[0]}.txt'} does not belong to a campaign of {count} seeds from "
            f"{first}; pass the campaign's --seeds, or a new --out"
        )
    return first
