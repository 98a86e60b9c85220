"""No output over an input: every option of the CLI that names an output is tried on an input of
the same command (the input itself, a new path inside it, the same through a symlink) and must be
one line, exit 2, with the input byte-identical; the one guard behind them against random paths;
and the marked folders a command removes only when they are its own."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlhpc.cli import build_parser, main
from mlhpc.common.errors import ConfigError
from mlhpc.common.safeio.fileio import atomic_write_bytes
from mlhpc.common.safeio.writable import (
    MADE_MARKER,
    MadeDir,
    make_marked_dir,
    refuse_output_over_inputs,
    remove_marked_dir,
)
from mlhpc.study import dataset
from tests.helpers.datasets import tree

DATA = Path(__file__).parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]


def trees(*roots: Path) -> dict[str, object]:
    """Each root (a folder, a file or a link) with everything under it, folders included."""
    return {str(root): tree(root, folders=True) for root in roots}


# ---------------------------------------------------------------- the CLI's output options


def path_options(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    """(command, option) for every argument of every (sub)command that takes a path."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= path_options(sub, (*command, name))
        elif action.type is Path:
            found.add(
                (" ".join(command), action.option_strings[-1] if action.option_strings else action.dest)
            )
    return found


INPUTS = {
    ("stage", "src"),
    ("manifest", "src"),  # its manifest goes into the dataset by design: `mlhpc manifest SRC`
    ("verify", "dest"),
    ("stage-bench", "--data"),
    ("run", "--data"),
    ("run", "--campaign"),
    ("check", "path"),
    ("variability", "path"),
    ("report", "path"),
    ("results add", "dirs"),
    ("results list", "--db"),
    ("results compare", "--db"),
    ("characterize", "--data"),
    ("characterize", "--compare"),
    ("status", "out"),  # read only: status writes nothing (tests/campaign/test_status.py snapshots it)
}


@dataclass
class Inputs:
    root: Path
    sub: Path
    """A copy of a published submission, with a time breakdown in it."""
    log: Path
    systems: Path
    data: Path
    """A small dataset with a manifest."""
    config: Path
    link: Path
    """A symlink outside both, to the submission."""
    data_link: Path

    def all(self) -> list[Path]:
        return [self.sub, self.data, self.config]


@pytest.fixture
def inputs(tmp_path: Path) -> Inputs:
    sub = tmp_path / "sub"
    shutil.copytree(DATA / "hpc_v1.0_ncsa", sub)
    breakdown = sub / "NCSA" / "breakdown" / "x" / "result_0.json"
    breakdown.parent.mkdir(parents=True)
    breakdown.write_text(
        '{"seed": 7, "seconds": {"forward": 1.0}, "time_to_train_s": 2.0, "init_s": 1.0,'
        ' "flops_per_sample": 1e9, "achieved_flops_per_s": 1e12, "train_samples_seen": 64}'
    )
    data = tmp_path / "data"
    dataset.make_dataset(data, 256 << 10, 64 << 10)
    config = tmp_path / "mini.yaml"
    shutil.copy(REPO / "benchmarks" / "cosmoflow" / "configs" / "mini.yaml", config)
    (tmp_path / "link").symlink_to(sub)
    (tmp_path / "data-link").symlink_to(data)
    results = sub / "NCSA" / "results" / "halv100_n16_pt1.7.1" / "strong" / "oc20"
    return Inputs(
        root=tmp_path,
        sub=sub,
        log=results / "result_01.txt",
        systems=sub / "NCSA" / "systems" / "halv100_n16_pt1.7.1.json",
        data=data,
        config=config,
        link=tmp_path / "link",
        data_link=tmp_path / "data-link",
    )


@dataclass(frozen=True)
class Case:
    argv: Callable[[Inputs, str], list[str]]
    """The command line with the output set to the given path."""
    targets: Callable[[Inputs], list[Path]]
    """Outputs that are, or lie in, an input of that command."""
    names: str
    """What the refusal line must name."""


def _file_targets(suffix: str) -> Callable[[Inputs], list[Path]]:
    """An input file of the submission, a new file inside it, the same through a symlink."""
    return lambda i: [i.log, i.systems, i.sub / f"new{suffix}", i.link / "NCSA" / f"new{suffix}"]


def _folder_targets(i: Inputs) -> list[Path]:
    return [i.sub, i.sub / "NCSA" / "new", i.link / "new"]


def _data_targets(i: Inputs) -> list[Path]:
    return [i.data, i.data / "inside", i.data_link / "inside"]


