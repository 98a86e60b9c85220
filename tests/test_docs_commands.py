"""Every `mlhpc` command shown in README.md and docs/*.md parses against the real command line.

A renamed or removed subcommand or flag breaks this test, not the user who copies the snippet.
Nothing is run: each command goes through `build_parser(...).parse_known_args`, as `mlhpc.cli.main`
does, and the leftovers must be `key=value` overrides of a command that takes them.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlhpc.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "shell-session"}
"""Fenced blocks read as shell; ```text, ```yaml, ```python and the like are not commands."""

LAUNCHERS = {
    "torchrun",
    "srun",
    "mpirun",
    "mpiexec",
    "horovodrun",
    "python",
    "python3",
    "docker",
    "podman",
    "apptainer",
    "singularity",
    "timeout",
    "exec",
}
"""Programs that start `mlhpc` further along their line: `srun -N 2 mlhpc run ...`."""

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    text: str
    argv: list[str]
    """The words after `mlhpc`."""

    def where(self, root: Path = ROOT) -> str:
        return f"{self.path.relative_to(root)}:{self.line}: {self.text}"


def shell_blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of every fenced block."""
    blocks, inside, language, start, lines = [], False, "", 0, []
    for number, line in enumerate(text.splitlines(), start=1):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
        if fence and not inside:
            inside, language, start, lines = True, fence.group(2).lower(), number + 1, []
        elif fence and inside:
            blocks.append((start, language, lines))
            inside = False
        elif inside:
            lines.append(line)
    return blocks


def logical_lines(start: int, language: str, lines: list[str]) -> list[tuple[int, str]]:
    """Backslash-continued lines joined, each with the number of its first line; in a console
    block only the `$ ` prompt lines (the rest is output)."""
    joined: list[tuple[int, str]] = []
    pending, first = "", 0
    for offset, raw in enumerate(lines):
        line = raw.strip()
        if not pending:
            if language in {"console", "shell-session"}:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            first = start + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append((first, pending + line))
        pending = ""
    if pending:
        joined.append((first, pending))
    return joined


def mlhpc_words(words: list[str]) -> list[str] | None:
    """The arguments given to `mlhpc` in one simple command, or None when it does not run mlhpc."""
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program == "mlhpc":
        return words[1:]
    if program not in LAUNCHERS and not program.startswith("python"):
        return None
    for i, word in enumerate(words[1:], start=1):
        if word == "-m" and i + 1 < len(words) and words[i + 1] == "mlhpc":
            return words[i + 2 :]
        if word.rsplit("/", 1)[-1] == "mlhpc" or word.endswith((".sif", "mlhpc:latest")):
            return words[i + 1 :]
    return None


def commands_in(path: Path, text: str | None = None) -> list[DocCommand]:
    """Every `mlhpc` command in the page's shell blocks (`text` stands in for the file's own)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    found = []
    for start, language, lines in shell_blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        for number, line in logical_lines(start, language, lines):
            try:
                words = shlex.split(line, comments=True)
            except ValueError as e:
                raise AssertionError(f"{path.name}:{number}: not shell ({e}): {line}") from e
            command: list[str] = []
            for word in [*words, ";"]:
                if word not in SEPARATORS:
                    command.append(word)
                    continue
                argv = mlhpc_words(command)
                if argv is not None:
                    found.append(DocCommand(path, number, line, argv))
                command = []
    return found


def parse_problem(argv: list[str]) -> str | None:
    """Why `mlhpc ARGV` would be refused before it runs, or None when it parses."""
    if not argv:
        return "no subcommand"
    if argv in (["--help"], ["-h"], ["--version"]):
        return None
    parser = build_parser(next((w for w in argv if not w.startswith("-")), None))
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser.parse_known_args(argv)
    except SystemExit as e:
        if e.code == 0:  # --help
            return None
        return errors.getvalue().strip().splitlines()[-1] if errors.getvalue().strip() else "refused"
    # As mlhpc.cli.main: leftovers are key=value overrides, and only where the command takes them.
    wrong = [w for w in extra if w.startswith("-") or "=" not in w or not hasattr(args, "overrides")]
    return f"unrecognized arguments: {' '.join(wrong)}" if wrong else None


def test_the_docs_show_commands() -> None:
    """The pages hold commands at all: a parser that found none would pass everything."""
    per_file = {path.name: len(commands_in(path)) for path in DOCS}
    assert per_file["README.md"] >= 3, per_file
    assert sum(per_file.values()) >= 30, per_file
    launched = [c.text for path in DOCS for c in commands_in(path)]
    assert any(t.startswith("srun") for t in launched) and any(t.startswith("torchrun") for t in launched)


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_mlhpc_command_in_the_docs_parses(path: Path) -> None:
    problems = [f"{c.where()}\n    -> {why}" for c in commands_in(path) if (why := parse_problem(c.argv))]
    assert not problems, "commands in the docs that `mlhpc` would refuse:\n" + "\n".join(problems)


def test_a_made_up_flag_in_a_snippet_is_reported(tmp_path: Path) -> None:
    page = tmp_path / "PAGE.md"
    page.write_text(
        "Text.\n\n```bash\nmlhpc check runs/mlhpc --json s.json   # fine\n"
        "srun -N 2 --ntasks-per-node=4 mlhpc run cosmoflow --out runs/ \\\n"
        "    --seeds 10 --no-such-flag loop.max_epochs=3\n"
        "mlhpc stagger SRC DEST\n```\n\n```text\nmlhpc run --not-a-command-block\n```\n",
        encoding="utf-8",
    )
    commands = commands_in(page)
    assert [(c.line, c.argv[0]) for c in commands] == [(4, "check"), (5, "run"), (7, "stagger")]
    problems = [parse_problem(c.argv) for c in commands]
    assert problems[0] is None
    assert problems[1] == "unrecognized arguments: --no-such-flag"
    assert "invalid choice: 'stagger'" in (problems[2] or "")
    assert commands[1].where(tmp_path).startswith("PAGE.md:5: srun -N 2 --ntasks-per-node=4 mlhpc run")


