"""Options: the base of every dataclass of options (ViTConfig, TrainConfig, a part's `Options`).

A field's type is its annotation; its rules are its metadata, given with `option(...)`: `range` (a
key of RANGES) for a number or each number of a tuple, `choices` for a value. `check_fields` checks
them all, whether the value came from code, a flag or a JSON file; a `ConfigError` names the option,
what it must be and what it got. Options are saved as JSON and read back with their names checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from vitzoo.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Self

RANGES = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}
_WORDS = {str: "a str", bool: "True or False", dict: "a dict (a JSON object)", int: "ints",
          float: "numbers"}


def described(value: Any) -> str:
    """A value in words for an error: a short repr of a plain value, else its type (with a tensor's
    shape, a mapping's size), never the numbers of a tensor or a state dict."""
    plain = (str, bool, int, float, type(None))
    if isinstance(value, plain) or type(value).__name__ in ("PosixPath", "WindowsPath"):
        return f"{value!r:.200}"
    if getattr(value, "shape", None) is not None:
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} of {len(value)} entries"
    if callable(getattr(value, "state_dict", None)):
        return f"a {type(value).__name__} module"
    if isinstance(value, (tuple, list)) and all(isinstance(v, plain) for v in value):
        return f"{value!r:.200}"
    return f"a {type(value).__name__}"


def closest(name: str, choices) -> str:
    """' Did you mean ...?' for a misspelling, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {match[0]!r}?" if match else ""


def option(default: Any = dataclasses.MISSING, *, help: str = "", range: str | None = None,
           choices: tuple | None = None) -> Any:
    """A dataclass field with its help text and the rules `check_fields` applies ({} for a dict)."""
    metadata = {"help": help, "range": range, "choices": choices}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_number(name: str, value, kind: type, rule: str | None = None) -> None:
    """`value` is an int (for `kind` int) or a finite number (for float), never a bool or text, and
    in the range `rule` (a key of RANGES)."""
    wanted = numbers.Integral if kind is int else numbers.Real
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise ConfigError(f"{name} must be {'an int' if kind is int else 'a number'}, got "
                          f"{described(value)} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if rule is not None and not RANGES[rule](value):
        raise ConfigError(f"{name} must be {rule}, got {value!r}")


def check_value(name: str, value, annotation, rule: str | None = None, choices=None) -> None:
    """One option's value against its annotation (str, bool, int, float, dict, a tuple of numbers,
    any of them or None), its range `rule` (a key of RANGES) and its `choices`."""
    args = typing.get_args(annotation)
    optional = type(None) in args  # X | None
    if optional:
        if value is None:
            return
        annotation = next(a for a in args if a is not type(None))
        args = typing.get_args(annotation)
    if annotation in (int, float):
        check_number(name, value, annotation, rule)
    elif typing.get_origin(annotation) is tuple:
        length = None if args[-1] is Ellipsis else len(args)
        if not isinstance(value, (tuple, list)) or length not in (None, len(value)):
            count = "" if length is None else f"{length} "
            raise ConfigError(f"{name} must be a tuple of {count}{_WORDS[args[0]]}, got "
                              f"{described(value)}")
        for item in value:
            check_number(name, item, args[0], rule)
    elif annotation in (str, bool, dict) and not isinstance(value, annotation):
        none = " or None" if optional else ""
        raise ConfigError(f"{name} must be {_WORDS[annotation]}{none}, got {value!r} "
                          f"({type(value).__name__})")
    if choices is not None and value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}."
                          + closest(str(value), choices))


def check_fields(obj, rules: dict[str, str] | None = None) -> None:
    """Every option of the dataclass `obj` by its annotation and metadata; `rules` ({field: a key
    of RANGES}) adds ranges to those of the metadata."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        rule = (rules or {}).get(f.name, f.metadata.get("range"))
        check_value(f.name, getattr(obj, f.name), hints[f.name], rule, f.metadata.get("choices"))


class Options:
    """Base of a dataclass of options: checked on construction (`check_fields`; a subclass adds
    what spans several options in `__post_init__`), copied with changes, written as JSON.

    `KIND` names the options in errors ("model", "training", "stem 'resnet'"); `SHAPE`: the fields
    of a part's options that make another architecture (None: all); `OTHER_NAMES`: what to say of
    another library's name for an option."""

    KIND: ClassVar[str] = ""
    SHAPE: ClassVar[tuple[str, ...] | None] = None
    OTHER_NAMES: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def check_option_names(cls, options) -> None:
        """Fail on an unknown option, naming the closest match (or what to give instead) and the
        valid ones."""
        valid = cls.field_names()
        for name in options:
            if name not in valid:
                hint = f" {cls.OTHER_NAMES[name]}." if name in cls.OTHER_NAMES else closest(
                    name, valid)
                raise ConfigError(f"unknown {cls.KIND} option {name!r}.{hint} Valid options: "
                                  + ", ".join(valid))

    def replace(self, **changes: Any) -> Self:
        """A copy with some options changed (names checked, the result checked)."""
        self.check_option_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only: tuples become lists."""
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.KIND} options must be a JSON object (a dict of option names "
                              f"to values), got a {type(data).__name__}")
        cls.check_option_names(data)
        return cls(**data)

    def to_json(self) -> str:
        """The options as a JSON text file (it ends with a newline)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Self:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cls.KIND} options are not valid JSON ({exc})") from None
        return cls.from_dict(data)


__all__ = ["ConfigError", "Options", "RANGES", "check_fields", "check_number", "check_value",
           "closest", "described", "option"]
