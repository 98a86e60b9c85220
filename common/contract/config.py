"""Typed, frozen dataclass configs loaded from YAML, with `key=value` command-line overrides.

An unknown key, a missing required key or a value of the wrong type is a `ConfigError`
that names the key and says how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from mlhpc.common.errors import ConfigError

T = TypeVar("T")


def load_config(config_cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
    """Read YAML at `path` into `config_cls`, applying `section.key=value` overrides on top."""
    path = Path(path)
    try:
        raw = safe_yaml(path.read_text(encoding="utf-8"), f"config file {path}") or {}
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist; pass --config mini|full or a path") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}".splitlines()[0]) from e
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {type(raw).__name__}")
    parsed = parse_overrides(overrides)
    given = {item.partition("=")[0].strip(): item for item in overrides}
    for key, value in parsed.items():
        check_override_key(config_cls, key, given.get(key, key))
        _set_dotted(raw, key, value)
    return from_dict(config_cls, raw, source=str(path), overridden=given)


MAX_YAML_DEPTH = 32
"""A config nests sections a few levels deep; PyYAML's composer recurses per level, and a few
hundred `[` or `a:` levels raised RecursionError (a traceback)."""


class _DepthBoundLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than MAX_YAML_DEPTH before it recurses further."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise _TooDeep
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _TooDeep(Exception):
    pass


def safe_yaml(text: str, what: str) -> Any:
    """`text` parsed as YAML (safe types only); a ConfigError naming `what` when it nests deeper
    than MAX_YAML_DEPTH levels."""
    loader = _DepthBoundLoader(text)
    try:
        return loader.get_single_data()
    except _TooDeep:
        raise ConfigError(
            f"{what} nests deeper than {MAX_YAML_DEPTH} levels; a config is sections of key: value"
        ) from None
    finally:
        loader.dispose()


def check_override_key(config_cls: type, dotted: str, item: str) -> None:
    """A ConfigError blaming the command line's `item` (not the YAML file) when `dotted` names no
    key of `config_cls`, with the close known keys."""
    node: Any = config_cls
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(node) if f.init}
        where = ".".join(parts[:depth])
        if part not in fields:
            known = sorted(fields)
            wrong = ".".join(parts[: depth + 1])
            close = [f"{where}.{c}" if where else c for c in difflib.get_close_matches(part, known, n=3)]
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ConfigError(
                f"override {item!r} on the command line: no config key {wrong!r}; {hint}"
                f"known{f' in {where}' if where else ' sections'}: {', '.join(known)}"
            )
        hint_type = typing.get_type_hints(node)[part]
        if depth < len(parts) - 1 and not dataclasses.is_dataclass(hint_type):
            raise ConfigError(
                f"override {item!r} on the command line: {'.'.join(parts[: depth + 1])} is a value, "
                f"not a section; write {'.'.join(parts[: depth + 1])}=VALUE"
            )
        node = hint_type


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Turn ["training.lr=0.1", "data.num_workers=2"] into {dotted key: YAML-parsed value}."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value; write e.g. loop.max_epochs=20")
        try:
            parsed[key.strip()] = safe_yaml(text, f"override {item[:60]!r}")
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML") from e
    return parsed


def from_dict(
    config_cls: type[T],
    data: Mapping[str, Any],
    *,
    source: str = "config",
    prefix: str = "",
    overridden: Mapping[str, str] | None = None,
) -> T:
    """Build a (possibly nested) dataclass from a mapping, checking keys and types. `overridden`
    (dotted key -> the `key=value` given): a bad value there is blamed on the command line."""
    overridden = overridden or {}
    if not isinstance(data, Mapping):
        where = _source(source, prefix.rstrip("."), overridden)
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'config'} must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        name = prefix + str(unknown[0])
        close = difflib.get_close_matches(str(unknown[0]), list(fields), n=1)
        hint = f"did you mean {prefix}{close[0]}? " if close else ""
        raise ConfigError(
            f"{source}: unknown config key {name!r}; {hint}known keys here: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(config_cls)
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        dotted = prefix + name
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{source}: required config key {dotted!r} is missing; add it")
            continue
        kwargs[name] = _coerce(hints[name], data[name], dotted, source, overridden)
    try:
        built = config_cls(**kwargs)
        if "num_workers" in kwargs:  # every benchmark's loader workers, bounded here once
            _check_num_workers(kwargs["num_workers"], prefix + "num_workers")
        return built
    except (ValueError, TypeError) as e:
        blamed = next(
            (item for key, item in overridden.items() if key.startswith(prefix) and key in str(e)), None
        )
        where = f"override {blamed!r} on the command line" if blamed else source
        raise ConfigError(f"{where}: {e}") from e


def _source(source: str, dotted: str, overridden: Mapping[str, str]) -> str:
    """Who gave `dotted`'s value: the command line's `key=value` or the YAML file."""
    item = overridden.get(dotted)
    return f"override {item!r} on the command line" if item is not None else source


def check_at_least(name: str, value: float, minimum: float, fix: str = "") -> None:
    """For `__post_init__`: a ValueError naming the field, its value and the fix when value < minimum
    (also NaN). `load_config` turns it into a ConfigError."""
    if not value >= minimum:
        raise ValueError(
            f"{name}={value} must be at least {minimum}; {fix or f'set {name}={minimum} or more'}"
        )


def check_positive(name: str, value: float, fix: str = "") -> None:
    """For `__post_init__`: a ValueError naming the field, its value and the fix unless value > 0."""
    if not value > 0:
        raise ValueError(f"{name}={value} must be positive; {fix or f'set {name} above 0'}")


def _check_num_workers(value: int, name: str) -> None:
    """The one bound on a benchmark's loader workers (any config key `num_workers`, checked by
    `from_dict` after the section's own checks): 0 (load in the main process) to 4 per CPU of this
    machine (at least 64): 100,000 forked to the pid limit."""
    from mlhpc.common.cluster.threads import count_bound

    most = count_bound()
    if not 0 <= value <= most:
        raise ValueError(
            f"{name}={value} must be from 0 (load in the main process) to {most} (4 per CPU of this "
            f"machine, at least 64); set {name}=4, say"
        )


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (tuples become lists), for YAML dumps and logs."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {part!r} is a value, not a section")
        node = child
    node[leaf] = value


def _coerce(
    hint: Any, value: Any, dotted: str, source: str, overridden: Mapping[str, str] | None = None
) -> Any:
    overridden = overridden or {}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value or {}, source=source, prefix=dotted + ".", overridden=overridden)
    source = _source(source, dotted.split("[")[0], overridden)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, dotted, source, overridden)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if origin is typing.Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{source}: {dotted}={value!r} is not allowed; use one of {choices}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {dotted}={value!r} must be a list, e.g. [1, 2]")
        item_hint = args[0] if args else Any
        items = [_coerce(item_hint, v, f"{dotted}[{i}]", source) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not (
        isinstance(value, hint) and not _is_bool_for_number(hint, value)
    ):
        raise ConfigError(f"{source}: {dotted}={value!r} has the wrong type; expected {hint.__name__}")
    return value


def _is_bool_for_number(hint: Any, value: Any) -> bool:
    return hint in (int, float) and isinstance(value, bool)
