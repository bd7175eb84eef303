"""The command lines' parser: argparse's, refusing an empty or blank value for any argument.

An empty value is never what a user meant: `--resume ""` is not "no --resume", `--out " "` is not
a folder to make, and `Path("")` is the current directory. Every parser of vitzoo's commands and
of the benchmarks is this `ArgumentParser` (tests/test_cli_values.py finds them all), so the
refusal is said at the boundary, naming the option, before anything runs.
"""

from __future__ import annotations

import argparse
import difflib


def blank_refusal(value: str) -> str | None:
    """Why `value` is no value ("empty" or "blank"), or None for a value with something in it."""
    if value == "":
        return "is empty"
    if not value.strip():
        return f"is blank ({value!r})"
    return None


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose every value (of an option or a positional argument, its default
    when that is text included) is refused when empty or blank, as a usage error naming the
    argument: exit status 2 and the usage, as argparse says any bad value. Subcommands' parsers are
    of this class too (argparse makes them of their parent's class). A REMAINDER argument, passed on
    to another command unread, is that command's to check.

    No option is abbreviated (`--step 1` is not `--steps 1`: a prefix that means one option today
    means another when an option is added), and a subcommand's parser refuses an argument it does
    not know with its own usage, not the top-level one (which names no option of the subcommand)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs):
        kwargs.setdefault("parser_class", SubcommandParser)
        return super().add_subparsers(**kwargs)

    def _get_value(self, action: argparse.Action, arg_string: str):
        why = blank_refusal(arg_string) if isinstance(arg_string, str) else None
        if why is not None and action.nargs not in (argparse.REMAINDER, argparse.PARSER):
            flags = "/".join(action.option_strings)
            hint = f"leave {flags} out for its default" if flags else "give one"
            raise argparse.ArgumentError(action,
                                         f"the value {why}: {hint} (an empty value never means "
                                         "'none' "
                                                 "or 'the current directory' here)")
        return super()._get_value(action, arg_string)


class SubcommandParser(ArgumentParser):
    """A subcommand's parser: an argument it does not know is its usage error (argparse leaves it to
    the top-level parser, whose usage shows only `COMMAND ...`)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            known = [flag for action in self._actions for flag in action.option_strings]
            near = [f"{close[0]} (for {extra})" for extra in extras if extra.startswith("-")
                    for close in [difflib.get_close_matches(extra.split("=")[0], known, n=1)]
                    if close]
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint} (`{self.prog} --help` "
                       "lists the options)")
        return namespace, extras


__all__ = ["ArgumentParser", "SubcommandParser", "blank_refusal"]
