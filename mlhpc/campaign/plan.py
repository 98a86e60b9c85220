"""The campaign model: options plus what `--out` already holds -> a `CampaignPlan` (seeds, result
indices to run, data folder, system, result paths, the config's identity). The local runner, the
instance launcher and the Slurm submitter all execute this plan. Pure (what `--out` holds comes
in, read by campaign/io.py) and torch-free, so a login node plans a Slurm campaign. The seeds'
rules are campaign/seeds.py's.

The campaign file, `<out>/campaign.json`, is written at the first plan into `--out` and read by
every later run into it (a resume, a Slurm task, `mlhpc run --index`, a run in another container):

    {"mlhpc_campaign": 2,
     "hardware": "intel_xeon_platinum_8480_cpu_n2",
     "settings": {"submitter": "mlhpc", "system": "intel_xeon_platinum_8480_cpu_n2", "division": "closed",
                  "status": "onprem", "ruleset": "3.0.0"},
     "entries": {"cosmoflow/strong": {"config": "mini", "config_id": "3f2a...", "num_runs": 10,
                                      "first_seed": 4711}}}

`hardware` is the stable hardware name (system_desc.stable_system_name) of the machines the
campaign trains on: a run on other machines is refused, whatever --system says.
`settings` are the submission-wide settings: a flag (`--submitter`, `--system`, `--division`,
`--status`, `--ruleset`) or a `--campaign FILE` of the same shape may give them; one that
disagrees with the recorded value is refused. `system` may be null until the first run on the
compute nodes fixes it (a Slurm campaign submitted without --system).
An entry's `num_runs` counts its results (seeds of a strong entry, instances of a weak one); the
seed of result_<i>.txt is `seeds.seed_of(first_seed, i)`. Format 1 named that count `seeds`
(read as num_runs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.campaign.seeds import campaign_first_seed, check_numbers, seed_of
from mlhpc.campaign.settings import Settings, resolve_settings
from mlhpc.common.errors import ConfigError, SubmissionError
from mlhpc.common.layout import Scaling, breakdown_file, result_file, results_dir

CAMPAIGN_FILE = "campaign.json"
CAMPAIGN_FORMAT = 2
"""2: an entry's count of results is `num_runs` (format 1 called it `seeds`)."""


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One benchmark's campaign in `--out` as the campaign file records it."""

    config: str
    """--config as given (mini, full, or a YAML path)."""
    config_id: str
    """`config_identity` of the resolved config: what a resume must match."""
    num_runs: int
    """How many results the entry holds: seeds of a strong campaign, instances of a weak one."""
    first_seed: int
    """The seed of result_0.txt; result_<i>.txt runs seeds.seed_of(first_seed, i)."""


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
    num_runs: int = 1
    """Seeds of a strong campaign (--seeds), or instances (models) of a weak one (--instances)."""
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
    def submitter_dir(self) -> Path:
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
        return result_file(self.submitter_dir, self.system, self.scaling, self.benchmark, index)

    def breakdown_path(self, index: int) -> Path:
        return breakdown_file(self.submitter_dir, self.system, self.scaling, self.benchmark, index)

    def run_lock_dir(self, index: int) -> Path:
        """The folder whose lock the run of `index` holds while it trains (outside the submission)."""
        s = self.settings
        return (
            self.out / ".mlhpc-runs" / f"{s.submitter}-{self.system}-{self.scaling}-{self.benchmark}-{index}"
        )

    @property
    def results_dir(self) -> Path:
        return results_dir(self.submitter_dir, self.system, self.scaling, self.benchmark)


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
    - the finished runs fix the seeds (seeds.py: index i ran first_seed + i)."""
    where = request.out / CAMPAIGN_FILE
    flag = "--seeds" if request.scaling == "strong" else "--instances"
    check_numbers(num_runs=request.num_runs, first_seed=request.first_seed, index=request.index, flag=flag)
    settings = _settings(request, recorded, where)
    key = entry_key(request.benchmark, request.scaling)
    entry = recorded.entries.get(key) if recorded else None
    fresh = _scan(request, settings, scan)
    _check_entry(request, entry, fresh, where)
    first, count = _first_seed_and_count(request, entry, fresh, where, random_first_seed)
    if request.index is not None:
        to_run: tuple[int, ...] = (request.index,)
    else:
        to_run = tuple(i for i in range(count) if i not in fresh.finished)
    # The recorded --config stays as written (a Slurm job may name the same YAML by another path).
    config = entry.config if entry is not None else request.config
    new_entry = Entry(config=config, config_id=request.config_id, num_runs=count, first_seed=first)
    hardware = (recorded.hardware if recorded else None) or request.default_system
    entries = {**(recorded.entries if recorded else {}), key: new_entry}
    record = CampaignFile(settings=settings, entries=entries, hardware=hardware)
    _check_extends(recorded, record, where)
    data = (
        request.data
        if request.data is not None
        else dataset_dir(request.out, request.benchmark, request.config)
    )
    return CampaignPlan(
        out=request.out,
        benchmark=request.benchmark,
        scaling=request.scaling,
        settings=settings,
        config_id=request.config_id,
        seeds=tuple(seed_of(first, i) for i in range(count)),
        to_run=to_run,
        kept=tuple(sorted(i for i in fresh.finished if i not in to_run)),
        data=Path(data),
        generated_data=request.data is None,
        record=record,
    )


def _first_seed_and_count(
    request: CampaignRequest,
    entry: Entry | None,
    fresh: ResultScan,
    where: Path,
    random_first_seed: Callable[[], int],
) -> tuple[int, int]:
    """The campaign's first seed (seeds.campaign_first_seed, else a drawn one) and its number of
    runs: the request's, the recorded entry's for an --index run, and at least up to --index."""
    count = max(request.num_runs, entry.num_runs if entry and request.index is not None else 0)
    if request.index is not None:
        count = max(count, request.index + 1)
    recorded = entry.first_seed if entry is not None else None
    folder = fresh.folder or where.parent
    first = campaign_first_seed(request.first_seed, recorded, fresh.finished, count, where, folder)
    return first or random_first_seed(), count


def _settings(request: CampaignRequest, recorded: CampaignFile | None, where: Path) -> Settings:
    """The settings of the campaign: the machines it trains on must be the recorded ones."""
    hardware = recorded.hardware if recorded else None
    if request.default_system is not None and hardware not in (None, request.default_system):
        raise ConfigError(
            f"{where} records a campaign on {hardware} machines, but this run is on {request.default_system}: "
            f"one --out holds one system; run on {hardware}, or pass a new --out"
        )
    return resolve_settings(
        request.settings,
        recorded.settings if recorded else None,
        where,
        default_system=request.default_system,
        default_division=request.default_division,
    )


def _scan(request: CampaignRequest, settings: Settings, scan: Callable[[Settings], ResultScan]) -> ResultScan:
    """What the entry's results folder holds (nothing while the system is unnamed); results of
    another system in the submission are refused."""
    fresh = ResultScan() if settings.system is None else scan(settings)
    if fresh.other_systems:
        other = sorted(fresh.other_systems)[0]
        raise ConfigError(
            f"{request.out}/{settings.submitter}/results holds system {other}, not {settings.system}: one "
            f"--out holds one system; pass --system {other}, or a new --out"
        )
    return fresh


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
        elif new.num_runs < entry.num_runs:
            changed.append(f"entry {key}'s num_runs")
    if changed:
        raise SubmissionError(
            f"this run would change {', '.join(changed)} in {where}, which a campaign never does; "
            "pass the campaign's options, or a new --out"
        )
