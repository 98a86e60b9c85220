"""What a campaign plan reads: the campaign file and results already in `--out` (every field
checked, since either may be hand-edited or planted), the settings a user gave, and the resolved
config. Torch-free apart from what the benchmark catalog imports."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlhpc.campaign.options import RunOptions
from mlhpc.campaign.plan import (
    CAMPAIGN_FILE,
    CAMPAIGN_FORMAT,
    CampaignFile,
    CampaignPlan,
    CampaignRequest,
    Entry,
    ResultScan,
    config_identity,
    plan_campaign,
)
from mlhpc.campaign.seeds import MAX_RUNS, MAX_SEED, draw_first_seed
from mlhpc.campaign.settings import DEFAULTS, SETTING_FLAGS, Settings, check_setting
from mlhpc.common.errors import ConfigError, DataError, SubmissionError
from mlhpc.common.layout import Scaling, results_dir, results_root

MAX_CAMPAIGN_BYTES = 1 << 20


def read_campaign_file(path: Path) -> CampaignFile | None:
    """The campaign file at `path` (None when there is none), every field checked: it may have
    been edited by hand or planted."""
    data = _read_json(path)
    if data is None:
        return None
    _check_format(data, path)
    try:
        values = _setting_values(data, path)
        for name, default in {**DEFAULTS, "division": "closed"}.items():
            values[name] = values[name] or default
        entries = {str(key): _entry(key, entry) for key, entry in dict(data.get("entries", {})).items()}
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise SubmissionError(f"{path} is not an mlhpc campaign file ({e}); fix it or move it away") from e
    hardware = data.get("hardware")
    if hardware is not None:
        check_setting("system", hardware, f"{path}: hardware")
    return CampaignFile(settings=Settings(**values), entries=entries, hardware=hardware)  # type: ignore[arg-type]


def _read_json(path: Path) -> Any:
    from mlhpc.common.safeio import safe_json, safe_read

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    problem = safe_read.judge(path, path.parent, MAX_CAMPAIGN_BYTES, what="a campaign file")
    if problem is not None:
        raise SubmissionError(problem.line(path))
    try:
        return safe_json.load_file(path, dict, max_bytes=MAX_CAMPAIGN_BYTES)
    except safe_json.BadJson as e:
        raise SubmissionError(f"{path} is not an mlhpc campaign file ({e}); fix it or move it away") from None
    except OSError as e:
        raise SubmissionError(f"{path}: cannot read it ({e.strerror or e}); fix it or move it away") from None


def _check_format(data: dict[str, Any], path: Path) -> None:
    """A campaign file of a format this mlhpc does not know is refused, never read as its own:
    rewriting it would drop what the newer format records. One written by hand without a format
    number reads as format 1 (the docs give its shape)."""
    if "mlhpc_campaign" not in data:
        return
    version = data["mlhpc_campaign"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SubmissionError(
            f"{path} is not an mlhpc campaign file (mlhpc_campaign {str(version)[:20]!r}, not a format "
            "number); fix it or move it away"
        )
    if version > CAMPAIGN_FORMAT:
        raise SubmissionError(
            f"{path} was written by a newer mlhpc (format {version}; this one reads {CAMPAIGN_FORMAT}); "
            "use that version or a new --out"
        )


def _setting_values(data: Any, path: Path) -> dict[str, str | None]:
    """The file's settings, each checked; None where it names none."""
    raw = data["settings"]
    if not isinstance(raw, dict):
        raise ValueError("settings is not an object")
    values: dict[str, str | None] = {}
    for name in SETTING_FLAGS:
        value = raw.get(name)
        if value is not None:
            check_setting(name, value, str(path))
        values[name] = value
    return values


OLD_NUM_RUNS = "seeds"
"""What campaign-file format 1 called an entry's num_runs (a count, not seed values)."""


