"""Command-line flags from an options dataclass: one flag per field, typed by its annotation, its
help, range and choices from the field's metadata, set only when given.

`--img-size 28` is (28, 28) for a pair, `--betas 0.9,0.95` a tuple, `--head.representation-size
none` None, `--hflip` / `--no-hflip` a bool.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any


def parse_tuple(text: str, item: type, length: int | None) -> tuple:
    parts = [] if text.strip().lower() in ("none", "()") else [
        p for p in text.replace("x", ",").split(",") if p.strip()]
    values = tuple(item(p) for p in parts)
    if length is not None and len(values) == 1:
        values = values * length  # --img-size 28 means (28, 28)
    if length is not None and len(values) != length:
        raise argparse.ArgumentTypeError(f"expected {length} comma-separated values, got {text!r}")
    return values


def converter(annotation: Any):
    """str -> a value of the field's type: int, float, str, bool, X | None, tuple[...]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = converter(next(a for a in args if a is not type(None)))
        return lambda text: None if text.lower() == "none" else inner(text)
    if origin is tuple:
        length = None if len(args) == 2 and args[1] is Ellipsis else len(args)
        return lambda text: parse_tuple(text, args[0], length)
    if annotation in (bool, int, float, str):
        return annotation
    raise TypeError(f"no command-line form for {annotation!r}")


def add_dataclass_flags(parser, cls, exclude=(), dest_prefix: str = "", flag_prefix: str = "--",
                        show_defaults: bool = True) -> list[str]:
    """A flag per field of `cls` (`flag_prefix` + its name with dashes), stored under `dest_prefix`
    + its name, absent unless given; the help shows the default unless not `show_defaults`.
    Returns the destinations."""
    hints = typing.get_type_hints(cls)
    dests = []
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        kind, rules = hints[f.name], f.metadata
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        name = str(kind).replace("typing.", "").replace("<class '", "").replace("'>", "")
        shown = ", ".join(filter(None, [" ".join(filter(None, [name, rules.get("range")])),
                                        f"default {default!r}" if show_defaults else ""]))
        help_text = f"{rules.get('help', '')} [{shown}]".replace("%", "%%")  # % is argparse's
        flag, dest = flag_prefix + f.name.replace("_", "-"), dest_prefix + f.name
        choices = rules.get("choices")
        if kind is bool or kind == (bool | None):
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=dest, type=converter(kind), default=argparse.SUPPRESS,
                                choices=choices, metavar=None if choices else "V", help=help_text)
        dests.append(dest)
    return dests
