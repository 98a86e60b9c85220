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

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GUIDES = [
    *DOCS,
    *sorted((ROOT / "benchmarks").glob("*/README.md")),
    *sorted((ROOT / "scripts").rglob("*.md")),
]
"""Pages whose commands a user copies (perf/RESULTS.md records commands as they were run)."""
PAGES = [*GUIDES, *sorted((ROOT / "perf").glob("*.md"))]
"""Every page a user reads: their links, anchors and named pages must lead somewhere."""

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

IMAGE_MAKING = {"build", "import", "pull"}
"""`apptainer build`, `docker build ...`: a launcher's words that make an image, not run mlhpc."""

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
    if len(words) > 1 and words[1] in IMAGE_MAKING:
        return None
    for i, word in enumerate(words[1:], start=1):
        if word == "-m" and i + 1 < len(words) and words[i + 1] == "mlhpc":
            return words[i + 2 :]
        if word.rsplit("/", 1)[-1] == "mlhpc":
            return words[i + 1 :]
        if not word.startswith("-") and word.endswith((".sif", "mlhpc:latest")):
            # `run IMAGE ARGS` runs the image's entry point (mlhpc); `exec IMAGE mlhpc ARGS` names it
            rest = words[i + 1 :]
            return rest[1:] if rest and rest[0].rsplit("/", 1)[-1] == "mlhpc" else rest
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


@pytest.mark.parametrize("path", GUIDES, ids=[str(p.relative_to(ROOT)) for p in GUIDES])
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
    # The CPU build of torch goes in command 1 itself, in pyproject's ranges, before `pip install -e .`
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pins = [f"'{pin}'" for pin in re.findall(r'"(torch(?:vision)?>=[^"]+)"', pyproject)]
    # --extra-index-url: an unreachable index is a warning and PyPI still serves; --index-url would fail
    cpu = f".venv/bin/pip install {' '.join(pins)} --extra-index-url https://download.pytorch.org/whl/cpu"
    assert len(pins) == 2 and install_and_run.startswith(f"python3 -m venv .venv && {cpu} && "), (
        install_and_run
    )
    assert install_and_run.endswith(
        " && .venv/bin/pip install -e . && .venv/bin/mlhpc run cosmoflow --config mini --seeds 10 --out runs/"
    )


def test_every_staged_folder_is_made_first_in_its_block() -> None:
    """A walkthrough (a block of several commands) that stages a relative folder (`mlhpc stage
    data/cosmoflow ...`) first makes it (`mlhpc generate ... --out data/cosmoflow`);
    docs/MULTINODE.md once staged one nothing made. A one-line example names the user's own data."""
    missing = []
    for path in GUIDES:
        for start, language, lines in shell_blocks(path.read_text(encoding="utf-8")):
            if language not in SHELL_LANGUAGES or len(lines) < 3:
                continue
            made: set[str] = set()
            for offset, line in enumerate(lines):
                try:
                    words = shlex.split(line, comments=True)
                except ValueError:  # a line continued with a backslash
                    words = line.split()
                if "generate" in words and "--out" in words:
                    made.add(words[words.index("--out") + 1].rstrip("/"))
                if "stage" in words and "mlhpc" in words[: words.index("stage")]:
                    source = words[words.index("stage") + 1].rstrip("/")
                    if not source.startswith(("/", "$", "-", "<")) and source not in made:
                        missing.append(f"{path.relative_to(ROOT)}:{start + offset}: {line.strip()}")
    assert not missing, "folders staged that the block never makes:\n" + "\n".join(missing)


def test_benchmarks_quotes_the_latest_deepcam_mini_figures() -> None:
    """docs/BENCHMARKS.md says what perf/RESULTS.md's latest DeepCAM mini record measured."""
    page = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    results = (ROOT / "perf" / "RESULTS.md").read_text(encoding="utf-8")
    latest = results.split("the DeepCAM mini holds on 20 random seeds", 1)[1].split("\n## ", 1)[0]
    assert "not yet on others" not in page and "holds on random seeds" in page
    for figure in ("4-9", "5.6", "21 %"):
        assert f"**{figure}**" in latest and figure in page, figure


@pytest.mark.parametrize(
    "words", [["results", "add"], ["results", "list"], ["results", "compare"], ["status"]]
)
def test_results_and_status_help_show_an_example_that_parses(words: list[str]) -> None:
    """`--help` ends with a worked example, and that example parses against the command line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser(words[0]).parse_args([*words, "--help"])
    text = out.getvalue()
    assert "example:" in text, text
    example = text.split("example:", 1)[1].strip().splitlines()[0].strip()
    argv = shlex.split(example)
    assert argv[: 1 + len(words)] == ["mlhpc", *words] and parse_problem(argv[1:]) is None, example


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(number, line) of the page outside fenced blocks: a code sample's `](x)` is not a link."""
    inside_at = {
        n for start, _, lines in shell_blocks(text) for n in range(start - 1, start + len(lines) + 1)
    }
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if n not in inside_at]


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    anchors: set[str] = set()
    for _, line in prose_lines(text):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in anchors:
            n += 1
            unique = f"{slug}-{n}"
        anchors.add(unique)
    return anchors


def anchors_of(page: Path) -> set[str]:
    return heading_anchors(page.read_text(encoding="utf-8"))


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links and images of one page whose file, or whose #anchor in it, does not exist;
    each named by the page's path under `root`."""
    problems = []
    text = path.read_text(encoding="utf-8")
    for number, line in prose_lines(text):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not linked.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors_of(linked):
                problems.append(f"{where} (no heading #{anchor} in {linked.name})")
    return problems


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_in_the_docs_leads_somewhere(path: Path) -> None:
    """Links and images to files of the repository, and the headings they point at (a moved page,
    a renamed section or a missing picture fails here)."""
    problems = link_problems(path)
    assert not problems, "links that lead nowhere:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_page_named_in_code_exists(path: Path) -> None:
    """A page named as `docs/X.md` rather than linked (scripts/slurm/README.md once named a
    docs/LAUNCHING.md that never existed)."""
    named = re.compile(r"`((?:docs|benchmarks|scripts|perf)/[\w./-]*\.md)(?:#[\w-]*)?`")
    text = path.read_text(encoding="utf-8")
    missing = [
        f"{path.relative_to(ROOT)}:{number}: {page}"
        for number, line in prose_lines(text)
        for page in named.findall(line)
        if not (ROOT / page).exists()
    ]
    assert not missing, "pages named that do not exist:\n" + "\n".join(missing)


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    """The link check itself finds a missing file, a missing heading and a repeated heading's
    numbered anchor, and ignores links inside code blocks."""
    (tmp_path / "OTHER.md").write_text("# Other\n\n## Runs, resume and `--index`\n\n## Runs\n\n## Runs\n")
    page = tmp_path / "PAGE.md"
    page.write_text(
        "[a](OTHER.md#runs-resume-and---index) [b](OTHER.md#runs-1) [c](OTHER.md#gone)\n"
        "[d](MISSING.md) [e](#page) [f](https://example.org/x)\n\n# Page\n\n"
        "```bash\necho '[g](NOT_A_LINK.md)'\n```\n",
        encoding="utf-8",
    )
    problems = link_problems(page, tmp_path)
    assert problems == [
        "PAGE.md:1: OTHER.md#gone (no heading #gone in OTHER.md)",
        "PAGE.md:2: MISSING.md (no such file)",
    ], problems