OUTPUTS: dict[tuple[str, str], Case] = {
    ("characterize", "--out"): Case(
        lambda i, t: ["characterize", "cosmoflow", "--analytic", "--data", str(i.data), "--out", t],
        _data_targets,
        "--out",
    ),
    ("generate", "--out"): Case(
        lambda i, t: ["generate", "cosmoflow", "--config", str(i.config), "--out", t],
        lambda i: [i.config],
        "--out",
    ),
    ("stage", "dest"): Case(lambda i, t: ["stage", str(i.data), t], _data_targets, "destination"),
    ("stage-bench", "--out"): Case(
        lambda i, t: ["stage-bench", "--data", str(i.data), "--out", t], _data_targets, "--out"
    ),
    ("stage-bench", "--scratch"): Case(
        lambda i, t: ["stage-bench", "--data", str(i.data), "--out", str(i.root / "o"), "--scratch", t],
        _data_targets,
        "--scratch",
    ),
    ("stage-bench", "--local-dir"): Case(
        lambda i, t: ["stage-bench", "--data", str(i.data), "--out", str(i.root / "o"), "--local-dir", t],
        _data_targets,
        "--local-dir",
    ),
    ("run", "--out"): Case(
        lambda i, t: ["run", "cosmoflow", "--data", str(i.data), "--out", t, "--dry-run"],
        _data_targets,
        "--out",
    ),
    ("run", "--local-dir"): Case(
        lambda i, t: [
            "run",
            "cosmoflow",
            "--data",
            str(i.data),
            "--out",
            str(i.root / "o"),
            "--local-dir",
            t,
            "--dry-run",
        ],
        _data_targets,
        "--local-dir",
    ),
    ("run", "--json"): Case(
        lambda i, t: [
            "run",
            "cosmoflow",
            "--data",
            str(i.data),
            "--out",
            str(i.root / "o"),
            "--dry-run",
            "--json",
            t,
        ],
        _data_targets,
        "--json",
    ),
    ("run", "--seed-file"): Case(
        lambda i, t: [
            "run",
            "cosmoflow",
            "--data",
            str(i.data),
            "--out",
            str(i.root / "o"),
            "--index",
            "0",
            "--seed-file",
            t,
        ],
        _data_targets,
        "--seed-file",
    ),
    ("check", "--json"): Case(
        lambda i, t: ["check", str(i.sub), "--json", t], _file_targets(".json"), "--json"
    ),
    ("check", "--csv"): Case(lambda i, t: ["check", str(i.sub), "--csv", t], _file_targets(".csv"), "--csv"),
    ("check", "--report"): Case(
        lambda i, t: ["check", str(i.sub), "--report", t], _folder_targets, "--report"
    ),
    ("variability", "--plot"): Case(
        lambda i, t: ["variability", str(i.sub), "--plot", t], _file_targets(".png"), "--plot"
    ),
    ("report", "--plot"): Case(
        lambda i, t: ["report", str(i.sub), "--plot", t], _file_targets(".png"), "--plot"
    ),
    ("report", "--json"): Case(
        lambda i, t: ["report", str(i.sub), "--json", t], _file_targets(".json"), "--json"
    ),
    ("report", "--csv"): Case(
        lambda i, t: ["report", str(i.sub), "--csv", t], _file_targets(".csv"), "--csv"
    ),
    ("results add", "--db"): Case(
        lambda i, t: ["results", "add", str(i.sub), "--db", t], _file_targets(".sqlite"), ""
    ),
    ("results compare", "--report"): Case(
        lambda i, t: ["results", "compare", "x", "--db", str(i.log), "--report", t],
        lambda i: [i.log],
        "--report",
    ),
}

NOT_YET = {}
"""Outputs their commands do not refuse yet (other owners' files): kept here so that the walk
still tries them, and says so, until they do."""


def test_every_path_option_is_an_input_or_a_tried_output() -> None:
    """A new path option fails here until it is classified (and, if an output, tried below)."""
    assert path_options(build_parser()) == INPUTS | set(OUTPUTS)


