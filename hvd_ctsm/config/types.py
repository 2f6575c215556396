"""Exact conversion of config values to their dataclass fields' declared types.

A value is either text (an override `section.field=value`, or a quoted YAML scalar) or what YAML
already made of it. Text is parsed for the field's type: `1e-3` is a float (YAML 1.1 would keep
it a string), `3` an int; what the type cannot hold is refused (`epochs=3.7`, `model.layers=true`,
`data.batch_size=2.5`), naming the field, the value and the type expected. Standard library and
PyYAML only: the config is small and flat, and the conversion rules fit on one screen.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing

import yaml

_NULLS = {"", "~", "null", "none"}
_EXPECTED = {int: "int (a whole number, e.g. 3)", float: "float (a number, e.g. 0.001 or 1e-3)",
             bool: "bool (true or false)", str: "str (text)"}


class ConfigError(ValueError):
    """A config value or key that cannot be used; the message names it and what is expected."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(f"config: {message}")


def parse_yaml(text: str, source: str):
    """`text` parsed as YAML; broken YAML is a ConfigError naming `source` and the line and
    column PyYAML stopped at (it is the user's file or override, not a crash)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"config: {source} is not valid YAML{where}: {problem}; fix "
                          "it") from exc


def one_of(name: str, value, allowed) -> None:
    check(value in allowed, f"{name}={value!r} is not one of {sorted(allowed)}")


def _refuse(name: str, value, expected: str) -> typing.NoReturn:
    shown = value.strip() if isinstance(value, str) else json.dumps(value, default=str)
    raise ConfigError(f"config: {name}={shown} has the wrong type: expected {expected}")


def _to_int(name: str, value) -> int:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            _refuse(name, value, _EXPECTED[int])
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    _refuse(name, value, _EXPECTED[int])


def _to_float(name: str, value) -> float:
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            _refuse(name, value, _EXPECTED[float])
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        _refuse(name, value, _EXPECTED[float])
    if not math.isfinite(number):
        _refuse(name, value, "a finite " + _EXPECTED[float])
    return number


def _to_bool(name: str, value) -> bool:
    parsed = yaml.safe_load(value) if isinstance(value, str) else value  # true/false/yes/no
    if isinstance(parsed, bool):
        return parsed
    _refuse(name, value, _EXPECTED[bool])


def _to_str(name: str, value) -> str:
    if isinstance(value, str):
        return value
    _refuse(name, value, _EXPECTED[str] + "; quote it in YAML")


_SCALARS = {int: _to_int, float: _to_float, bool: _to_bool, str: _to_str}


def convert(name: str, value, hint):
    """`value` as the type `hint` (int, float, bool, str, X | None, dict[str, X], a dataclass)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULLS):
            check(type(None) in args, f"{name} may not be null")
            return None
        if inner[1:] == [str]:  # a number or a word (float | str: 5 or 'auto')
            try:
                return convert(name, value, inner[0])
            except ConfigError:
                return _to_str(name, value)
        check(len(inner) == 1, f"{name}: unsupported type {hint}")
        return convert(name, value, inner[0])
    if origin is dict:
        mapping = parse_yaml(value, name) if isinstance(value, str) else value
        if not isinstance(mapping, dict):
            _refuse(name, value, f"a mapping such as {{key: value}} of {args[1].__name__}")
        return {convert(f"{name} key", k, args[0]): convert(f"{name}[{k}]", v, args[1])
                for k, v in mapping.items()}
    if dataclasses.is_dataclass(hint):
        mapping = parse_yaml(value, name) if isinstance(value, str) else value
        if not isinstance(mapping, dict):
            _refuse(name, value, f"a mapping of {hint.__name__} fields (a section)")
        return build(hint, mapping, prefix=f"{name}.")
    check(hint in _SCALARS, f"{name}: unsupported type {hint}")
    return _SCALARS[hint](name, value)


def build(cls, values: dict, prefix: str = ""):
    """A (nested) config dataclass from `values`, unknown keys refused by name; every value is
    converted to its field's declared type before __post_init__ checks ranges."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    check(not unknown, f"unknown keys {sorted(unknown)} for {cls.__name__}; known: {sorted(names)}")
    return cls(**{key: convert(prefix + key, value, hints[key]) for key, value in values.items()})
