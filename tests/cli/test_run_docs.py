"""`mlhpc run --help`, the campaign file and docs/RUNNING.md agree: every flag of the parser is in
the page's options table and every flag the table names is the parser's, and the campaign file the
page shows is what mlhpc writes (read back and written again, it is the same JSON).
tests/cli/test_docs_commands.py parses every command the docs show."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from mlhpc.campaign.io import read_campaign_file
from mlhpc.campaign.plan import CAMPAIGN_FORMAT
from mlhpc.cli import build_parser

RUNNING = Path(__file__).resolve().parents[2] / "docs" / "RUNNING.md"
TABLE = "## Every `mlhpc run` option"


def run_flags() -> set[str]:
    """Every long option of `mlhpc run`, --help aside."""
    parser = build_parser("run")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {o for a in run._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def table_flags(text: str) -> list[str]:
    """The flags the options table's rows name, in order."""
    section = text.split(TABLE, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(--[a-z][a-z-]*)` \|", section, re.MULTILINE)


def test_every_run_flag_is_in_the_options_table_and_no_other() -> None:
    documented = table_flags(RUNNING.read_text())
    assert len(documented) == len(set(documented)), "a flag listed twice"
    flags = run_flags()
    assert not flags - set(documented), (
        f"add these to docs/RUNNING.md's options table: {flags - set(documented)}"
    )
    assert not set(documented) - flags, f"not `mlhpc run` flags: {set(documented) - flags}"


def test_the_table_check_fails_on_a_missing_or_made_up_row() -> None:
    text = RUNNING.read_text()
    dropped = text.replace("| `--durable` |", "| durable |")
    made_up = text.replace("| `--durable` |", "| `--durable` |\n| `--turbo` | x |")
    assert "--durable" not in table_flags(dropped) and "--turbo" in table_flags(made_up)
    assert run_flags() - set(table_flags(dropped)) == {"--durable"}
    assert set(table_flags(made_up)) - run_flags() == {"--turbo"}


def test_the_campaign_file_the_docs_show_is_what_mlhpc_writes(tmp_path: Path) -> None:
    blocks = re.findall(r"```json\n(.*?)```", RUNNING.read_text(), re.DOTALL)
    (shown,) = [json.loads(b) for b in blocks if '"mlhpc_campaign"' in b]
    assert shown["mlhpc_campaign"] == CAMPAIGN_FORMAT
    path = tmp_path / "campaign.json"
    path.write_text(json.dumps(shown))
    read = read_campaign_file(path)
    assert read is not None and read.to_json() == shown
