"""One options object for every route: `RunOptions.to_argv` parses back to the same options (every
field), a new field without a flag fails here, the Slurm seed jobs carry every flag, and the login
node refuses what a seed job would. Also: each choice list is the vocabulary's."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import get_args, get_type_hints

from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.campaign.options import _ARGV, RunOptions, check_options, from_args
from mlhpc.campaign.seeds import seed_of
from mlhpc.cli import build_parser
from mlhpc.common import vocabulary
from mlhpc.common.errors import ConfigError
from mlhpc.submission_checker.logparse import LogSniff
from tests.helpers.cli import mlhpc


def parse(argv: list[str]) -> RunOptions:
    """`mlhpc <argv>` as the CLI reads it (main: leftovers are key=value overrides)."""
    args, extra = build_parser("run").parse_known_args(argv)
    assert all("=" in word and not word.startswith("-") for word in extra), extra
    args.overrides = [*args.overrides, *extra]
    return from_args(args)


_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12
)
_path = st.builds(Path, _text | st.just("--"))
_name = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,20}", fullmatch=True)
_key = st.from_regex(r"[a-z][a-z_.]{0,10}", fullmatch=True)
_override = st.builds(
    lambda k, v: f"{k}={v}", _key, st.text(st.characters(blacklist_characters="\x00"), max_size=8)
)
_optional = lambda s: st.none() | s  # noqa: E731

# One strategy per field: a field without one is a KeyError, like a field without a flag.
_FIELDS = {
    "benchmark": st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
    "config": _text.filter(lambda c: not c.startswith("-")) | st.sampled_from(["mini", "full"]),
    "overrides": st.lists(_override, max_size=3).map(tuple),
    "num_seeds": st.integers(1, 10_000),
    "first_seed": _optional(st.integers(1, 2**32 - 1)),
    "out": _path,
    "data": _optional(_path),
    "local_dir": _optional(_path),
    "allow_size": _optional(st.integers(0, 2**50)),
    # Names the planner accepts (campaign._NAME): a name like `--` is refused before any to_argv.
    "submitter": _optional(_name),
    "system": _optional(_name),
    "division": _optional(st.sampled_from(vocabulary.DIVISIONS)),
    "status": _optional(st.sampled_from(vocabulary.STATUSES)),
    "ruleset": _optional(st.sampled_from(vocabulary.RULESETS)),
    "campaign": _optional(_path),
    "staging": st.sampled_from(vocabulary.STAGINGS),
    "staging_io": st.sampled_from(vocabulary.IO_CHOICES),
    "durable": st.booleans(),
    "clear_cache": st.booleans(),
    "check": st.booleans(),
    "resume": st.booleans(),
    "index": _optional(st.integers(0, 9_999)),
    "instances": st.integers(1, 10_000),
    "power": st.booleans(),
    "mllog_stdout": st.booleans(),
    "backend": st.sampled_from(get_args(get_type_hints(RunOptions)["backend"])),
    "device": st.sampled_from(get_args(get_type_hints(RunOptions)["device"])),
}


def test_every_field_has_a_flag_and_a_strategy() -> None:
    """A field added to RunOptions without to_argv support (or without a case here) fails now."""
    names = {f.name for f in dataclasses.fields(RunOptions)}
    assert names == set(_ARGV), f"give these a flag in run_options._ARGV: {names ^ set(_ARGV)}"
    assert names == set(_FIELDS), f"give these a strategy here: {names ^ set(_FIELDS)}"


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries(_FIELDS))
def test_to_argv_parses_back_to_the_same_options(values: dict[str, object]) -> None:
    opts = RunOptions(**values)  # type: ignore[arg-type]
    assert parse(opts.to_argv()) == opts


def test_the_defaults_write_only_the_benchmark_and_the_values_argparse_fills() -> None:
    opts = parse(["run", "cosmoflow", "--out", "x"])
    assert opts == RunOptions(benchmark="cosmoflow", out=Path("x"))
    assert parse(opts.to_argv()) == opts


def test_argparse_offers_the_vocabulary() -> None:
    run = build_parser("run")._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    choices = {a.dest: tuple(a.choices) for a in run._actions if a.choices}
    assert choices["division"] == vocabulary.DIVISIONS
    assert choices["status"] == vocabulary.STATUSES
    assert choices["ruleset"] == vocabulary.RULESETS
    assert choices["staging"] == vocabulary.STAGINGS
    assert choices["io"] == vocabulary.IO_CHOICES
    stage = build_parser("stage")._subparsers._group_actions[0].choices["stage"]  # type: ignore[union-attr]
    assert next(a.choices for a in stage._actions if a.dest == "io") == vocabulary.IO_CHOICES


def test_the_staging_rule_is_the_checkers() -> None:
    from mlhpc.submission_checker import ruleset

    # The run command refuses `--staging before` under exactly the rulesets older than the one the
    # checker takes a log with staging before run_start to need.
    sniff = LogSniff(benchmark=None, run_start_ms=None, staging_before_run_start=True)
    [(needed, _)] = ruleset.log_signals(sniff)
    for name in vocabulary.RULESETS:
        opts = parse(["run", "cosmoflow", "--out", "x", "--staging", "before", "--ruleset", name])
        older = vocabulary.RULESETS.index(name) < vocabulary.RULESETS.index(needed)
        try:
            check_options(opts)
        except ConfigError as e:
            assert older, f"--ruleset {name} refused: {e}"
            assert "--staging before" in str(e) and needed in str(e)
        else:
            assert not older, f"--staging before accepted under --ruleset {name}, older than {needed}"
    assert [r for r in vocabulary.RULESETS if vocabulary.staging_before_allowed(r)] == ["3.0.0"]
    assert vocabulary.DEFAULT_RULESET == "3.0.0" == vocabulary.RULESETS[-1]


def seed_job_options(stdout: str, index: int) -> RunOptions:
    """The options the printed seed_<index>.sbatch runs (its `exec bash run_and_time.sh ...` line)."""
    script = stdout.split(f"seed_{index}.sbatch\n", 1)[1].split("\n### ", 1)[0]
    line = next(line for line in script.splitlines() if line.startswith("exec bash "))
    words = shlex.split(line)[3:]  # exec bash <run_and_time.sh> run ...
    return parse(words)


def test_every_flag_survives_the_trip_to_a_slurm_seed_job(tmp_path: Path) -> None:
    """The issue's reproduction: --power and --mllog-stdout were dropped on the way."""
    flags = ["--power", "--mllog-stdout", "--staging", "before", "--durable", "--io", "buffered"]
    flags += ["--clear-cache", "--backend", "gloo", "--device", "cpu", "--division", "open"]
    proc = mlhpc(
        "run", "cosmoflow", "--config", "mini", "--seeds", "2", "--out", "X", "--slurm", "--dry-run",
        *flags, "--local-dir", "nl", "loop.max_epochs=3", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    given = parse(["run", "cosmoflow", "--seeds", "2", "--out", "X", *flags, "loop.max_epochs=3"])
    for index in (0, 1):
        job = seed_job_options(proc.stdout, index)
        assert (job.index, job.check) == (index, False)
        assert job.local_dir == tmp_path / "nl" and job.out == tmp_path / "X"
        assert job.first_seed is not None and f"export SEED={seed_of(job.first_seed, index)}" in proc.stdout
        same = ("index", "check", "out", "data", "local_dir", "first_seed")
        assert dataclasses.replace(job, **{n: getattr(given, n) for n in same}) == given


def test_the_login_node_refuses_what_a_seed_job_would(tmp_path: Path) -> None:
    proc = mlhpc(
        "run", "cosmoflow", "--out", "X", "--slurm", "--staging", "before", "--ruleset", "2.0.0",
        cwd=tmp_path, PATH=f"{tmp_path}:/usr/bin:/bin",
    )  # fmt: skip
    assert proc.returncode == 2 and "--staging before is not allowed by HPC ruleset 2.0.0" in proc.stderr
    assert not (tmp_path / "X").exists()


def test_the_login_node_refuses_staging_before_under_a_recorded_ruleset(tmp_path: Path) -> None:
    """The campaign file says 2.0.0; --staging before is refused before any script is written."""
    (tmp_path / "X").mkdir()
    (tmp_path / "X" / "campaign.json").write_text(
        '{"mlhpc_campaign": 1, "settings": {"submitter": "mlhpc", "ruleset": "2.0.0"}, "entries": {}}'
    )
    proc = mlhpc("run", "cosmoflow", "--out", "X", "--slurm", "--dry-run", "--staging", "before", cwd=tmp_path)
    assert proc.returncode == 2 and "ruleset 2.0.0" in proc.stderr, proc.stderr
    assert "### " not in proc.stdout
