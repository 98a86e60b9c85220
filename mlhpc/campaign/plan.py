"""The campaign model: options plus what `--out` already holds -> a `CampaignPlan` (seeds, result
indices to run, data folder, system, result paths, the config's identity). The local runner, the
instance launcher and the Slurm submitter all execute this plan. Pure (what `--out` holds comes
in, read by campaign_io) and torch-free, so a login node plans a Slurm campaign.

The campaign file, `<out>/campaign.json`, is written at the first plan into `--out` and read by
every later run into it (a resume, a Slurm task, `mlhpc run --index`, a run in another container):

    {"mlhpc_campaign": 1,
     "hardware": "intel_xeon_platinum_8480_cpu_n2",
     "settings": {"submitter": "mlhpc", "system": "intel_xeon_platinum_8480_cpu_n2", "division": "closed",
                  "status": "onprem", "ruleset": "3.0.0"},
     "entries": {"cosmoflow/strong": {"config": "mini", "config_id": "3f2a...", "seeds": 10,
                                      "first_seed": 4711}}}

`hardware` is the stable hardware name (system_desc.stable_system_name) of the machines the
campaign trains on: a run on other machines is refused, whatever --system says.
`settings` are the submission-wide settings: a flag (`--submitter`, `--system`, `--division`,
`--status`, `--ruleset`) or a `--campaign FILE` of the same shape may give them; one that
disagrees with the recorded value is refused. `system` may be null until the first run on the
compute nodes fixes it (a Slurm campaign submitted without --system).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.common.errors import ConfigError, SubmissionError
from mlhpc.common.layout import Scaling, breakdown_file, result_file, results_dir
from mlhpc.common.vocabulary import DEFAULT_RULESET, DIVISIONS, RULESETS, STATUSES

CAMPAIGN_FILE = "campaign.json"
CAMPAIGN_FORMAT = 1
MAX_SEED = 2**32 - 1
"""The largest seed a run takes: NumPy's legacy seed is 32 bits, and torch's generators overflow
at 2**64 (a sampler adds the epoch to the seed)."""
MAX_RUNS = 10_000
"""The most results one campaign entry holds (--seeds, --instances, --index + 1): a bound far
above any rule's (10 seeds), so that `--index 1000000000` is refused instead of planned."""
DEFAULTS: dict[str, str] = {"submitter": "mlhpc", "status": "onprem", "ruleset": DEFAULT_RULESET}
CHOICES: dict[str, tuple[str, ...]] = {"division": DIVISIONS, "status": STATUSES, "ruleset": RULESETS}
SETTING_FLAGS: dict[str, str] = {
    "submitter": "--submitter",
    "system": "--system",
    "division": "--division",
    "status": "--status",
    "ruleset": "--ruleset",
}


def seed_of(first_seed: int, index: int) -> int:
    """The seed of result_<index>.txt in a campaign from `first_seed`: the one place the rule
    "index i runs first_seed + i" is written (scripts and jobs receive the seeds it gives)."""
    return first_seed + index


def first_seed_of(seed: int, index: int) -> int:
    """The first seed of the campaign in which result_<index>.txt ran `seed` (seed_of's inverse)."""
    return seed - index


def draw_first_seed() -> int:
    """A random first seed, the planner's one way to draw one: up to 2**24, leaving every later
    seed (first + index, index below MAX_RUNS) far under MAX_SEED."""
    return secrets.randbelow(1 << 24) + 1


# A submitter or system names a folder of the submission: one plain path component.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The submission-wide settings of one `--out`: one value each, whatever route runs."""

    submitter: str
    system: str | None
    """None only before the first run on the compute nodes names it (a Slurm campaign)."""
    division: str
    status: str
    ruleset: str


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One benchmark's campaign in `--out` as the campaign file records it."""

    config: str
    """--config as given (mini, full, or a YAML path)."""
    config_id: str
    """`config_identity` of the resolved config: what a resume must match."""
    seeds: int
    first_seed: int


@dataclass(frozen=True, kw_only=True)
class CampaignFile:
    settings: Settings
    entries: dict[str, Entry] = field(default_factory=dict)
    hardware: str | None = None
    """stable_system_name of the machines the campaign trains on (None until a run trained):
    every later run must be on the same, whatever --system names it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "mlhpc_campaign": CAMPAIGN_FORMAT,
            "hardware": self.hardware,
            "settings": asdict(self.settings),
            "entries": {key: asdict(entry) for key, entry in sorted(self.entries.items())},
        }


@dataclass(frozen=True, kw_only=True)
class CampaignRequest:
    """What a route was asked to do: the `mlhpc run` options a plan depends on."""

    benchmark: str
    config: str
    config_id: str
    out: Path
    scaling: Scaling = "strong"
    seeds: int = 1
    """Seeds of a strong campaign, or instances (models) of a weak one."""
    first_seed: int | None = None
    index: int | None = None
    """`mlhpc run --index I`: run result index I alone (a Slurm task, run_and_time.sh)."""
    resume: bool = False
    data: Path | None = None
    settings: Mapping[str, str | None] = field(default_factory=dict)
    """The settings the user gave (flags, --campaign FILE); None or absent: not given."""
    default_system: str | None = None
    """This machine's stable name (system_desc.stable_system_name); None on a login node."""
    default_division: str = "closed"
    """The benchmark's division for this config when nothing else names one."""


