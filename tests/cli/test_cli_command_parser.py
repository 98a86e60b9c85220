"""A leftover word is refused by the parser of the (sub)command that ran, found by walking the
subparsers (no command named in cli.py): `mlhpc results add: unrecognized arguments ...`."""

from __future__ import annotations

import pytest

from mlhpc.cli import main


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
