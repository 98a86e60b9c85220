"""The submission-wide settings of one `--out` (submitter, system, division, status, ruleset):
their flags, defaults and checks, and the rule that a campaign file's recorded value wins and a
flag that differs is refused. Pure and torch-free."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlhpc.common.errors import ConfigError
from mlhpc.common.vocabulary import DEFAULT_RULESET, DIVISIONS, RULESETS, STATUSES

DEFAULTS: dict[str, str] = {"submitter": "mlhpc", "status": "onprem", "ruleset": DEFAULT_RULESET}
CHOICES: dict[str, tuple[str, ...]] = {"division": DIVISIONS, "status": STATUSES, "ruleset": RULESETS}
SETTING_FLAGS: dict[str, str] = {
    "submitter": "--submitter",
    "system": "--system",
    "division": "--division",
    "status": "--status",
    "ruleset": "--ruleset",
}


# A submitter or system names a folder of the submission: one plain path component.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The submission-wide settings of one `--out`: one value each, whatever route runs."""

    submitter: str
    system: str | None
    """None only before the first run on the compute nodes names it (a Slurm campaign)."""
    division: str
    status: str
    ruleset: str


def resolve_settings(
    given: Mapping[str, str | None],
    recorded: Settings | None,
    where: Path,
    *,
    default_system: str | None,
    default_division: str,
) -> Settings:
    """Each setting: the one given, else the recorded one, else the default. A given value that
    differs from the recorded one is a ConfigError naming the flag, both values and the fix."""
    if (
        given.get("division") is None
        and recorded is not None
        and recorded.division != default_division == "open"
    ):
        raise ConfigError(
            f"this config goes in the open division (its closed rules need the real dataset), but {where} "
            f"records division {recorded.division}; pass --division {recorded.division} to put it there, "
            "or a new --out"
        )
    values: dict[str, str | None] = {}
    for name, flag in SETTING_FLAGS.items():
        wanted = given.get(name)
        have = getattr(recorded, name) if recorded is not None else None
        if wanted is not None:
            check_setting(name, wanted, flag)
            if have is not None and have != wanted:
                fix = "drop it" if name != "system" else "run on the machine type the campaign started on"
                raise ConfigError(
                    f"{flag} {wanted} differs from {where}'s {name} {have}: one --out holds one "
                    f"{'system' if name == 'system' else 'campaign setting'}; {fix}, pass {flag} {have}, "
                    "or a new --out"
                )
        defaults = {**DEFAULTS, "system": default_system, "division": default_division}
        values[name] = wanted if wanted is not None else have if have is not None else defaults[name]
    return Settings(**values)  # type: ignore[arg-type]


def check_setting(name: str, value: str, where: str) -> None:
    """A ConfigError unless `value` may be setting `name` (a folder name, or one of its choices)."""
    if name in CHOICES:
        if value not in CHOICES[name]:
            raise ConfigError(f"{where}: {name} {value!r} is not one of {', '.join(CHOICES[name])}")
    elif not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(f"{where}: {name} {value!r} must be a plain folder name (letters, digits, . _ + -)")
