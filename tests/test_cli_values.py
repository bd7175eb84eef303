"""Every command line of vitzoo and of the benchmarks checks its values at the parser: each argument
has help, an empty or blank value is refused naming the option, an unknown or abbreviated option is
refused, and a bad number is a one-line error before anything runs.
The parsers are found by reading the source, so a new command or option is covered here."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest
from hub_testing import tiny  # tests/hub_testing.py

from vitzoo.argvalues import ArgumentParser
from vitzoo.cli import main

ROOT = Path(__file__).resolve().parents[1]
MODULES = [p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
           for p in sorted([*ROOT.glob("vitzoo/**/*.py"), *ROOT.glob("benchmarks/**/*.py")])
           if p.name != "argvalues.py" and re.search(r"\bArgumentParser\(", p.read_text("utf-8"))]


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(a name, a parser) for every parser and subcommand parser of every command."""
    found, pending = [], [(name, importlib.import_module(name).build_parser()) for name in MODULES]
    while pending:
        label, parser = pending.pop()
        found.append((label, parser))
        pending += [(f"{label} {command}", sub) for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction)
                    for command, sub in action.choices.items()]
    return found


def takes_a_value(action: argparse.Action) -> bool:
    return (action.nargs != 0 and action.nargs not in (argparse.REMAINDER, argparse.PARSER)
            and not isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)))


def test_every_parser_is_the_checked_one_and_every_argument_has_help():
    assert {"vitzoo.cli", "benchmarks.__main__", "benchmarks.gpu_check"} <= set(MODULES)
    for name in MODULES:
        assert "argparse.ArgumentParser(" not in (ROOT / (name.replace(".", "/") + ".py")
                                                  ).read_text(), name
    missing = [f"{label}: {action.dest}" for label, parser in parsers()
               for action in parser._actions if not action.help and action.nargs != "..."
               and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))]
    assert all(isinstance(p, ArgumentParser) for _, p in parsers()) and not missing, missing


@pytest.mark.parametrize("value", ["", "  "])
def test_every_value_of_every_command_refuses_empty_and_blank(value, capsys):
    """Each argument that takes a value, given "" or " ", is a usage error (exit 2) naming it,
    before the command does anything."""
    cases = [(label, parser, action) for label, parser in parsers()
             for action in parser._actions if takes_a_value(action)]
    assert len(cases) > 100  # train alone has dozens
    for label, parser, tried in cases:
        argv = []  # `tried` given the value, every other required argument a plain one
        for action in parser._actions:
            if action is tried:
                argv += [action.option_strings[0], value] if action.option_strings else [value]
            elif not action.option_strings and takes_a_value(action) and action.nargs != "?":
                argv.append(action.choices and next(iter(action.choices)) or "x")
            elif action.required and action.option_strings:
                argv += [action.option_strings[0]] + ([] if action.nargs == 0 else ["x"])
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        err = capsys.readouterr().err
        shown = "/".join(tried.option_strings) or tried.metavar or tried.dest
        assert exited.value.code == 2 and f"the value is {'empty' if value == '' else 'blank'}" \
            in err and str(shown) in err, (label, tried.dest, err)


@pytest.mark.parametrize("argv", [["train", "--bogus"], ["train", "--step", "1"],
                                  ["list", "--markd"]])
def test_an_unknown_or_abbreviated_option_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert f"unrecognized arguments: {argv[1]}" in capsys.readouterr().err


@pytest.mark.parametrize("command, flag, value, fragment", [
    ("info", "--img-size", "0", "img_size must be > 0"),
    ("train", "--warmup", "nan", "warmup must be a finite number"),
    ("eval", "--draws", "0", "draws must be > 0"),
    ("eval", "--l2-reg", "nan", "l2_reg must be a finite number")])
def test_a_bad_number_is_a_one_line_error_before_anything_runs(tmp_path, capsys, command, flag,
                                                               value, fragment):
    tiny().save_pretrained(tmp_path / "saved")
    argv = {"info": ["info", "vit_b16"],
            "train": ["train", "vit_ti16", "--data", "synthetic", "--out", str(tmp_path / "run")],
            "eval": ["eval", str(tmp_path / "saved"), "--data", "synthetic"]}[command]
    assert main([*argv, flag, value]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
