"""Options: the base of every dataclass of options (ViTConfig, TrainConfig, a part's `Options`).

A field's type is its annotation and its rules are its metadata, given with `option(...)`: `range`
(a key of RANGES) for a number or each number of a tuple, `choices` for a value. `check_fields`
checks them all, whether the value came from code, a flag or a JSON file, in one `ConfigError`
naming the option, what it must be and what it got.
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

RANGES = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0, "in [0, 1)": lambda v: 0 <= v < 1,
          "in [0, 1]": lambda v: 0 <= v <= 1, "in (0, 1]": lambda v: 0 < v <= 1}
WORDS = {str: "a str", bool: "True or False", dict: "a dict (a JSON object)", int: "ints",
         float: "numbers"}


def described(value: Any) -> str:
    """A value in words for an error: a plain value's short repr, else its type (a tensor's shape,
    a mapping's size), never the numbers of a tensor or a state dict."""
    plain = (str, bool, int, float, type(None))
    if (isinstance(value, plain) or type(value).__name__ in ("PosixPath", "WindowsPath")
            or isinstance(value, (tuple, list)) and all(isinstance(v, plain) for v in value)):
        return f"{value!r:.200}"
    if getattr(value, "shape", None) is not None:
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} of {len(value)} entries"
    module = callable(getattr(value, "state_dict", None))
    return f"a {type(value).__name__}{' module' if module else ''}"


def closest(name: str, choices) -> str:
    """' Did you mean ...?' for a misspelling, or '' when nothing is close."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {match[0]!r}?" if match else ""


def option(default: Any, *, help: str = "", range: str | None = None,
           choices: tuple | None = None) -> Any:
    """A dataclass field with its help and the rules `check_fields` applies ({}: a fresh dict)."""
    metadata = {"help": help, "range": range, "choices": choices}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_number(name: str, value, kind: type, rule: str | None = None) -> None:
    """An int (for `kind` int) or a finite number, never a bool or text, in the range `rule`."""
    if isinstance(value, bool) or not isinstance(
            value, numbers.Integral if kind is int else numbers.Real):
        raise ConfigError(f"{name} must be {'an int' if kind is int else 'a number'}, got "
                          f"{described(value)} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if rule is not None and not RANGES[rule](value):
        raise ConfigError(f"{name} must be {rule}, got {value!r}")


def check_fields(obj, rules: dict[str, str] | None = None) -> None:
    """Every field of the dataclass `obj` by its annotation (str, bool, int, float, dict, a tuple
    of numbers, any of them or None) and its metadata; `rules` ({field: range}) adds ranges."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        name, value, kind = f.name, getattr(obj, f.name), hints[f.name]
        rule, choices = (rules or {}).get(name, f.metadata.get("range")), f.metadata.get("choices")
        args = typing.get_args(kind)
        optional = type(None) in args
        if optional and value is None:
            continue
        if optional:
            kind = next(a for a in args if a is not type(None))
            args = typing.get_args(kind)
        if kind in (int, float):
            check_number(name, value, kind, rule)
        elif typing.get_origin(kind) is tuple:
            length = None if args[-1] is Ellipsis else len(args)
            if not isinstance(value, (tuple, list)) or length not in (None, len(value)):
                raise ConfigError(f"{name} must be a tuple of {f'{length} ' if length else ''}"
                                  f"{WORDS[args[0]]}, got {described(value)}")
            for item in value:
                check_number(name, item, args[0], rule)
        elif kind in (str, bool, dict) and not isinstance(value, kind):
            raise ConfigError(f"{name} must be {WORDS[kind]}{' or None' if optional else ''}, "
                              f"got {value!r} ({type(value).__name__})")
        if choices is not None and value not in choices:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}."
                              + closest(str(value), choices))


class Options:
    """A dataclass of options: checked when made (`check_fields`, then what spans several options
    in a subclass's `__post_init__`), copied with changes, written as JSON. `KIND` names them in
    errors ("model", "stem 'resnet'"); `SHAPE`: the fields of a part's options that make another
    architecture (None: all); `OTHER_NAMES`: what to say of another library's name of an option."""

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
        """An unknown option is an error naming the closest (or what to give) and the valid."""
        for name in options:
            if name not in (valid := cls.field_names()):
                hint = f" {cls.OTHER_NAMES[name]}." if name in cls.OTHER_NAMES else closest(
                    name, valid)
                raise ConfigError(f"unknown {cls.KIND} option {name!r}.{hint} Valid options: "
                                  + ", ".join(valid))

    def replace(self, **changes: Any) -> Self:
        self.check_option_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: tuples become lists."""
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
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))
