"""A leftover word is refused by the parser of the (sub)command that ran, found by walking the
subparsers (no command named in cli.py): `mlhpc results add: unrecognized arguments ...`."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from mlhpc.cli import COMMANDS, build_parser, command_name, main


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["results", "add", "x", "--bogus"], "mlhpc results add"),
        (["results", "list", "--bogus"], "mlhpc results list"),
        (["check", "x", "--bogus"], "mlhpc check"),
        (["report", "x", "stray"], "mlhpc report"),
    ],
)
def test_a_leftover_is_refused_by_the_innermost_command(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"mlhpc: error: {prog}: unrecognized arguments: {argv[-1]};"), err


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("module", COMMANDS, ids=command_name)
def test_the_parser_for_one_command_holds_it_alone_and_helps_the_same(module: ModuleType) -> None:
    """`mlhpc stage` builds stage's parser only (a fast start); its --help is the whole parser's."""
    name = command_name(module)
    alone = subcommands(build_parser(name))
    assert list(alone) == [name]
    assert alone[name].format_help() == subcommands(build_parser())[name].format_help()


def test_a_typo_or_a_top_level_option_first_gets_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    every = [command_name(m) for m in COMMANDS]
    assert list(subcommands(build_parser("stag"))) == every  # its error lists them all
    with pytest.raises(SystemExit) as stopped:
        main(["-h", "stage"])  # the top-level help, not stage's
    out = capsys.readouterr().out
    assert stopped.value.code == 0 and out.startswith("usage: mlhpc [-h]"), out
    assert all(name in out for name in every), out