@dataclass(frozen=True, kw_only=True)
class ResultScan:
    """What an entry's results folder holds."""

    present: frozenset[int] = frozenset()
    """Indices with a result_<i>.txt."""
    finished: Mapping[int, int] = field(default_factory=dict)
    """{index: seed} of the results that reached run_stop with status success."""
    folder: Path | None = None
    other_systems: frozenset[str] = frozenset()
    """Systems other than the plan's with a results folder in the submission (none is allowed)."""


@dataclass(frozen=True, kw_only=True)
class CampaignPlan:
    """One campaign, the same on every route."""

    out: Path
    benchmark: str
    scaling: Scaling
    settings: Settings
    config_id: str
    seeds: tuple[int, ...]
    """The seed of result_<i>.txt for every i of the campaign."""
    to_run: tuple[int, ...]
    kept: tuple[int, ...]
    """Finished indices a resumed campaign keeps."""
    data: Path
    generated_data: bool
    """True when `data` is mlhpc's synthetic dataset folder (no --data given)."""
    record: CampaignFile
    """The campaign file as it stands after this plan."""

    @property
    def org_dir(self) -> Path:
        return self.out / self.settings.submitter

    @property
    def first_seed(self) -> int:
        """The seed of index 0, from which `seed_of` gives every other."""
        return self.seeds[0]

    @property
    def system(self) -> str:
        assert self.settings.system is not None, "the system is named by the first run on a compute node"
        return self.settings.system

    def result_path(self, index: int) -> Path:
        return result_file(self.org_dir, self.system, self.scaling, self.benchmark, index)

    def breakdown_path(self, index: int) -> Path:
        return breakdown_file(self.org_dir, self.system, self.scaling, self.benchmark, index)

    def run_lock_dir(self, index: int) -> Path:
        """The folder whose lock the run of `index` holds while it trains (outside the submission)."""
        s = self.settings
        return (
            self.out / ".mlhpc-runs" / f"{s.submitter}-{self.system}-{self.scaling}-{self.benchmark}-{index}"
        )

    @property
    def results_dir(self) -> Path:
        return results_dir(self.org_dir, self.system, self.scaling, self.benchmark)


