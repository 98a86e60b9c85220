"""Issue 39: user strings never become shell or a second sbatch option in a Slurm job script.
Every character class (hypothesis `st.text()`: control characters, whitespace, quotes, `$`,
backtick, `;`, `\\`, `%`, non-ASCII, long) fed to --out, --slurm-partition, --slurm-time,
--sbatch-arg and the words of the seed job's command: each is refused in one line, or the
script `bash -n` accepts carries exactly that string as one argument, read back by a parser
that reads #SBATCH lines as sbatch does (src/sbatch/opt.c) and by shlex for the commands."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.campaign.io import plan_out
from mlhpc.campaign.job_strings import check_slurm_strings
from mlhpc.campaign.options import RunOptions
from mlhpc.campaign.plan import CampaignPlan
from mlhpc.campaign.prepare import prepare
from mlhpc.campaign.slurm import absolute, slurm_request
from mlhpc.campaign.slurm_graph import JobTools, SlurmGraph, SlurmResources, build_graph
from mlhpc.common.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TOOLS = JobTools(run_and_time=REPO / "run_and_time.sh", mlhpc_cmd=(sys.executable, "-m", "mlhpc"))
BASE = Path("/nonexistent-mlhpc-base")
EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Every class the issue names, and long text, beside hypothesis' own draws.
NASTY = st.sampled_from(
    [
        "a\nb",
        "a b",
        "a\tb",
        "%u",
        "a%jb",
        "'",
        '"',
        "$(id)",
        "`id`",
        ";id",
        "a\\b",
        "#x",
        "é",
        "\x7f",
        "a\udcffb",
        "a\x00b",
        "x" * 5000,
    ]
)
TEXT = st.one_of(st.text(), NASTY, st.text(min_size=300, max_size=5000))


def sbatch_words(line: str) -> list[str]:
    """The arguments sbatch reads from one #SBATCH line's rest, as its _get_argument does:
    whitespace splits, quotes group, a backslash escapes, an unquoted `#` ends the line, and
    `packjob`/`hetjob` are blanked first."""
    for word in ("packjob", "hetjob"):
        at = line.lower().find(word)
        if at >= 0:
            line = line[:at] + " " * len(word) + line[at + len(word) :]
    words: list[str] = []
    current: list[str] | None = None
    quote, escape = "", False
    for char in line:
        if escape:
            current = (current or []) + [char]
            escape = False
        elif char == "\\":
            escape, current = True, current or []
        elif quote:
            if char == quote:
                quote = ""
            else:
                current = (current or []) + [char]
        elif char in "'\"":
            quote, current = char, current or []
        elif char == "#":
            break
        elif char.isspace():
            if current is not None:
                words.append("".join(current))
            current = None
        else:
            current = (current or []) + [char]
    if current is not None:
        words.append("".join(current))
    return words


def sbatch_argv(script: str) -> list[str]:
    """Every argument sbatch reads from `script`'s #SBATCH lines (those before the first command)."""
    lines = script.split("\n")
    assert lines[0] == "#!/bin/bash"
    found: list[str] = []
    for line in lines[1:]:
        if line.startswith("#SBATCH"):
            found += sbatch_words(line.removeprefix("#SBATCH"))
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return found


def output_folder(pattern: str) -> str:
    """The folder of an --output pattern as Slurm writes it (`%%` a literal `%`), its file name
    (the one `%j`) checked apart."""
    folder, _, name = pattern.rpartition("/")
    assert name.endswith("-%j.out") and "%" not in name.removesuffix("-%j.out")
    assert "\\" not in folder, "a backslash turns Slurm's patterns off"
    literal, rest = [], folder
    while rest:
        if rest.startswith("%%"):
            literal.append("%")
            rest = rest[2:]
        else:
            assert not rest.startswith("%"), f"a % pattern Slurm would expand: {pattern}"
            literal.append(rest[0])
            rest = rest[1:]
    return "".join(literal)


def seed_command(script: str) -> list[str]:
    """The words of a seed job's last command (`exec bash run_and_time.sh ...`), as the shell reads them."""
    return shlex.split(script[script.index("\nexec bash ") :])


def bash_accepts(script: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunOptions, CampaignPlan]:
    out = tmp_path_factory.mktemp("jobs") / "out"
    opts = absolute(
        RunOptions(benchmark="cosmoflow", num_seeds=1, first_seed=5, out=out, submitter="org", system="s")
    )
    return opts, plan_out(slurm_request(prepare(opts)))


