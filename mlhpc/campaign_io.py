"""What a campaign plan reads: the campaign file and results already in `--out` (every field
checked, since either may be hand-edited or planted), the settings a user gave, and the resolved
config. Torch-free apart from what the benchmark catalog imports."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlhpc.campaign import (
    DEFAULTS,
    SETTING_FLAGS,
    CampaignFile,
    Entry,
    ResultScan,
    Settings,
    check_setting,
    config_identity,
)
from mlhpc.common.errors import ConfigError, SubmissionError
from mlhpc.common.layout import Scaling, results_dir

MAX_CAMPAIGN_BYTES = 1 << 20


def read_campaign_file(path: Path) -> CampaignFile | None:
    """The campaign file at `path` (None when there is none), every field checked: it may have
    been edited by hand or planted."""
    data = _read_json(path)
    if data is None:
        return None
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
    from mlhpc.common import safe_read

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    problem = safe_read.judge(path, path.parent, MAX_CAMPAIGN_BYTES, what="a campaign file")
    if problem is not None:
        raise SubmissionError(problem.line(path))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SubmissionError(f"{path} is not an mlhpc campaign file ({e}); fix it or move it away") from e


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


def _entry(key: object, entry: Any) -> Entry:
    numbers = [entry["seeds"], entry["first_seed"]]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers):
        raise ValueError(f"entry {key}: seeds and first_seed must be whole numbers from 1")
    return Entry(
        config=str(entry["config"]),
        config_id=str(entry["config_id"]),
        seeds=entry["seeds"],
        first_seed=entry["first_seed"],
    )


def given_settings(path: Path | None, flags: Mapping[str, str | None]) -> dict[str, str | None]:
    """The settings a user gave: `--campaign FILE`'s and the flags'; the two must agree."""
    given = {name: flags.get(name) for name in SETTING_FLAGS}
    if path is None:
        return given
    data = _read_json(path)
    if data is None:
        raise ConfigError(f"--campaign {path}: no such file; pass an existing campaign file")
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
    from mlhpc.resume import finished_runs

    paths = sorted(Path(folder).glob("result_*.txt"))
    present = frozenset(int(p.stem[7:]) for p in paths if p.stem[7:].isdigit())
    return ResultScan(present=present, finished=finished_runs(paths), folder=Path(folder))


def scan_out(out: Path, benchmark: str, scaling: Scaling) -> Callable[[Settings], ResultScan]:
    """`plan_campaign`'s `scan` for an entry of the submission in `out`."""

    def scan(settings: Settings) -> ResultScan:
        assert settings.system is not None
        org_dir = Path(out) / settings.submitter
        found = scan_results(results_dir(org_dir, settings.system, scaling, benchmark))
        systems = {p.name for p in (org_dir / "results").glob("*") if p.is_dir() and not p.is_symlink()}
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
        from mlhpc.common import registry

        return registry.get(self.info.name)


def resolve_config(benchmark: str, config: str, overrides: tuple[str, ...] | list[str]) -> ResolvedConfig:
    """Load and validate `config` with `overrides` for `benchmark`: an unknown benchmark, config
    or key is one ConfigError. Every route (the local runner, the dry run, the Slurm submitter on
    a login node) calls this one function."""
    from mlhpc.common import catalog
    from mlhpc.common.config import load_config, to_dict

    info = catalog.info(benchmark)
    cfg = load_config(info.config_class, info.config_path(config), overrides)
    return ResolvedConfig(info, cfg, config_identity(info.name, to_dict(cfg)), info.division_for(cfg))
