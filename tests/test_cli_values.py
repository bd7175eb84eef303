"""Every command line of vitzoo and of the benchmarks checks its values at the parser: each argument
has help, an empty or blank value is refused naming the option, an unknown or abbreviated option is
refused with its subcommand's usage, and a bad number is a one-line error before anything runs.
The parsers are found by reading the source, so a new command or option is covered here."""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import pytest
from hub_testing import tiny  # tests/hub_testing.py

from vitzoo.argvalues import ArgumentParser
from vitzoo.cli import main

ROOT = Path(__file__).resolve().parents[1]


def modules_with_parsers() -> list[str]:
    """Every module of vitzoo/ and benchmarks/ whose source makes an argparse parser."""
    found = []
    for path in sorted([*ROOT.glob("vitzoo/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "vitzoo/argvalues.py":
            continue
        if re.search(r"\bArgumentParser\(", path.read_text(encoding="utf-8")):
            found.append(relative[:-3].replace("/", ".").removesuffix(".__init__"))
    return found


def test_every_parser_is_the_checked_one():
    """No module builds a plain argparse parser: each builds vitzoo.argvalues.ArgumentParser in a
    `build_parser()` (so that this test can walk it)."""
    modules = modules_with_parsers()
    assert {"vitzoo.cli", "benchmarks.__main__", "benchmarks.gpu_check",
            "benchmarks.loader"} <= set(modules)
    for name in modules:
        source = (ROOT / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        assert "argparse.ArgumentParser(" not in source, f"{name} builds a plain argparse parser"
        assert isinstance(importlib.import_module(name).build_parser(), ArgumentParser), name


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(a name, a parser) for every parser and subcommand parser of every command."""
    found = []
    for name in modules_with_parsers():
        pending = [(name, importlib.import_module(name).build_parser())]
        while pending:
            label, parser = pending.pop()
            found.append((label, parser))
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    pending += [(f"{label} {command}", sub) for command,
                                sub in action.choices.items()]
    return found


def takes_a_value(action: argparse.Action) -> bool:
    return (action.nargs != 0 and not isinstance(action,
                                                 (argparse._SubParsersAction, argparse._HelpAction))
            and action.nargs not in (argparse.REMAINDER, argparse.PARSER))


def argv_with(parser: argparse.ArgumentParser, tried: argparse.Action, value: str) -> list[str]:
    """A command line that gives `tried` the `value` and every other required argument a plain one.
    """
    argv = []
    for action in parser._actions:
        if action is tried:
            argv += [action.option_strings[0], value] if action.option_strings else [value]
        elif not action.option_strings and takes_a_value(action) and action.nargs != "?":
            argv.append(action.choices and next(iter(action.choices)) or "x")
        elif action.required and action.option_strings:
            argv += [action.option_strings[0]] + ([] if action.nargs == 0 else ["x"])
    return argv


CASES = [(label, action.dest, parser, action) for label,
         parser in parsers() for action in parser._actions
         if takes_a_value(action)]


def test_every_argument_of_every_parser_has_help():
    """Walks every parser of vitzoo's commands and of the benchmarks (found by reading the source).
    """
    missing = [f"{label}: {'/'.join(action.option_strings) or action.dest}" for label, parser in parsers()
               for action in parser._actions
               if not isinstance(action,
                                 (argparse._HelpAction,
                                  argparse._VersionAction)) and not action.help
               and action.nargs != argparse.REMAINDER]
    assert not missing, "arguments without help: " + "; ".join(missing)


@pytest.mark.parametrize("value", ["", "  "])
def test_every_value_of_every_command_refuses_empty_and_blank(value, capsys):
    """Each option or argument that takes a value, given "" or " ", is a usage error (exit status 2)
    naming it and saying the value is empty or blank, before the command does anything."""
    assert len(CASES) > 100  # the walk found the commands' options (train alone has dozens)
    for label, dest, parser, action in CASES:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv_with(parser, action, value))
        err = capsys.readouterr().err
        shown = "/".join(action.option_strings) or action.metavar or dest
        assert exit_info.value.code == 2, (label, dest)
        assert ("is empty" if value == "" else "is blank") in err
        assert str(shown) in err, (label, dest, err)


def test_an_empty_path_is_refused_before_anything_is_trained_or_written(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in (["train", "--resume", ""], ["train", "--out", " ", "--data", "synthetic"],
                 ["train", "--out", ""], ["eval", ""], ["info", "vit_ti16", "--img-size", ""]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and "the value is" in capsys.readouterr().err, argv
    assert list(tmp_path.iterdir()) == []


def test_a_value_that_is_not_blank_is_read_as_given():
    from vitzoo.cli import build_parser

    args = build_parser().parse_args(["train", "--out", " runs/a", "--data", "synthetic"])
    assert args.out == " runs/a" and args.data == "synthetic"


@pytest.mark.parametrize("argv, said", [
    (["train", "--bogus"], "vitzoo train: error: unrecognized arguments: --bogus"),
    (["train", "--step", "1"], "did you mean --steps"),  # an abbreviation is no option
    (["list", "--markd", "--pretrained"], "vitzoo list: error: unrecognized arguments: --markd"),
])
def test_an_unknown_or_abbreviated_option_is_refused_with_the_subcommands_usage(argv, said, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err
    assert f"usage: vitzoo {argv[0]}" in err and "usage: vitzoo [-h]" not in err


@pytest.mark.parametrize("command, flag, value, fragment", [
    ("info", "--img-size", "0", "img_size must be > 0"),
    ("info", "--img-size", "-3", "img_size must be > 0"),
    ("train", "--log-every", "0", "log_every must be > 0"),
    ("train", "--eval-every", "-1", "eval_every must be >= 0"),
    ("train", "--fewshot", "0", "fewshot must be > 0"),
    ("train", "--warmup", "nan", "warmup must be a finite number"),
    ("train", "--train-limit", "0", "train_limit must be > 0"),
    ("eval", "--fewshot", "0", "fewshot must be > 0"),
    ("eval", "--draws", "0", "draws must be"),
    ("eval", "--test-limit", "0", "test_limit must be"),
    ("eval", "--batch-size", "-1", "batch_size must be"),
    ("eval", "--l2-reg", "nan", "l2_reg must be"),
])
def test_a_bad_number_is_a_one_line_error_before_anything_runs(
        tmp_path, capsys, command, flag, value, fragment):
    """Exit status 2 and one line naming the option, no traceback; train writes no run, eval loads
    neither the model nor the data."""
    tiny().save_pretrained(tmp_path / "saved")
    argv = {"info": ["info", "vit_b16"],
            "train": ["train", "vit_ti16", "--data", "synthetic", "--device", "cpu",
                      "--out", str(tmp_path / "run")],
            "eval": ["eval", str(tmp_path / "saved"), "--data", "synthetic"]}[command]
    assert main([*argv, flag, value]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
