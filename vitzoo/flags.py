"""Command-line flags from dataclass fields: one flag per field of an options dataclass
(TrainConfig, ViTConfig, a component's Options), typed by its annotation, set only when given.

`--img-size 28` is (28, 28) for a pair, `--betas 0.9,0.95` a tuple, `--head.representation-size
none` None, `--hflip` / `--no-hflip` a bool; the help names each field's type and default.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

def parse_tuple(text: str, item: type, length: int | None) -> tuple:
    empty = text.strip().lower() in ("", "none", "()")
    parts = [] if empty else [p for p in text.replace("x", ",").split(",") if p.strip()]
    values = tuple(item(p) for p in parts)
    if length is not None and len(values) == 1:
        values = values * length  # --img-size 28 means (28, 28)
    if length is not None and len(values) != length:
        raise argparse.ArgumentTypeError(f"expected {length} comma-separated values, got {text!r}")
    return values


def converter(annotation: Any):
    """A function str -> value for a field's type: int, float, str, bool, X | None, tuple[...]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = converter(next(a for a in args if a is not type(None)))

        def optional(text: str):
            return None if text.lower() == "none" else inner(text)

        return optional
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return lambda text: parse_tuple(text, args[0], None)
        return lambda text: parse_tuple(text, args[0], len(args))
    if annotation is bool:
        return bool
    if annotation in (int, float, str):
        return annotation
    raise TypeError(f"no command-line form for {annotation!r}")


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def add_dataclass_flags(parser, cls, exclude=(), dest_prefix: str = "", flag_prefix: str = "--",
                        choices: dict[str, tuple] | None = None, defaults: Any = None,
                        show_defaults: bool = True) -> list[str]:
    """One flag per field of `cls` (default: not set), `flag_prefix` + the field's name with dashes,
    the value stored under `dest_prefix` + the field's name. `choices`: the values some fields may
    take; `defaults`: an instance whose values the help shows (else the fields' defaults; none with
    `show_defaults=False`, where the default depends on something else, as a model option's on the
    model named). Returns the destinations."""
    hints = typing.get_type_hints(cls)
    dests = []
    choices = choices or {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        annotation = hints[f.name]
        flag = flag_prefix + f.name.replace("_", "-")
        dest = dest_prefix + f.name
        default = getattr(defaults, f.name) if defaults is not None else (
            f.default if f.default is not dataclasses.MISSING else f.default_factory())
        shown = f", default {default!r}" if show_defaults else ""
        help_text = f.metadata.get("help", "") + f" [{_type_name(annotation)}{shown}]"
        help_text = help_text.replace("%", "%%")  # argparse reads % as a format code
        if annotation is bool or annotation == (bool | None):
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, dest=dest, type=converter(annotation),
                                default=argparse.SUPPRESS, choices=choices.get(f.name),
                                metavar=None if f.name in choices else "V", help=help_text)
        dests.append(dest)
    return dests




__all__ = ["add_dataclass_flags", "converter", "parse_tuple"]
