"""The command lines' help (issue 35 item 11): every argument of every parser says what it is; an
unknown or abbreviated option is refused by the subcommand that was given it, with that subcommand's
usage; `vitzoo bench --help` names `vitzoo bench`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.test_empty_values import parsers
from vitzoo.cli import main


def test_every_argument_of_every_parser_has_help():
    """Walks every parser of vitzoo's commands and of the benchmarks (found by reading the source)."""
    missing = [f"{label}: {'/'.join(action.option_strings) or action.dest}" for label, parser in parsers()
               for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and not action.help
               and action.nargs != argparse.REMAINDER]
    assert not missing, "arguments without help: " + "; ".join(missing)


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


def test_vitzoo_bench_help_names_vitzoo_bench(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: vitzoo bench" in out and "python -m benchmarks [" not in out
    assert "runs/bench" in out  # where its results go by default


def test_a_directory_that_is_not_empty_is_refused_in_plain_words(tmp_path, capsys):
    """"choose another the directory" was the refusal of `vitzoo pull REPO DIR` into a non-empty DIR."""
    from vitzoo.train.checkpoint import check_new_directory

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError) as refused:
        check_new_directory(tmp_path, "the directory", writer="pull writes only into")
    assert str(refused.value).endswith("choose another directory") and "another the" not in str(refused.value)
    with pytest.raises(ValueError, match="choose another --out$"):
        check_new_directory(tmp_path, "--out", writer="a new run needs")


def test_vitzoo_bench_writes_to_runs_bench_unless_asked_for_the_committed_results():
    """Issue 35 item 10: `vitzoo bench` had written into the checkout's committed benchmarks/results."""
    from benchmarks.__main__ import BENCH_OUT, REHEARSAL_OUT, parse
    from benchmarks.suite import RESULTS

    def out(*argv: str, prog: str = "vitzoo bench"):
        return parse(["pos_embed", "--dry-run", *argv], prog).out

    assert out() == BENCH_OUT == Path("runs") / "bench"
    assert out("--committed") == RESULTS and out("--out", "mine") == Path("mine")
    assert out("--scale", "rehearsal") == REHEARSAL_OUT
    assert out(prog="python -m benchmarks") == RESULTS  # the maintainers' command, as documented
    with pytest.raises(SystemExit):
        out("--committed", "--out", "mine")
