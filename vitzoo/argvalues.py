"""The command lines' parser: argparse's, refusing an empty or blank value of any argument (it
would mean "none" or the current directory), an abbreviated option, and an unknown option with the
subcommand's own usage. Every parser of vitzoo and of the benchmarks is this one.
"""

from __future__ import annotations

import argparse
import difflib


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser (subcommands' too), with the refusals above as usage errors (exit 2).
    A REMAINDER argument, passed on unread, is another command's to check."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a prefix of one option today is another's later
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs):
        return super().add_subparsers(parser_class=SubcommandParser, **kwargs)

    def _get_value(self, action: argparse.Action, arg_string: str):
        if (isinstance(arg_string, str) and not arg_string.strip()
                and action.nargs not in (argparse.REMAINDER, argparse.PARSER)):
            what = "is empty" if arg_string == "" else f"is blank ({arg_string!r})"
            flags = "/".join(action.option_strings)
            raise argparse.ArgumentError(action, f"the value {what}: "
                                         + (f"leave {flags} out for its default" if flags
                                            else "give one"))
        return super()._get_value(action, arg_string)



class SubcommandParser(ArgumentParser):
    """A subcommand's parser: an argument it does not know is its usage error, not the top-level
    parser's (whose usage names none of its options)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            known = [flag for action in self._actions for flag in action.option_strings]
            near = [f"{close[0]} (for {extra})" for extra in extras if extra.startswith("-")
                    for close in [difflib.get_close_matches(extra.split("=")[0], known, n=1)]
                    if close]
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       + (f"; did you mean {', '.join(near)}?" if near else ""))
        return namespace, extras