@pytest.mark.parametrize("key", sorted(OUTPUTS), ids=lambda key: " ".join(key))
def test_an_output_on_an_input_is_one_line_and_leaves_the_input_alone(
    key: tuple[str, str], inputs: Inputs, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    if key in NOT_YET:
        request.applymarker(pytest.mark.xfail(reason=NOT_YET[key], strict=False))
    case = OUTPUTS[key]
    before = trees(*inputs.all())
    for target in case.targets(inputs):
        code = main(case.argv(inputs, str(target)))
        err = capsys.readouterr().err
        assert code == 2, f"{key} {target}: exit {code}"
        assert err.count("\n") == 1 and err.startswith("mlhpc: error: "), err
        assert case.names in err, err
        assert trees(*inputs.all()) == before, f"{key} {target} changed an input"


# ---------------------------------------------------------------- the guard, against random paths

BASES = (
    "input",
    "input/sub",
    "input/sub/result_0.txt",
    "input/systems.json",
    ".",
    "sibling",
    "sibling/old.png",
    "sibling/notes.txt",
    "link-to-input",
    "link-to-file",
    "dangling-into-input",
    "hard.png",
    "fifo.png",
)
TAILS = st.lists(
    st.sampled_from(["a", "..", ".", "new.png", "sub", "result_0.txt", "link-to-input"]), max_size=4
)


def hostile_tree(root: Path) -> Path:
    """An input folder and, around it, the ways a path can reach into it."""
    inp = root / "input"
    (inp / "sub").mkdir(parents=True)
    (inp / "sub" / "result_0.txt").write_bytes(b":::MLLOG a result\n")
    (inp / "systems.json").write_bytes(b'{"a": 1}\n')
    (root / "sibling").mkdir()
    (root / "sibling" / "old.png").write_bytes(b"\x89PNG old")
    (root / "sibling" / "notes.txt").write_bytes(b"notes")
    (root / "link-to-input").symlink_to(inp)
    (inp / "sub" / "link-to-input").symlink_to(inp)
    (root / "link-to-file").symlink_to(inp / "sub" / "result_0.txt")
    (root / "dangling-into-input").symlink_to(inp / "new.png")
    os.link(inp / "sub" / "result_0.txt", root / "hard.png")
    os.mkfifo(root / "fifo.png")
    return inp


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(BASES), tail=TAILS)
def test_the_guard_allows_only_writes_that_leave_the_input_alone(base: str, tail: list[str]) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        inp = hostile_tree(root)
        output = root.joinpath(base, *tail)
        before = trees(inp)
        try:
            where = refuse_output_over_inputs(output, [inp], "--plot", suffixes=(".png",))
        except ConfigError as refusal:
            message = str(refusal)
            assert "\n" not in message and message.startswith(f"--plot {output} ")
            real = Path(os.path.realpath(output))
            exists_wrong = real.exists() and (
                not real.is_file()
                or real.suffix != ".png"
                or real.stat().st_ino == (inp / "sub" / "result_0.txt").stat().st_ino
            )
            assert _under(real, inp.resolve()) or exists_wrong, message
            return
        # allowed: the write really leaves every byte of the input as it was
        with contextlib.suppress(OSError):  # e.g. a parent that is a file: the write fails
            atomic_write_bytes(where, b"\x89PNG new")
        assert trees(inp) == before
        if not tail or ".." not in tail:  # a path that stays below an input base is never allowed
            assert not base.startswith(("input", "link-to-", "dangling")), output


@pytest.mark.parametrize(
    ("relative", "refused"),
    [
        ("input", True),  # equal
        ("input/sub/new.png", True),  # inside
        ("link-to-input/new.png", True),  # via a symlink
        ("dangling-into-input", True),  # a link that would be followed into it
        ("hard.png", False),  # a hard link into an input folder: replaced by a rename, the input kept
        ("new.png", False),  # the parent folder
        ("sibling/new.png", False),  # a sibling
        ("sibling/old.png", False),  # an existing PNG elsewhere is replaced
        ("sibling/notes.txt", True),  # an existing file of another kind is not
        ("input/sub/../../sibling/new.png", False),  # out again, on the real tree
        ("input/sub/link-to-input/../new.png", False),  # '..' after the link: beside the input
    ],
)
def test_the_guard_on_named_paths(tmp_path: Path, relative: str, refused: bool) -> None:
    inp = hostile_tree(tmp_path)
    output = tmp_path / relative
    if refused:
        with pytest.raises(ConfigError, match=r"^--plot "):
            refuse_output_over_inputs(output, [inp], "--plot", suffixes=(".png",))
    else:
        where = refuse_output_over_inputs(output, [inp], "--plot", suffixes=(".png",))
        assert not _under(where, inp.resolve())


def test_a_folder_output_may_hold_the_input_but_not_lie_in_it(tmp_path: Path) -> None:
    inp = hostile_tree(tmp_path)
    assert refuse_output_over_inputs(tmp_path, [inp], "--out", folder=True) == tmp_path.resolve()
    with pytest.raises(ConfigError, match="is inside the input"):
        refuse_output_over_inputs(inp / "out", [inp], "--out", folder=True)
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        refuse_output_over_inputs(tmp_path / "hard.png", [inp], "--out", folder=True)


# ---------------------------------------------------------------- marked folders


