"""Options: what ViTConfig (a model) and TrainConfig (a training run) share.

Both are dataclasses of named options, checked on construction, saved as JSON and read back with
their names checked. `Options` is their one base for that; `ConfigError` is the one error a bad
option raises, whichever config it belongs to; `check_fields` is the one check of every option's
type (and of number options' ranges).
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




def described(value: Any) -> str:
    """A value in words for an error: a short repr of a plain value, else its type (with an array's
    or a tensor's shape, a mapping's size), never the numbers of a tensor or a state dict."""
    plain = (str, bool, int, float, type(None))
    if isinstance(value, plain) or type(value).__name__ in ("PosixPath", "WindowsPath"):
        return f"{value!r:.200}"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
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


# ranges a number option may be given, by name (see `check_fields`)
RANGES = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}


def _kind(annotation) -> tuple[type | None, bool]:
    """(the scalar type a field holds: str, bool, int, float or dict, whether None is allowed);
    (None, _) for any other annotation (tuples: their own checks convert and check them)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    optional = len(args) == 1 and type(None) in typing.get_args(annotation)
    kind = args[0] if optional else annotation
    return (kind if kind in (str, bool, int, float, dict) else None), optional


def check_number(name: str, value, kind: type, rule: str | None = None) -> None:
    """`value` is an int (for `kind` int) or a finite number (for float), never a bool or text, and
    in the range `rule` (a key of RANGES); a ConfigError names the option otherwise."""
    wanted = numbers.Integral if kind is int else numbers.Real
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise ConfigError(f"{name} must be {'an int' if kind is int else 'a number'}, got "
                          f"{described(value)} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if rule is not None and not RANGES[rule](value):
        raise ConfigError(f"{name} must be {rule}, got {value!r}")


_WORDS = {str: "a str", bool: "True or False", dict: "a dict (a JSON object)"}


def check_fields(obj, rules: dict[str, str]) -> None:
    """Every option of the dataclass `obj` by the type its annotation names (optional ones when
    set): a str, a bool (never 1 or "false"), a dict; an int or finite number in its range from
    `rules` ({field: a key of RANGES}). The one check of every option's type, whether the value came
    from code, a flag or a JSON file."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        kind, optional = _kind(hints[f.name])
        value = getattr(obj, f.name)
        if kind is None or (optional and value is None):
            continue
        if kind in (int, float):
            check_number(f.name, value, kind, rules.get(f.name))
        elif not isinstance(value, kind):
            none = " or None" if optional else ""
            raise ConfigError(f"{f.name} must be {_WORDS[kind]}{none}, got {value!r} "
                              f"({type(value).__name__})")


class Options:
    """Base of a dataclass of options: names checked, copies with changes, plain dicts and JSON.

    A subclass is a `@dataclass` that checks its values in `__post_init__`; `KIND` names its options
    in errors ("model", "training")."""

    KIND: ClassVar[str] = ""
    # for a component's options: the fields that make another architecture (compared when a saved
    # model is loaded under a model name); None: all of them
    SHAPE: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    # what to say of a name another library uses for an option this one spells otherwise
    OTHER_NAMES: ClassVar[dict[str, str]] = {}

    @classmethod
    def check_option_names(cls, options) -> None:
        """Fail on an unknown option, naming the valid ones and the closest match (or, for another
        library's name of an option, this one's)."""
        valid = cls.field_names()
        for name in options:
            if name not in valid:
                other = cls.OTHER_NAMES.get(name)
                hint = f" {other}." if name in cls.OTHER_NAMES else closest(name, valid)
                raise ConfigError(f"unknown {cls.KIND} option {name!r}." + hint
                                  + f" Valid options: {', '.join(valid)}")

    def replace(self, **changes: Any) -> Self:
        """A copy with some options changed (names checked, the result validated)."""
        self.check_option_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only: tuples become lists."""
        return {k: list(v) if isinstance(v,
                                         tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.KIND} options must be a JSON object (a dict of option names "
                              f"to values), got a {type(data).__name__}")
        cls.check_option_names(data)
        return cls(**data)

    def to_json(self) -> str:
        """The options as a JSON document (a text file: it ends with a newline)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Self:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cls.KIND} options are not valid JSON ({exc})") from None
        return cls.from_dict(data)


__all__ = ["ConfigError", "Options", "RANGES", "check_fields", "check_number", "closest"]
