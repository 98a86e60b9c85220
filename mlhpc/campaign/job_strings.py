"""The one judge of the strings that reach a Slurm job script. What goes on an `#SBATCH` line is
read by sbatch's own parser (it splits on whitespace, reads quotes, backslashes and `#` itself,
blanks `packjob`/`hetjob`) and, in --output, by Slurm's `%` patterns; what goes into the script's
commands is always `shlex.quote`d, so only what no quoting carries (NUL, text that is not UTF-8)
is refused there. A refusal is one line naming the option, the character (as data) and the fix.
Torch-free: the login node checks before it plans, prints or submits."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from mlhpc.common.errors import ConfigError
from mlhpc.common.printable import shown

if TYPE_CHECKING:
    from mlhpc.campaign.options import RunOptions
    from mlhpc.campaign.slurm_graph import SlurmResources

MAX_PATH_BYTES = 4095
"""PATH_MAX less its NUL: a longer path on an #SBATCH line or in a command cannot be opened."""
MAX_WORD_BYTES = 4096
"""Any other #SBATCH value (a partition, an sbatch option)."""

# What sbatch's #SBATCH parser reads itself (src/sbatch/opt.c _get_argument): quotes group,
# a backslash escapes, an unquoted `#` starts a comment. In --output a backslash also turns
# every `%` pattern off, so it is refused rather than escaped.
_SBATCH_SPECIAL = "'\"\\#"
# sbatch blanks these words anywhere on an #SBATCH line (heterogeneous job separators).
_BLANKED = re.compile("packjob|hetjob", re.IGNORECASE)
# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, and the unlimited spellings.
_TIME = re.compile(r"\d{1,9}(:\d{1,2}){0,2}|\d{1,5}-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)


def _named(char: str) -> str:
    """`char` as data, with a word for the ones a reader cannot see."""
    names = {" ": "a space", "\t": "a tab", "\n": "a newline", "\r": "a carriage return", "\x00": "NUL"}
    return names.get(char, _data(char))


def _data(value: str) -> str:
    """`value` quoted as data on one line (escapes for what is unseen), cut to a readable length."""
    text = shown(repr(value))
    return text if len(text) <= 120 else f"{text[:100]}...' ({len(value)} characters)"


def _encodable(option: str, value: str, fix: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"{option} {_data(value)}: its byte {_data(value[e.start])} is not UTF-8, which a job "
            f"script cannot hold; {fix}"
        ) from None


def sbatch_value(option: str, value: str, *, what: str, pattern: bool = False, path: bool = False) -> str:
    """`value` as written after `option=` on an #SBATCH line, so sbatch reads exactly `value`
    back as one argument: every `%` doubled where Slurm expands patterns (`pattern`: --output,
    where `%%` is a literal `%`); refused when sbatch would read it otherwise. `what` names the
    user's option in the one line; `path`: bounded as a path."""
    fix = f"pass {what} without it"
    _encodable(what, value, fix)
    if not value:
        raise ConfigError(f"{what} is empty; pass a value")
    limit = MAX_PATH_BYTES if path else MAX_WORD_BYTES
    if len(value.encode("utf-8")) > limit:
        raise ConfigError(
            f"{what} is {len(value.encode('utf-8'))} bytes long, over {limit}; pass a shorter one"
        )
    for char in value:
        if not char.isprintable() or char.isspace() or char in _SBATCH_SPECIAL:
            raise ConfigError(
                f"{what} {_data(value)} holds {_named(char)}, which sbatch would read on its {option} "
                f"line (a job script's #SBATCH line); {fix}"
            )
    blanked = _BLANKED.search(value)
    if blanked:
        raise ConfigError(
            f"{what} {_data(value)} holds {blanked.group()!r}, which sbatch blanks on an #SBATCH line; {fix}"
        )
    return value.replace("%", "%%") if pattern else value


def sbatch_time(value: str) -> str:
    """--slurm-time as Slurm reads it (01:00:00, 90, 2-00:00:00)."""
    if not _TIME.fullmatch(value):
        raise ConfigError(
            f"--slurm-time {_data(value)} is not a Slurm time limit; pass minutes, HH:MM:SS or "
            "D-HH:MM:SS, e.g. --slurm-time 01:00:00"
        )
    return value


def sbatch_words(arg: str) -> str:
    """One --sbatch-arg: an sbatch option (`--account=abc`, or `-G 2`: words split at single
    spaces, as sbatch splits them), each word one that sbatch reads back as written; `%` kept
    (a user's own --error=%x.err means the pattern)."""
    what = f"--sbatch-arg {_data(arg)}"
    words = arg.split(" ")
    if not arg.startswith("-") or "" in words:
        raise ConfigError(f"{what} is not one sbatch option; write it as --sbatch-arg=--account=abc")
    for word in words:
        sbatch_value("--sbatch-arg", word, what="--sbatch-arg")
        if word.startswith(":"):
            raise ConfigError(
                f"{what}: sbatch stops at a word that starts with ':'; write it as --option=value"
            )
    return arg


def script_word(what: str, value: str) -> str:
    """A word of a job script's commands (shlex-quoted where it is written): NUL and text that
    is not UTF-8 are all that quoting cannot carry."""
    fix = f"pass {what} without it"
    if "\x00" in value:
        raise ConfigError(f"{what} {_data(value)} holds NUL, which no command line can hold; {fix}")
    _encodable(what, value, fix)
    if len(value.encode("utf-8")) > 128 * 1024:  # MAX_ARG_STRLEN: execve refuses a longer word
        raise ConfigError(f"{what} is over 128 KiB, more than one command-line word may be; {fix}")
    return value


def script_path(what: str, value: Path) -> Path:
    """A path a job script names: absolute, resolved (a job runs in another folder, and `..`
    after a link would go elsewhere there), and a word the script can hold."""
    script_word(what, str(value))
    resolved = Path(value).resolve()
    if len(str(resolved).encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise ConfigError(f"{what} is over {MAX_PATH_BYTES} bytes once absolute; pass a shorter path")
    return resolved


def script_words(what: str, values: Iterable[str]) -> None:
    for value in values:
        script_word(what, value)


def check_slurm_strings(opts: RunOptions, resources: SlurmResources) -> None:
    """Every string of `mlhpc run --slurm` that reaches a job script, judged where it lands: the
    #SBATCH lines (--out in --output, the partition, the time, each --sbatch-arg; the benchmark's
    --job-name is the catalog's) and the commands (every path and word of the seed jobs' `mlhpc run`)."""
    out = script_path("--out", opts.out)
    sbatch_value("--output", str(out), what="--out", pattern=True, path=True)  # directives() writes out/slurm
    for flag, path in (("--data", opts.data), ("--local-dir", opts.local_dir), ("--campaign", opts.campaign)):
        if path is not None:
            script_path(flag, path)
    for flag, word in (("--config", opts.config), ("--submitter", opts.submitter), ("--system", opts.system)):
        if word is not None:
            script_word(flag, word)
    script_words("the key=value override", opts.overrides)
    sbatch_time(resources.time)
    if resources.partition is not None:
        sbatch_value("--partition", resources.partition, what="--slurm-partition")
    for arg in resources.sbatch_args:
        sbatch_words(arg)
