"""The `vitzoo` command: list, info, bench, and every command's help."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vitzoo.cli import main


def test_list_with_a_pattern(capsys):
    assert main(["list", "vit_s*"]) == 0
    assert capsys.readouterr().out.split() == ["vit_s16", "vit_s32", "vit_s32_r26_hybrid"]


def test_list_everything_shows_components(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "vit_h14" in out and "# pos_embed:" in out and "relative" in out


def test_list_everything_shows_the_weight_formats_it_reads(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(line for line in lines if line.startswith("# weight formats:"))
    assert {"official-npz", "timm", "torchvision", "transformers",
            "vitzoo"} <= set(line.split(": ")[1].split(", "))


def test_info_reports_params_flops_and_sequence_length(capsys):
    assert main(["info", "vit_b16", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == 86_567_656
    assert info["seq_len"] == 197 and info["grid"] == [14, 14]
    assert 34.5 < info["gflops"] < 35.5  # ~17.6 GMACs per image at 224 px, counted by flop_counter
    assert info["config"]["embed_dim"] == 768


def test_info_of_a_hybrid_counts_its_resnets_flops_and_shows_its_stems_options(capsys):
    """The hybrid's weight standardisation asks whether autocast is on, which the meta device (where
    FLOPs are counted) cannot answer: `vitzoo info vit_b16_hybrid` failed on it."""
    assert main(["info", "vit_b16_hybrid", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == 98_659_112  # the official R50+ViT-B/16
    assert info["gflops"] > 35.5  # more than ViT-B/16's: the ResNet's convolutions are counted
    assert info["config"]["stem_options"] == {"layers": [3, 4, 9], "width": 1,
                                              "numerics": "official"}


def test_info_of_an_unknown_model_is_a_short_error(capsys):
    assert main(["info", "vit_b61"]) == 2
    assert "Did you mean 'vit_b16'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_module_runs_as_a_command():
    out = subprocess.run([sys.executable, "-m", "vitzoo", "info", "vit_ti16", "--img-size", "384"],
                         capture_output=True, text=True, check=True).stdout
    assert "sequence length 577" in out


def test_bench_runs_the_benchmarks_of_the_checkout(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "posembed"])
    assert exit_info.value.code == 2 and "unknown ablation 'posembed'" in capsys.readouterr().err


def _commands() -> list[str]:
    """Every subcommand the parser registers (a new command is covered without editing this test).
    """
    import argparse

    from vitzoo.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_every_command_is_found_by_the_help_test():
    assert {"list", "info", "train", "eval", "push", "pull", "convert", "predict",
            "bench"} <= set(_commands())


def help_of(argv: list[str], capsys) -> str:
    """What `vitzoo ARGV` prints, run in this process (the parser and commands are the command's
    own; a process per case would import torch again, seconds each): it must end as help does, exit
    code 0."""
    try:
        code = main(argv)  # bench returns the exit code of the benchmarks it relays to
    except SystemExit as exc:  # argparse's help
        code = exc.code
    printed = capsys.readouterr()
    assert code in (0, None), printed.err[-2000:]
    assert "Traceback" not in printed.err
    return printed.out


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("command", [None, *_commands()])
def test_every_command_answers_help_as_a_user_types_it(command, flag, capsys):
    # bench relays to `python -m benchmarks`: that child process is real here too
    out = help_of([*([command] if command else []), flag], capsys)
    assert out.startswith("usage:"), out[:500]


def test_the_help_as_a_command_of_its_own():
    """The entry point as a user types it, in a process of its own: `python -m vitzoo train --help`.
    """
    result = subprocess.run([sys.executable, "-m", "vitzoo", "train", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: vitzoo train"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_the_top_level_help_describes_vitzoo_to_a_user(capsys):
    """`vitzoo --help` says what vitzoo is and does, in whole sentences, then every command; not the
    developer's docstring of the module that builds the parser, cut at its first line."""
    out = help_of(["--help"], capsys)
    description = out.split("\n\n")[1]
    assert "Vision Transformer" in description and description.rstrip().endswith(".")
    assert "vitzoo/commands" not in out and "exposes" not in out
    # after the COMMAND line
    commands = out.split("positional arguments:\n", 1)[1].split("\n", 1)[1]
    listed = [line.split()[0] for line in commands.split("\n\n")[0].splitlines() if line.startswith("    ")
              and not line.startswith("      ")]
    assert listed[:3] == ["list", "info", "predict"] and sorted(listed) == _commands()
    # examples, and where the options are
    assert "vitzoo predict" in out and "vitzoo COMMAND --help" in out


def test_the_training_help_lists_every_training_option(capsys):
    from vitzoo.train.config import TrainConfig

    out = help_of(["train", "--help"], capsys)
    for f in dataclasses.fields(TrainConfig):
        if f.name not in ("model", "model_options", "resume", "out"):
            assert "--" + f.name.replace("_", "-") in out, f.name
    assert "the first 5%)" in out  # the literal percent sign, printed as written


def test_vitzoo_bench_help_names_vitzoo_bench(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: vitzoo bench" in out and "python -m benchmarks [" not in out
    assert "runs/bench" in out  # where its results go by default


def test_vitzoo_bench_writes_to_runs_bench_unless_asked_for_the_committed_results():
    """`vitzoo bench` writes under runs/bench; the committed benchmarks/results only when asked."""
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