def test_a_marked_folder_is_fresh_private_and_removed_only_while_ours(tmp_path: Path) -> None:
    first, second = make_marked_dir(tmp_path, "work-"), make_marked_dir(tmp_path, "work-")
    assert first.path != second.path and first.token != second.token
    assert first.path.stat().st_mode & 0o777 == 0o700
    (first.path / "dest").mkdir()
    assert not remove_marked_dir(MadeDir(first.path, second.token))  # another run's token
    assert remove_marked_dir(first) and not first.path.exists()
    # the folder replaced by a link to a user's folder (with a copied marker): left alone
    users = tmp_path / "users"
    users.mkdir()
    (users / MADE_MARKER).write_text(second.token + "\n")
    (users / "keep.txt").write_text("mine")
    shutil.rmtree(second.path)
    second.path.symlink_to(users)
    assert not remove_marked_dir(second)
    assert (users / "keep.txt").read_text() == "mine"
    # the marker replaced by a FIFO: not read (no hang), not removed
    third = make_marked_dir(tmp_path, "work-")
    (third.path / MADE_MARKER).unlink()
    os.mkfifo(third.path / MADE_MARKER)
    assert not remove_marked_dir(third) and third.path.is_dir()


# ---------------------------------------------------------------- outputs over another command's records


def foreign_records(root: Path) -> dict[str, Path]:
    """One file of each kind another mlhpc command writes, in a campaign that is no input here."""
    import sqlite3

    other = root / "other"
    systems = other / "mlhpc" / "systems"
    systems.mkdir(parents=True)
    files = {
        "campaign.json": b'{"submitter": "mlhpc", "ruleset": "3.0.0", "seeds": [1, 2]}\n',
        "mlhpc/systems/sys.json": b'{"submitter": "mlhpc", "system_name": "sys", "number_of_nodes": "1"}\n',
        "result_0.txt": b':::MLLOG {"key": "run_start"}\n',
        "manifest.json": b'{"algorithm": "xxh64", "files": [\n]}\n',
        ".mlhpc-made-by": b"123-abc\n",
        "check.json": b'{\n  "format": "mlhpc check",\n  "entries": []\n}\n',
        "page.html": b'<!DOCTYPE html><html><head><meta name="generator" content="mlhpc check"></head></html>\n',
    }
    found = {}
    for name, data in files.items():
        (other / name).write_bytes(data)
        found[name] = other / name
    with contextlib.closing(sqlite3.connect(other / "results.sqlite")) as db:
        db.execute("CREATE TABLE entries (id INTEGER)")
        db.commit()
    found["results.sqlite"] = other / "results.sqlite"
    return found


OWN = {("check", "--json"): "check.json", ("check", "--report"): "page.html"}
"""The foreign file that is this option's own kind (replacing it is allowed)."""
FILE_OUTPUTS = sorted(
    key for key in OUTPUTS if key[1] not in {"--report", "--out", "--local-dir", "--scratch", "dest"}
)


@pytest.mark.parametrize("key", FILE_OUTPUTS, ids=lambda key: " ".join(key))
def test_a_file_output_never_replaces_another_commands_record(
    key: tuple[str, str], inputs: Inputs, capsys: pytest.CaptureFixture[str]
) -> None:
    records = foreign_records(inputs.root)
    before = trees(inputs.root / "other")
    for name, target in records.items():
        if OWN.get(key) == name:
            continue
        code = main(OUTPUTS[key].argv(inputs, str(target)))
        err = capsys.readouterr().err
        assert code == 2, f"{key} over {name}: exit {code}"
        assert err.count("\n") == 1 and err.startswith("mlhpc: error: "), err
        assert trees(inputs.root / "other") == before, f"{key} replaced {name}"


@pytest.mark.parametrize("key", [("check", "--report"), ("results compare", "--report")], ids=" ".join)
def test_a_page_output_never_replaces_a_foreign_index_html(
    key: tuple[str, str], inputs: Inputs, capsys: pytest.CaptureFixture[str]
) -> None:
    records = foreign_records(inputs.root)
    site = inputs.root / "site"
    site.mkdir()
    for name in ("campaign.json", "results.sqlite", "page.html", "check.json"):
        if key == ("check", "--report") and name == "page.html":
            continue  # check's own page: replaced by design
        shutil.copy(records[name], site / "index.html")
        before = trees(site)
        code = main(OUTPUTS[key].argv(inputs, str(site)))
        err = capsys.readouterr().err
        assert code == 2, f"{key} over index.html={name}: exit {code}"
        assert "index.html" in err and err.count("\n") == 1, err
        assert trees(site) == before