def config_identity(benchmark: str, resolved: Mapping[str, Any]) -> str:
    """A short hash of the benchmark and its resolved config (`config.to_dict`): equal on a login
    node and a compute node for the same --config and overrides."""
    text = json.dumps({"benchmark": benchmark, "config": resolved}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dataset_dir(out: Path, benchmark: str, config: str) -> Path:
    """Where a campaign without --data generates its synthetic dataset (the only place this is
    worked out)."""
    return Path(out) / "datasets" / f"{benchmark}-{Path(config).stem}"


def entry_key(benchmark: str, scaling: Scaling) -> str:
    return f"{benchmark}/{scaling}"


def resolve_settings(
    given: Mapping[str, str | None],
    recorded: Settings | None,
    where: Path,
    *,
    default_system: str | None,
    default_division: str,
) -> Settings:
    """Each setting: the one given, else the recorded one, else the default. A given value that
    differs from the recorded one is a ConfigError naming the flag, both values and the fix."""
    if (
        given.get("division") is None
        and recorded is not None
        and recorded.division != default_division == "open"
    ):
        raise ConfigError(
            f"this config goes in the open division (its closed rules need the real dataset), but {where} "
            f"records division {recorded.division}; pass --division {recorded.division} to put it there, "
            "or a new --out"
        )
    values: dict[str, str | None] = {}
    for name, flag in SETTING_FLAGS.items():
        wanted = given.get(name)
        have = getattr(recorded, name) if recorded is not None else None
        if wanted is not None:
            check_setting(name, wanted, flag)
            if have is not None and have != wanted:
                fix = "drop it" if name != "system" else "run on the machine type the campaign started on"
                raise ConfigError(
                    f"{flag} {wanted} differs from {where}'s {name} {have}: one --out holds one "
                    f"{'system' if name == 'system' else 'campaign setting'}; {fix}, pass {flag} {have}, "
                    "or a new --out"
                )
        defaults = {**DEFAULTS, "system": default_system, "division": default_division}
        values[name] = wanted if wanted is not None else have if have is not None else defaults[name]
    return Settings(**values)  # type: ignore[arg-type]


def check_setting(name: str, value: str, where: str) -> None:
    """A ConfigError unless `value` may be setting `name` (a folder name, or one of its choices)."""
    if name in CHOICES:
        if value not in CHOICES[name]:
            raise ConfigError(f"{where}: {name} {value!r} is not one of {', '.join(CHOICES[name])}")
    elif not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(f"{where}: {name} {value!r} must be a plain folder name (letters, digits, . _ + -)")


def check_numbers(*, seeds: int, first_seed: int | None, index: int | None, flag: str = "--seeds") -> None:
    """A ConfigError (one line, the flag, its value and the fix) unless every run of a campaign
    of `seeds` runs (and `index`) from `first_seed` has a seed torch and NumPy accept. Called
    where the options are parsed and again by the planner, before anything is recorded."""
    if not 1 <= seeds <= MAX_RUNS:
        raise ConfigError(f"{flag} {seeds} must be from 1 to {MAX_RUNS}; pass a count in that range")
    if index is not None and not 0 <= index < MAX_RUNS:
        raise ConfigError(
            f"--index {index} must be from 0 to {MAX_RUNS - 1}; pass the run's index in its campaign"
        )
    last = max(seeds, (index or 0) + 1) - 1
    if first_seed is not None and not 1 <= first_seed <= MAX_SEED - last:
        raise ConfigError(
            f"--first-seed {first_seed} must be from 1 to {MAX_SEED - last} (every seed, first seed + index, "
            f"is at most {MAX_SEED}); pass a --first-seed in that range, or none for a random one"
        )


def plan_campaign(
    request: CampaignRequest,
    recorded: CampaignFile | None,
    scan: Callable[[Settings], ResultScan],
    random_first_seed: Callable[[], int],
) -> CampaignPlan:
    """The campaign `request` asks for, given the campaign file already in --out (`recorded`) and
    `scan(settings)`, what the entry's results folder holds. The one resume rule:
    - a recorded entry is the campaign: a changed config is refused; a new full campaign needs
      --resume to add to it (an --index run is part of it and needs none);
    - a finished result is never rerun; an unfinished one only with --resume;
    - the finished runs fix the seeds (index i ran first_seed + i)."""
    where = Path(request.out) / CAMPAIGN_FILE
    flag = "--seeds" if request.scaling == "strong" else "--instances"
    check_numbers(seeds=request.seeds, first_seed=request.first_seed, index=request.index, flag=flag)
    hardware = recorded.hardware if recorded else None
    if request.default_system is not None and hardware not in (None, request.default_system):
        raise ConfigError(
            f"{where} records a campaign on {hardware} machines, but this run is on {request.default_system}: "
            f"one --out holds one system; run on {hardware}, or pass a new --out"
        )
    settings = resolve_settings(
        request.settings,
        recorded.settings if recorded else None,
        where,
        default_system=request.default_system,
        default_division=request.default_division,
    )
    key = entry_key(request.benchmark, request.scaling)
    entry = recorded.entries.get(key) if recorded else None
    fresh = ResultScan() if settings.system is None else scan(settings)
    if fresh.other_systems:
        other = sorted(fresh.other_systems)[0]
        raise ConfigError(
            f"{request.out}/{settings.submitter}/results holds system {other}, not {settings.system}: one "
            f"--out holds one system; pass --system {other}, or a new --out"
        )
    _check_entry(request, entry, fresh, where)
    count = max(request.seeds, entry.seeds if entry and request.index is not None else 0)
    if request.index is not None:
        count = max(count, request.index + 1)
    first = _first_seed(request, entry, fresh, count, where) or random_first_seed()
    seeds = tuple(seed_of(first, i) for i in range(count))
    if request.index is not None:
        to_run: tuple[int, ...] = (request.index,)
    else:
        to_run = tuple(i for i in range(count) if i not in fresh.finished)
    data = (
        Path(request.data)
        if request.data is not None
        else dataset_dir(request.out, request.benchmark, request.config)
    )
    # The recorded --config stays as written (a Slurm job may name the same YAML by another path).
    config = entry.config if entry is not None else request.config
    new_entry = Entry(config=config, config_id=request.config_id, seeds=count, first_seed=first)
    entries = {**(recorded.entries if recorded else {}), key: new_entry}
    record = CampaignFile(settings=settings, entries=entries, hardware=hardware or request.default_system)
    _check_extends(recorded, record, where)
    return CampaignPlan(
        out=Path(request.out),
        benchmark=request.benchmark,
        scaling=request.scaling,
        settings=settings,
        config_id=request.config_id,
        seeds=seeds,
        to_run=to_run,
        kept=tuple(sorted(i for i in fresh.finished if i not in to_run)),
        data=data,
        generated_data=request.data is None,
        record=record,
    )


def _check_entry(request: CampaignRequest, entry: Entry | None, fresh: ResultScan, where: Path) -> None:
    name = f"the {request.benchmark} {request.scaling}-scaling campaign in {request.out}"
    if entry is not None and entry.config_id != request.config_id:
        raise ConfigError(
            f"{name} was planned with another config (--config {entry.config} and its overrides, "
            f"config id {entry.config_id} in {where}); pass the same --config and overrides, or a new --out"
        )
    index = request.index
    if index is not None:
        if index in fresh.finished:
            raise SubmissionError(f"result_{index}.txt of {name} already exists; pick another --index")
        if index in fresh.present and not request.resume:
            raise SubmissionError(
                f"result_{index}.txt of {name} is an unfinished run; pass --resume to run it again"
            )
        return
    if (entry is not None or fresh.present) and not request.resume:
        fix = "pass --resume to finish that campaign, " if request.scaling == "strong" else ""
        held = (
            f"{fresh.folder} already holds {len(fresh.present)} result file(s)"
            if fresh.present and fresh.folder is not None
            else f"{where} already records {name}"
        )
        raise SubmissionError(f"{held}; {fix}a new --out, or move the earlier results away")


def _first_seed(
    request: CampaignRequest, entry: Entry | None, fresh: ResultScan, count: int, where: Path
) -> int | None:
    """The campaign's first seed: its finished runs' (checked against --first-seed and the record),
    else the recorded one (the first run into --out fixed it: a different --first-seed is refused,
    none follows it), else --first-seed; None: pick one."""
    folder = fresh.folder or where.parent
    first = _resumed_first_seed(dict(fresh.finished), count, request.first_seed, folder)
    if entry is not None and fresh.finished and first != entry.first_seed:
        index = min(fresh.finished)
        raise SubmissionError(
            f"{where} records first seed {entry.first_seed}, but {folder / f'result_{index}.txt'} ran seed "
            f"{fresh.finished[index]} (first seed {first}); the results are what ran: move the results "
            "or campaign.json away, or pass a new --out"
        )
    if entry is not None and not fresh.finished:
        if request.first_seed is not None and request.first_seed != entry.first_seed:
            raise ConfigError(
                f"--first-seed {request.first_seed} differs from the first seed {entry.first_seed} {where} "
                f"records for this campaign (the first run into --out fixed it); drop --first-seed to "
                f"follow it, pass --first-seed {entry.first_seed}, or a new --out"
            )
        first = entry.first_seed
    if first is not None and not 1 <= first <= MAX_SEED - (count - 1):
        raise SubmissionError(
            f"the results in {folder} fix this campaign's first seed at {first}, so its seeds leave "
            f"1..{MAX_SEED}; move those results away, or pass a new --out"
        )
    return first


def _resumed_first_seed(
    finished: dict[int, int], count: int, first_seed: int | None, where: Path
) -> int | None:
    """The campaign's first seed as its finished runs fix it (index i ran first + i), or
    `first_seed` when nothing is finished; a ConfigError when they disagree."""
    if not finished:
        return first_seed
    index, seed = min(finished.items())
    first = first_seed_of(seed, index)
    if first_seed is not None and first_seed != first:
        raise ConfigError(
            f"{where / f'result_{index}.txt'} ran seed {seed}, so this campaign's first seed is "
            f"{first}, not --first-seed {first_seed}; drop --first-seed to resume"
        )
    clash = [i for i, s in finished.items() if i >= count or s != seed_of(first, i)]
    if clash:
        raise ConfigError(
            f"{where / f'result_{clash[0]}.txt'} does not belong to a campaign of {count} seeds from "
            f"{first}; pass the campaign's --seeds, or a new --out"
        )
    return first


def _check_extends(recorded: CampaignFile | None, record: CampaignFile, where: Path) -> None:
    """The campaign file is written once per campaign: a later plan may fill what it left open
    (the system, the hardware, a new entry, more runs) but never change what it recorded. A
    planner rule that broke this would corrupt every later run into --out, so it stops here."""
    if recorded is None:
        return
    changed = [
        name
        for name, value in asdict(recorded.settings).items()
        if value is not None and getattr(record.settings, name) != value
    ]
    if recorded.hardware not in (None, record.hardware):
        changed.append("hardware")
    for key, entry in recorded.entries.items():
        new = record.entries.get(key)
        if new is None or (new.config_id, new.first_seed) != (entry.config_id, entry.first_seed):
            changed.append(f"entry {key}")
        elif new.seeds < entry.seeds:
            changed.append(f"entry {key}'s seeds")
    if changed:
        raise SubmissionError(
            f"this run would change {', '.join(changed)} in {where}, which a campaign never does; "
            "pass the campaign's options, or a new --out"
        )
