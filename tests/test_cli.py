"""The `vitzoo` command: list and info, bench, and every command's help."""

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vitzoo.cli import build_parser, main


def commands() -> list[str]:
    """Every subcommand the parser registers (a new command is covered here without an edit)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_list_shows_models_by_pattern_components_and_weight_formats(capsys):
    assert main(["list", "vit_s*"]) == 0
    assert capsys.readouterr().out.split() == ["vit_s16", "vit_s32", "vit_s32_r26_hybrid"]
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "vit_h14" in out and "# pos_embed:" in out and "relative" in out
    formats = next(line for line in out.splitlines() if line.startswith("# weight formats:"))
    assert {"official-npz", "timm", "torchvision", "transformers", "vitzoo"} <= set(
        formats.split(": ")[1].split(", "))


def test_info_reports_parameters_flops_and_sequence_length(capsys):
    assert main(["info", "vit_b16", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["params"], info["seq_len"], info["grid"]) == (86_567_656, 197, [14, 14])
    assert 34.5 < info["gflops"] < 35.5 and info["config"]["embed_dim"] == 768
    assert main(["info", "vit_b16_hybrid", "--json"]) == 0  # the ResNet's FLOPs counted too
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == 98_659_112 and info["gflops"] > 35.5
    assert info["config"]["stem_options"] == {"layers": [3, 4, 9], "width": 1,
                                              "numerics": "official"}
    assert main(["info", "vit_ti16", "--img-size", "384"]) == 0
    assert "sequence length 577" in capsys.readouterr().out
    assert main(["info", "vit_b61"]) == 2
    assert "Did you mean 'vit_b16'" in capsys.readouterr().err


def test_bench_runs_the_benchmarks_of_the_checkout_as_vitzoo_bench(capfd):
    from benchmarks.__main__ import BENCH_OUT, parse
    from benchmarks.suite import RESULTS

    with pytest.raises(SystemExit) as exited:
        main(["bench", "posembed"])
    assert exited.value.code == 2 and "unknown ablation 'posembed'" in capfd.readouterr().err
    assert main(["bench", "--help"]) == 0
    out = capfd.readouterr().out
    assert "usage: vitzoo bench" in out and "runs/bench" in out  # where its results go

    def out_of(*argv: str, prog: str = "vitzoo bench"):
        return parse(["pos_embed", "--dry-run", *argv], prog).out

    assert out_of() == BENCH_OUT == Path("runs") / "bench" and out_of("--committed") == RESULTS
    assert out_of(prog="python -m benchmarks") == RESULTS  # the maintainers' command


@pytest.mark.parametrize("command", [None, *commands()])
def test_every_command_answers_help(command, capfd):
    try:
        code = main([*([command] if command else []), "--help"])
    except SystemExit as exc:  # argparse's help
        code = exc.code
    printed = capfd.readouterr()  # bench's: its child process's
    assert code in (0, None) and printed.out.startswith("usage:"), printed.err[-2000:]


def test_the_top_level_help_describes_vitzoo_and_lists_its_commands_in_order(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Vision Transformer" in out.split("\n\n")[1] and "vitzoo COMMAND --help" in out
    listed = [line.split()[0] for line in out.split("positional arguments:\n")[1].split("\n\n")[0]
              .splitlines()[1:] if line.startswith("    ") and not line.startswith("      ")]
    assert listed[:3] == ["list", "info", "predict"] and sorted(listed) == commands()


def test_the_training_help_lists_every_training_option(capsys):
    from vitzoo.train import TrainConfig

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        assert f.name in ("model", "model_options") or f"{flag} " in out or f"{flag}," in out
    assert "[float | None in (0, 1], default None]" in " ".join(out.split())  # layer_decay's


def test_the_command_runs_as_a_module_and_says_its_version():
    version = subprocess.run([sys.executable, "-m", "vitzoo", "--version"], capture_output=True,
                             text=True, check=True).stdout
    assert version.startswith("vitzoo 0.")
