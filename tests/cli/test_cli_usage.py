"""Every usage error of every subcommand is one line on stderr that starts with `mlhpc:`, names
the fix and exits 2 (the README's promise; issue 30). The subcommands are walked from the parser
itself, so a new one is covered without touching this file."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from mlhpc.cli import build_parser, main
from tests.helpers.cli import mlhpc_cli

Command = tuple[str, ...]


def walk(
    parser: argparse.ArgumentParser, path: Command = ()
) -> Iterator[tuple[Command, argparse.ArgumentParser]]:
    """(the words that select it, its parser) for `mlhpc` and every (nested) subcommand."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, (*path, name))


def full_parser(path: Command) -> argparse.ArgumentParser:
    """The parser as `main` builds it for this command (some options exist only for their own)."""
    parser = build_parser(path[0] if path else None)
    return dict(walk(parser))[path]


def has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def required_words(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each required positional and option: enough to reach the option checks."""
    words: list[str] = []
    for action in parser._actions:
        if action.option_strings:
            if action.required:
                words += [action.option_strings[0], "x"]
        elif action.nargs not in ("?", "*", argparse.REMAINDER) and not isinstance(
            action, argparse._SubParsersAction
        ):
            words += ["x"] * (1 if action.nargs in (None, "+") else int(action.nargs))
    return words


def needs_something(parser: argparse.ArgumentParser) -> bool:
    return required_words(parser) != [] or has_subcommands(parser)


COMMANDS = [path for path, _ in walk(build_parser())]
LEAVES = [path for path in COMMANDS if not has_subcommands(full_parser(path))]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """main(argv)'s one stderr line, checked: exit 2, `mlhpc: error:`, the command and a fix."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2, (argv, err)
    lines = err.splitlines()
    assert len(lines) == 1, (argv, err)
    line = lines[0]
    assert line.startswith("mlhpc: error: ") and "Traceback" not in err, (argv, line)
    assert "; " in line and "--help" in line, (argv, line)  # the fix, and where the rest is
    assert out == "", (argv, out)  # no usage block on stdout either
    return line


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path in COMMANDS}
    assert {"", "run", "stage", "generate", "check", "results", "results add", "stage-bench"} <= names


@pytest.mark.parametrize("path", [p for p in COMMANDS if needs_something(full_parser(p))], ids=" ".join)
def test_missing_arguments_are_one_line_with_an_example(
    path: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    line = usage_error(list(path), capsys)
    assert line.startswith(f"mlhpc: error: {' '.join(('mlhpc', *path))}: "), line  # names the command
    if not has_subcommands(full_parser(path)):
        assert "required" in line and "key=value" not in line.split(";")[0], line  # overrides are optional


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_an_unknown_option_is_one_line_with_a_close_match(
    path: Command, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = full_parser(path)
    line = usage_error([*path, *required_words(parser), "--no-such-option"], capsys)
    assert "--no-such-option" in line
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    if options:  # a near miss of a real option is pointed at it
        near = options[0][:-1] + "z" if len(options[0]) > 4 else options[0] + "z"
        hint = usage_error([*path, *required_words(parser), near], capsys)
        assert f"did you mean {options[0]}?" in hint, hint


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_a_bad_choice_or_number_is_one_line(path: Command, capsys: pytest.CaptureFixture[str]) -> None:
    parser = full_parser(path)
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        if action.choices is not None:
            line = usage_error([*path, *required_words(parser), action.option_strings[0], "no-such"], capsys)
            assert "invalid choice" in line and "pass one of those" in line, line
        elif action.type in (int, float):
            line = usage_error([*path, *required_words(parser), action.option_strings[0], "many"], capsys)
            assert "pass a whole number" in line or "pass a number" in line, line


def test_a_misspelt_command_is_pointed_at_the_real_one(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(["rnu", "cosmoflow"], capsys)
    assert "did you mean run?" in line


def test_run_without_arguments_names_what_is_required_and_an_example(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Through the real entry point, as the issue found it: key=value is optional."""
    proc = mlhpc_cli(["run"], tmp_path, 120)
    assert proc.returncode == 2
    assert proc.stderr == (
        "mlhpc: error: mlhpc run: the following arguments are required: benchmark, --out; "
        "e.g. mlhpc run cosmoflow --config mini --seeds 10 --out runs/ (see mlhpc run --help)\n"
    )
    proc = mlhpc_cli(["run", "cosmoflow"], tmp_path, 120)
    assert proc.stderr.count("\n") == 1 and "required: --out;" in proc.stderr