def test_launcher_prefixes_and_shell_syntax_are_read() -> None:
    def argv(line: str) -> list[list[str]]:
        return [c.argv for c in commands_in(ROOT / "README.md", f"```bash\n{line}\n```\n")]

    assert argv("torchrun --standalone --nproc-per-node=2 -m mlhpc run cosmoflow --out r/") == [
        ["run", "cosmoflow", "--out", "r/"]
    ]
    assert argv("OMPI_X=1 mpirun -np 2 -x PATH mlhpc stage a b  # comment") == [["stage", "a", "b"]]
    assert argv("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/mlhpc check d") == [
        ["check", "d"]
    ]
    assert argv("sbatch scripts/slurm/train.sbatch") == []
    assert parse_problem(["run", "cosmoflow", "--out", "r/", "loop.max_epochs=3"]) is None
    assert parse_problem(["check", "d", "loop.max_epochs=3"]) == "unrecognized arguments: loop.max_epochs=3"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    """README's "two commands": the second is the line `.ci/run` runs (the two are kept in sync)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [lines for _, language, lines in shell_blocks(section) if language == "bash"]
    assert len(blocks) == 2 and all(len(lines) == 1 for lines in blocks), blocks
    install_and_run, install_and_test = blocks[0][0], blocks[1][0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    marked = ci.split("# --- the README's test command", 1)[1].split("\n# ---", 1)[0]
    assert install_and_test in marked.splitlines(), f".ci/run does not run the README's {install_and_test!r}"
    assert install_and_run.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")


def test_every_relative_link_in_the_docs_leads_somewhere() -> None:
    """Links and images to files of the repository (a moved page or a missing picture fails here)."""
    missing = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                if not (path.parent / target.split("#", 1)[0]).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)