def _entry(key: object, entry: Any) -> Entry:
    count = entry["num_runs"] if "num_runs" in entry else entry[OLD_NUM_RUNS]
    first = entry["first_seed"]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (count, first)):
        raise ValueError(f"entry {key}: num_runs and first_seed must be whole numbers")
    # What a resume would run: every seed within what torch and NumPy take, a bounded count.
    if not (1 <= count <= MAX_RUNS and 1 <= first <= MAX_SEED - (count - 1)):
        raise ValueError(
            f"entry {key}: num_runs 1..{MAX_RUNS} from a first_seed that keeps its seeds in 1..{MAX_SEED}"
        )
    return Entry(
        config=str(entry["config"]), config_id=str(entry["config_id"]), num_runs=count, first_seed=first
    )


def given_settings(path: Path | None, flags: Mapping[str, str | None]) -> dict[str, str | None]:
    """The settings a user gave: `--campaign FILE`'s and the flags'; the two must agree."""
    given = {name: flags.get(name) for name in SETTING_FLAGS}
    if path is None:
        return given
    data = _read_json(path)
    if data is None:
        raise ConfigError(f"--campaign {path}: no such file; pass an existing campaign file")
    _check_format(data, path)
    try:
        from_file = _setting_values(data, path)
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise ConfigError(f"--campaign {path} has no settings object ({e}); fix it") from e
    for name, value in from_file.items():
        if value is None:
            continue
        if given[name] is not None and given[name] != value:
            raise ConfigError(
                f"{SETTING_FLAGS[name]} {given[name]} differs from --campaign {path}'s {name} {value}; "
                "drop one of them"
            )
        given[name] = value
    return given


def scan_results(folder: Path) -> ResultScan:
    """What a results folder holds (a result that cannot be read is a SubmissionError)."""
    from mlhpc.campaign.resume import finished_runs

    paths = sorted(Path(folder).glob("result_*.txt"))
    present = frozenset(int(p.stem[7:]) for p in paths if p.stem[7:].isdigit())
    return ResultScan(present=present, finished=finished_runs(paths), folder=Path(folder))


def scan_out(out: Path, benchmark: str, scaling: Scaling) -> Callable[[Settings], ResultScan]:
    """`plan_campaign`'s `scan` for an entry of the submission in `out`."""

    def scan(settings: Settings) -> ResultScan:
        assert settings.system is not None
        submitter_dir = Path(out) / settings.submitter
        found = scan_results(results_dir(submitter_dir, settings.system, scaling, benchmark))
        systems = {p.name for p in results_root(submitter_dir).glob("*") if p.is_dir() and not p.is_symlink()}
        return replace(found, other_systems=frozenset(systems - {settings.system}))

    return scan


@dataclass(frozen=True)
class ResolvedConfig:
    """A benchmark and its config as a run would train it, validated (without torch)."""

    info: Any
    """The catalog's BenchmarkInfo: facts only, so a login node validates without torch."""
    cfg: Any
    config_id: str
    default_division: str

    @property
    def benchmark(self) -> Any:
        """The registry.Benchmark with its torch functions (imports torch; for the run itself)."""
        from mlhpc.common.contract import registry

        return registry.get(self.info.name)

    def check_batch(self, ranks: int) -> None:
        """An epoch of the config's training samples holds at least one optimizer step on `ranks`
        ranks (each rank's share, whole micro-batches, whole accumulation cycles, as the loop
        counts them): a batch larger than the data is refused before anything is recorded."""
        loop = self.cfg.loop
        samples = getattr(getattr(self.cfg, "data", None), "num_train_samples", None)
        if not isinstance(samples, int) or isinstance(samples, bool):
            return  # an epoch is what the data holds: the loader says it
        step = loop.local_batch_size(ranks) * loop.gradient_accumulation_steps
        if samples // ranks < step:
            raise ConfigError(
                f"loop.global_batch_size={loop.global_batch_size} is more than data.num_train_samples="
                f"{samples} on {ranks} rank(s): an epoch would hold no step; pick a batch of at most "
                f"{samples // ranks * ranks} samples, or more data.num_train_samples"
            )

    def check_model(self, config: str) -> None:
        """Build the model on torch's meta device (no memory, no data, well under a second): sizes
        that cannot make a model are refused before the campaign file records them."""
        import torch

        try:
            with torch.device("meta"):
                self.benchmark.build_model(self.cfg)
        except Exception as e:  # whatever the model code raises: one line
            why = (str(e).splitlines() or [""])[0][:160]
            raise ConfigError(
                f"--config {config} with these overrides builds no {self.info.name} model ({type(e).__name__}: "
                f"{why}); fix the model.* and data.* sizes"
            ) from None


