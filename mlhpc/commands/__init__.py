"""Every `mlhpc` subcommand, one module each in one pattern: `add_parser(sub, command)` adds its
options (`command` is the one about to run, so heavy options load only for it) and sets its handler,
`_<name>(args) -> int`, which imports the work lazily. `mlhpc.cli` lists the modules and runs main's
error handling; nothing here imports it. This module holds what the commands share."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from mlhpc.common.errors import ConfigError
from mlhpc.common.printable import shown
from mlhpc.common.vocabulary import RULESETS as RULESETS  # the choices for --ruleset


def add_command(
    sub: argparse._SubParsersAction, name: str, text: str, example: str
) -> argparse.ArgumentParser:
    """A subcommand with its one-line help and a worked example under --help."""
    return sub.add_parser(
        name,
        help=text,
        description=text,
        epilog=f"example:\n  {example.replace(chr(10), chr(10) + '  ')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def size_argument(text: str) -> int:
    """--allow-size's value (`9.9TB`, `500GB`, `4GiB`) in bytes, for argparse's `type=`."""
    from mlhpc.dataset_size import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


MAX_THREADS = 1024
"""--workers: one rank's copy or hash threads; past this they only contend (and each holds a buffer)."""
# Counts that start local processes: bounded by this machine (campaign/machine.py), so a
# `--processes 100000` is one line before anything forks, not the pid limit and a traceback.
_PROCESS_FLAGS = frozenset({"--processes"})


def refuse_bad_counts(command: str, counts: dict[str, int | None]) -> None:
    """Refuse a count below 1 (`--workers 0`), or one over what this machine holds (`--processes`
    over its CPUs x 4, `--workers` over MAX_THREADS), before any work, not deep in a pool."""
    for flag, value in counts.items():
        if value is None:
            continue
        if value < 1:
            raise ConfigError(f"mlhpc {command} {flag} {value}: it must be at least 1; pass {flag} 1 or more")
        most, why = _most(flag)
        if most is not None and value > most:
            raise ConfigError(
                f"mlhpc {command} {flag} {value}: more than {why} ({most}); pass {flag} {most} or fewer"
            )


def _most(flag: str) -> tuple[int | None, str]:
    """The machine's bound on the count `flag` gives, and what it comes from."""
    if flag in _PROCESS_FLAGS:
        from mlhpc.campaign.machine import RANKS_PER_CPU
        from mlhpc.common.cluster.threads import cpu_budget

        cpus = cpu_budget(look_s=0).cpus
        return cpus * RANKS_PER_CPU, f"this machine's {cpus} CPUs x {RANKS_PER_CPU} processes"
    if flag == "--workers":
        return MAX_THREADS, "the threads one rank can use"
    return None, ""


ALLOW_SIZE_HELP = (
    "generate a synthetic dataset over 4 GiB up to this size, e.g. 9.9TB (without it, a larger one "
    "is refused, naming its size and the free space)"
)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, `mlhpc: error: <command>: <what>; <fix>`, and
    exit 2 (the README's promise), instead of an 18-line usage block. Every subcommand's parser
    is one too: add_subparsers makes its children of the parent's class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: `mlhpc run --seed 3` would silently mean --seeds 3 (three runs).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse quotes the user's words (unrecognized arguments, a bad choice): shown as data,
        # so an escape code or a bidi mark prints as text, not as an instruction to the terminal
        line = f"{self.prog}: {message}; {self.fix_for(message)}"
        self.exit(2, f"mlhpc: error: {shown(' '.join(line.split()))}\n")

    def fix_for(self, message: str) -> str:
        """What to do about argparse's `message`, ending with where the whole story is."""
        import difflib  # here, on a usage error only: `--help` and a good command line start without it

        more = f"see {self.prog} --help"
        if message.startswith("the following arguments are required"):
            example = self.first_example()
            return f"e.g. {example} ({more})" if example else more
        if message.startswith("unrecognized arguments"):
            words = message.split(":", 1)[1].split()
            if not words:  # an empty argument ('')
                return more
            word = words[0]
            close = difflib.get_close_matches(word.split("=")[0], self.option_words(), n=1, cutoff=0.75)
            if close:
                return f"did you mean {close[0]}? ({more})"
            if not word.startswith("-") and any(a.dest == "overrides" for a in self._actions):
                return f"a config override is key=value, e.g. loop.max_epochs=20 ({more})"
            return more
        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)", message)
        if choice:
            known = [c.strip(" '") for c in choice.group(2).split(",")]
            close = difflib.get_close_matches(choice.group(1), known, n=1)
            return f"did you mean {close[0]}? ({more})" if close else f"pass one of those ({more})"
        if "invalid int value" in message:
            return f"pass a whole number ({more})"
        if "invalid float value" in message:
            return f"pass a number ({more})"
        return more

    def first_example(self) -> str | None:
        """The first line of the `example:` block under --help (see add_command)."""
        lines = (self.epilog or "").splitlines()
        return lines[1].strip() if len(lines) > 1 and lines[0] == "example:" else None

    def option_words(self) -> list[str]:
        return [option for action in self._actions for option in action.option_strings]