def graph_for(
    base: tuple[RunOptions, CampaignPlan], opts: RunOptions, resources: SlurmResources
) -> SlurmGraph:
    """The graph of `opts` (out moved with its plan), after the one judge accepted it."""
    check_slurm_strings(opts, resources)
    opts = absolute(opts)
    plan = replace(base[1], out=opts.out, data=opts.out / "datasets" / "cosmoflow-mini")
    return build_graph(opts, plan, resources, TOOLS, generate=True)


@EXAMPLES
@given(name=TEXT)
def test_an_out_folder_is_refused_or_lands_as_written(
    base: tuple[RunOptions, CampaignPlan], name: str
) -> None:
    opts = replace(base[0], out=BASE / name)
    try:
        g = graph_for(base, opts, SlurmResources())
    except ConfigError as e:
        assert "--out" in str(e) and "\n" not in str(e)
        return
    out = (BASE / name).resolve()
    for job in g.jobs:
        bash_accepts(job.script)
        (output,) = [
            w.removeprefix("--output=") for w in sbatch_argv(job.script) if w.startswith("--output=")
        ]
        assert output_folder(output) == str(out / "slurm")
    seed = next(j for j in g.jobs if j.index == 0)
    assert f"--out={out}" in seed_command(seed.script)


@EXAMPLES
@given(value=TEXT, which=st.sampled_from(["partition", "time", "sbatch_arg"]))
def test_an_sbatch_option_is_refused_or_read_back_as_one_argument(
    base: tuple[RunOptions, CampaignPlan], value: str, which: str
) -> None:
    try:
        if which == "sbatch_arg":
            resources = SlurmResources(sbatch_args=(value,))
        else:
            resources = SlurmResources(**{which: value})  # type: ignore[arg-type]
        g = graph_for(base, base[0], resources)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    expected = value.split(" ") if which == "sbatch_arg" else [f"--{which}={value}"]
    for job in g.jobs:
        bash_accepts(job.script)
        argv = sbatch_argv(job.script)
        assert len(argv) == len(job.resources) + expected.count("") + len(expected) - 1
        at = argv.index(expected[0])
        assert argv[at : at + len(expected)] == expected


def test_time_forms_slurm_reads_are_taken() -> None:
    for value in ("90", "30:00", "01:00:00", "2-00", "2-12:30", "1-00:00:00", "UNLIMITED"):
        assert SlurmResources(time=value).time == value
    for value in ("01:00:00\nid", "1 h", "", "-1", "1:2:3:4"):
        with pytest.raises(ConfigError, match="--slurm-time"):
            SlurmResources(time=value)


@EXAMPLES
@given(word=TEXT, where=st.sampled_from(["overrides", "submitter", "system", "config"]))
def test_a_command_word_is_refused_or_one_argument(
    base: tuple[RunOptions, CampaignPlan], word: str, where: str
) -> None:
    value: object = (word,) if where == "overrides" else word
    opts = replace(base[0], **{where: value})
    try:
        g = graph_for(base, opts, SlurmResources())
    except ConfigError as e:
        assert "\x00" in word or "UTF-8" in str(e) or "128 KiB" in str(e), str(e)
        return
    seed = next(j for j in g.jobs if j.index == 0)
    bash_accepts(seed.script)
    words = seed_command(seed.script)
    flag = {"submitter": "--submitter=", "system": "--system=", "config": "--config="}.get(where, "")
    ran = absolute(opts)
    expected = ran.config if where == "config" else word
    assert f"{flag}{expected}" in words


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [
        ("partition", "gpu\nhostname", "a newline"),
        ("partition", "gpu debug", "a space"),
        ("partition", "gpu#x", "'#'"),
        ("partition", "my-packjob", "packjob"),
        ("sbatch_args", ("--account=a\n#SBATCH --x",), "a newline"),
        ("sbatch_args", ("account=abc",), "not one sbatch option"),
        ("sbatch_args", ("--account=a'b",), "--sbatch-arg"),
    ],
)
def test_refusals_name_the_option_and_the_character(option: str, value: object, shown: str) -> None:
    with pytest.raises(ConfigError) as raised:
        SlurmResources(**{option: value})  # type: ignore[arg-type]
    line = str(raised.value)
    assert "\n" not in line and shown in line and ("pass" in line or "write it" in line)
    if option == "partition":
        assert line.startswith("--slurm-partition")


def test_a_percent_in_out_is_a_literal_percent(base: tuple[RunOptions, CampaignPlan]) -> None:
    g = graph_for(base, replace(base[0], out=BASE / "a%ub"), SlurmResources())
    assert f"#SBATCH --output={BASE}/a%%ub/slurm/seed_0-%j.out" in g.jobs[1].script
    with pytest.raises(ConfigError, match=r"--out .*a backslash|--out .*'\\\\'"):
        check_slurm_strings(replace(base[0], out=BASE / "a\\b"), SlurmResources())