def resolve_config(benchmark: str, config: str, overrides: tuple[str, ...] | list[str]) -> ResolvedConfig:
    """Load and validate `config` with `overrides` for `benchmark`: an unknown benchmark, config
    or key is one ConfigError. Every route (the local runner, the dry run, the Slurm submitter on
    a login node) calls this one function."""
    from mlhpc.common.contract import catalog
    from mlhpc.common.contract.config import load_config, to_dict

    info = catalog.info(benchmark)
    cfg = load_config(info.config_class, info.config_path(config), overrides)
    return ResolvedConfig(info, cfg, config_identity(info.name, to_dict(cfg)), info.division_for(cfg))


def campaign_request(
    opts: RunOptions, resolved: ResolvedConfig, scaling: Scaling, default_system: str | None
) -> CampaignRequest:
    """The planner's view of `opts`, the same on every route (the local runner, the dry run, the
    Slurm submitter); `default_system` is None on a login node, whose hardware is not the
    compute nodes'."""
    return CampaignRequest(
        benchmark=resolved.info.name,
        config=opts.config,
        config_id=resolved.config_id,
        out=opts.out,
        scaling=scaling,
        num_runs=opts.instances if scaling == "weak" else opts.num_seeds,
        first_seed=opts.first_seed,
        index=opts.index,
        resume=opts.resume,
        data=opts.data,
        settings=given_settings(opts.campaign, {name: getattr(opts, name) for name in SETTING_FLAGS}),
        default_system=default_system,
        default_division=resolved.default_division,
    )


def check_data_path(data: Path | None, out: Path) -> None:
    """--data as a run reads it: a folder (an archive is staged first), not one holding --out (a
    run writes results, datasets and logs there, changing the data it reads). One line each."""
    if data is None:
        return
    data = Path(data)
    if data.is_file() or (data.exists() and not data.is_dir()):
        from mlhpc.staging.archive import archive_kind

        if archive_kind(data) is not None:
            raise DataError(
                f"--data {data} is an archive, not a dataset folder; stage it first "
                f"(mlhpc stage {data} DEST, then --data DEST), or point --data at the dataset's folder"
            )
        raise DataError(
            f"--data {data} is a file, not a dataset folder; point --data at the dataset's folder"
        )
    held, holder = Path(out).resolve(), data.resolve()
    if held == holder or holder in held.parents:
        raise ConfigError(
            f"--out {out} is inside --data {data}: the run would write into the dataset it reads; "
            "pass an --out outside --data"
        )


def plan_out(
    request: CampaignRequest, random_first_seed: Callable[[], int] = draw_first_seed
) -> CampaignPlan:
    """`plan_campaign` on what --out holds now, after the checks every route makes before a plan
    is recorded (the caller holds --out's lock when it records it: `record_plan`)."""
    check_data_path(request.data, request.out)
    recorded = read_campaign_file(request.out / CAMPAIGN_FILE)
    scan = scan_out(request.out, request.benchmark, request.scaling)
    return plan_campaign(request, recorded, scan, random_first_seed)


def record_plan(plan: CampaignPlan) -> None:
    """Write the campaign file the plan leaves (under a temporary name, then renamed). The
    planner only ever adds to what it records, so one campaign's file never changes setting."""
    from mlhpc.common.safeio.fileio import atomic_write_json

    atomic_write_json(plan.out / CAMPAIGN_FILE, plan.record.to_json())
