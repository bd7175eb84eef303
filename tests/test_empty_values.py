"""An empty or blank value is refused wherever a command takes a value (issue 33 item 1): every option
and argument of every parser of vitzoo's commands and of the benchmarks, found by reading the source
for parsers and walking each one's arguments, so a new command or option is covered without editing
this test. `--resume ""` had started a full default training; `--out ""` trained and wrote nothing;
`--out " "` made a folder named " "."""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import pytest

from vitzoo.argvalues import ArgumentParser

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
    assert {"vitzoo.cli", "benchmarks.__main__", "benchmarks.gpu_check", "benchmarks.loader"} <= set(modules)
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
                    pending += [(f"{label} {command}", sub) for command, sub in action.choices.items()]
    return found


def takes_a_value(action: argparse.Action) -> bool:
    return (action.nargs != 0 and not isinstance(action, (argparse._SubParsersAction, argparse._HelpAction))
            and action.nargs not in (argparse.REMAINDER, argparse.PARSER))


def argv_with(parser: argparse.ArgumentParser, tried: argparse.Action, value: str) -> list[str]:
    """A command line that gives `tried` the `value` and every other required argument a plain one."""
    argv = []
    for action in parser._actions:
        if action is tried:
            argv += [action.option_strings[0], value] if action.option_strings else [value]
        elif not action.option_strings and takes_a_value(action) and action.nargs != "?":
            argv.append(action.choices and next(iter(action.choices)) or "x")
        elif action.required and action.option_strings:
            argv += [action.option_strings[0]] + ([] if action.nargs == 0 else ["x"])
    return argv


CASES = [(label, action.dest, parser, action) for label, parser in parsers() for action in parser._actions
         if takes_a_value(action)]


@pytest.mark.parametrize("value", ["", "  "])
def test_every_value_of_every_command_refuses_empty_and_blank(value, capsys):
    """Each option or argument that takes a value, given "" or "  ", is a usage error (exit status 2)
    naming it and saying the value is empty or blank, before the command does anything."""
    assert len(CASES) > 100  # the walk found the commands' options (train alone has dozens)
    for label, dest, parser, action in CASES:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv_with(parser, action, value))
        err = capsys.readouterr().err
        shown = "/".join(action.option_strings) or action.metavar or dest
        assert exit_info.value.code == 2, (label, dest)
        assert ("is empty" if value == "" else "is blank") in err and str(shown) in err, (label, dest, err)


def test_the_paths_that_went_wrong_are_refused_as_typed(tmp_path, monkeypatch, capsys):
    """The commands of the issue: refused at once, nothing trained, nothing written."""
    from vitzoo.cli import main

    monkeypatch.chdir(tmp_path)
    for argv in (["train", "--resume", ""], ["train", "--out", " ", "--data", "synthetic"], ["train", "--out", ""],
                 ["eval", ""], ["info", "vit_ti16", "--img-size", ""]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and "the value is" in capsys.readouterr().err, argv
    assert list(tmp_path.iterdir()) == []


def test_a_value_with_something_in_it_is_read_as_before():
    from vitzoo.cli import build_parser

    args = build_parser().parse_args(["train", "--out", " runs/a", "--data", "synthetic"])
    assert args.out == " runs/a" and args.data == "synthetic"


@pytest.mark.parametrize("option", ["out", "data", "data_dir", "pretrained"])
def test_a_training_config_refuses_an_empty_path_from_code_or_a_saved_file(option):
    """The same refusal for a TrainConfig made in Python or read from a train_config.json: a path
    option is a path or None, never "" (which had meant "write nothing" for out)."""
    from vitzoo.errors import ConfigError
    from vitzoo.train import TrainConfig

    for value in ("", " \t"):
        with pytest.raises(ConfigError, match=rf"{option}=.* is (empty|blank): name a path"):
            TrainConfig(**{option: value})
        with pytest.raises(ConfigError, match=rf"{option}=.* is (empty|blank)"):
            TrainConfig.from_json(json.dumps({option: value}))
