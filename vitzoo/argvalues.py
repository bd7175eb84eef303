"""The command lines' parser: argparse's, refusing an empty or blank value for any option or argument.

An empty value is never what a user meant: `--resume ""` was read as no --resume (a full default
training started), `--out ""` as "write nothing", `--out " "` made a folder named " ", and a `Path("")`
is the current directory. Every parser of vitzoo's commands and of the benchmarks is this
`ArgumentParser` (tests/test_empty_values.py finds them all and tries every option), so the refusal is
said at the boundary, naming the option, before anything runs.
"""

from __future__ import annotations

import argparse


def blank_refusal(value: str) -> str | None:
    """Why `value` is no value ("empty" or "blank"), or None for a value with something in it."""
    if value == "":
        return "is empty"
    if not value.strip():
        return f"is blank ({value!r})"
    return None


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose every value (of an option or a positional argument, its default
    when that is text included) is refused when empty or blank, as a usage error naming the argument:
    exit status 2 and the usage, as argparse says any bad value. Subcommands' parsers are of this class
    too (argparse makes them of their parent's class). A REMAINDER argument, passed on to another
    command unread, is that command's to check."""

    def _get_value(self, action: argparse.Action, arg_string: str):
        why = blank_refusal(arg_string) if isinstance(arg_string, str) else None
        if why is not None and action.nargs not in (argparse.REMAINDER, argparse.PARSER):
            hint = (f"leave {'/'.join(action.option_strings)} out for its default" if action.option_strings
                    else "give one")
            raise argparse.ArgumentError(action, f"the value {why}: {hint} (an empty value never means 'none' "
                                                 "or 'the current directory' here)")
        return super()._get_value(action, arg_string)


__all__ = ["ArgumentParser", "blank_refusal"]
