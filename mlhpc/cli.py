"""The `mlhpc` command: the top parser, the list of subcommands (each a module in
mlhpc/commands/ with `add_parser` and its handler) and main's error handling."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from mlhpc import __version__
from mlhpc.commands import (
    OneLineParser,
    characterize,
    check,
    doctor,
    generate,
    manifest,
    report,
    results,
    run,
    stage,
    stage_bench,
    status,
    variability,
    verify,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

# Every subcommand, in `mlhpc --help`'s order. Each module's add_parser(sub, command) adds its
# options (the heavy ones only when `command` is it) and sets handler=_<name>.
COMMANDS = (
    generate,
    stage,
    manifest,
    verify,
    stage_bench,
    run,
    status,
    doctor,
    check,
    variability,
    report,
    characterize,
    results,
)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # The command is the first word; after a top-level option (`mlhpc -h stage`) the whole parser.
    parser = build_parser(words[0] if words and not words[0].startswith("-") else None)
    # key=value overrides may come before or after options, so collect the leftovers here.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(item.startswith("-") or "=" not in item for item in extra):
            _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    args.argv = list(sys.argv[1:] if argv is None else argv)
    # Imported once the words parsed: `--help` and a usage error need neither logging nor signals.
    import signal

    from mlhpc.common.cluster.termination import (
        Terminated,
        WorkerKilled,
        ignore_further_stops,
        is_worker_death,
        sigterm_raises,
        worker_death_line,
    )
    from mlhpc.common.display.debug_log import configure_console
    from mlhpc.common.errors import MlhpcError

    debug = bool(os.environ.get("MLHPC_DEBUG"))  # MLHPC_DEBUG=1: the traceback instead of one line
    configure_console(debug=debug)  # libraries' warnings: only into a run's debug log (or with debug)
    try:
        with sigterm_raises():
            return int(args.handler(args) or 0)
    except WorkerKilled as e:  # the campaign can go on: the resume line, and its own exit code
        return _worker_killed(str(e), args)
    except MlhpcError as e:
        if debug:
            raise
        return _error(str(e) or type(e).__name__)
    except Terminated as e:  # SIGTERM or SIGHUP
        ignore_further_stops()  # this process is ending: a second stop must not print a traceback
        print(stopped_line(e.word, args), file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        ignore_further_stops()
        print(stopped_line("interrupted", args), file=sys.stderr)
        return 128 + signal.SIGINT
    except RuntimeError as e:  # torch's SIGCHLD handler may report a dead worker outside the loop
        if debug or not is_worker_death(e):
            raise
        return _worker_killed(worker_death_line(e), args)
    except OSError as e:  # the last resort: whatever path a step could not read or write
        if debug:
            raise
        if is_worker_death(e):  # a connection reset in a dead worker's shared-memory handover
            return _worker_killed(worker_death_line(e), args)
        where = f"{e.filename}: " if e.filename is not None else ""
        return _error(f"{where}{e.strerror or e}; check that path (permissions, free space)")


def _worker_killed(line: str, args: argparse.Namespace) -> int:
    from mlhpc.common.cluster.termination import WORKER_KILLED_EXIT, ignore_further_stops

    ignore_further_stops()  # the process is ending, as after a stop
    print(stopped_line(line, args, error=True), file=sys.stderr)
    return WORKER_KILLED_EXIT


def stopped_line(how: str, args: argparse.Namespace, *, error: bool = False) -> str:
    """`mlhpc: interrupted`, and for a run the exact command that finishes it (one line);
    `error`: `mlhpc: error: ...`, `how` passed through `shown` (it may quote torch or a name)."""
    from mlhpc.common.printable import shown

    if error:
        how = "error: " + shown(" ".join(how.split()))
    if getattr(args, "command", None) != "run":
        return f"mlhpc: {how}"
    command = run.resume_command(args, _program())
    if command is None or os.environ.get("RANK", "0") != "0":  # one rank tells it, not every one
        return f"mlhpc: {how}"
    if os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_PROCID"):  # a launcher started this rank
        return f"mlhpc: {how}; to finish the campaign, launch the same way with --resume: {command}"
    return f"mlhpc: {how}; to finish the campaign (finished runs are kept): {command}"


def _program() -> str:
    """How this process was started, as a shell would run it again: `mlhpc` (or the path typed),
    else `python -m mlhpc`."""
    import shlex
    from pathlib import Path

    first = sys.argv[0] if sys.argv else ""
    if Path(first).name == "mlhpc":
        return shlex.quote(first)
    return f"{shlex.quote(sys.executable)} -m mlhpc"


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command that ran, so that its error names it: `mlhpc results add`."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or getattr(args, sub.dest, None) not in sub.choices:
            return parser
        parser = sub.choices[getattr(args, sub.dest)]


def _error(message: str) -> int:
    from mlhpc.common.printable import shown

    line = " ".join((message.strip().splitlines() or [message])[0].split())
    print(f"mlhpc: error: {shown(line)}", file=sys.stderr)  # names in it may come from outside
    return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command` (the one about to run), that command's parser alone:
    `mlhpc stage` neither builds the others' parsers nor imports what their options need (the
    Slurm campaign's words, the benchmark tools). Its --help, its errors and what it parses are the
    same; None or an unknown word (a typo, whose error lists every command) gets them all."""
    parser = OneLineParser(
        prog="mlhpc",
        description="MLPerf-HPC-style time-to-train: generate data, stage it, train to target, check.",
        epilog="example: mlhpc run cosmoflow --config mini --seeds 10 --out runs/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mlhpc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    chosen = [m for m in COMMANDS if command_name(m) == command]
    for module in chosen or COMMANDS:
        module.add_parser(sub, command)
    return parser


def command_name(module: ModuleType) -> str:
    """The word that runs a command module: mlhpc.commands.stage_bench is `stage-bench`."""
    return module.__name__.rpartition(".")[2].replace("_", "-")


if __name__ == "__main__":
    raise SystemExit(main())
