"""The command lines' parser: argparse's, refusing an empty or blank value of any argument (it
would mean "none" or the current directory) and an abbreviated option. Every parser of vitzoo and
of the benchmarks is this one (its subcommands' parsers too).
"""

from __future__ import annotations

import argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with the refusals above as usage errors (exit 2). A REMAINDER argument,
    passed on unread, is another command's to check."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a prefix of one option today is another's later
        super().__init__(*args, **kwargs)

    def _get_value(self, action: argparse.Action, arg_string: str):
        if (isinstance(arg_string, str) and not arg_string.strip()
                and action.nargs not in (argparse.REMAINDER, argparse.PARSER)):
            what = "is empty" if arg_string == "" else f"is blank ({arg_string!r})"
            flags = "/".join(action.option_strings)
            raise argparse.ArgumentError(action, f"the value {what}: "
                                         + (f"leave {flags} out for its default" if flags
                                            else "give one"))
        return super()._get_value(action, arg_string)



def positive_int(text: str) -> int:
    """An argument's type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
