"""No stuck states (issue 23): what a fault leaves behind is repaired or cleaned by the next ordinary
command, or the message says how; a finished run resumes to a no-op that says so."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.errors import TrainingDiverged


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def same_model(a, b) -> bool:
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return a.config == b.config and torch.equal(a.eval()(x), b.eval()(x))


def train_config(out, **changes):
    from vitzoo.train import TrainConfig

    base = dict(model="vit_ti16", model_options=dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                                                     patch_size=7),
                data="synthetic", train_limit=32, test_limit=16, batch_size=16, steps=2, lr=3e-3, warmup=0,
                log_every=1, checkpoint_every=0, quiet=True, tensorboard=False, out=str(out), device="cpu")
    return TrainConfig(**{**base, **changes})


# ------------------------------------------------------------------ a crash between the two renames of a swap
def crash_in_the_swap(directory: Path, seed: int) -> None:
    """save_pretrained over an earlier save in another process, killed (os._exit) between the swap's
    two renames: the earlier save is moved aside, the new one not yet in place."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from hub_testing import tiny
        import vitzoo.io as io
        renames, real = [], os.rename
        def rename(src, dst):
            renames.append(src)
            if len(renames) == 2:
                os._exit(9)  # killed between the two renames
            real(src, dst)
        io.os.rename = rename
        tiny({seed}).save_pretrained({str(directory)!r})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 9, result.stderr


def test_a_crash_between_the_two_renames_of_a_swap_is_recovered_at_the_next_save(tmp_path):
    """The directory is missing after the crash; loading it says where the earlier save is; the next
    save puts the new model in place and leaves no staging or moved-aside directory behind."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    crash_in_the_swap(tmp_path / "saved", seed=1)
    assert not (tmp_path / "saved").exists()
    with pytest.raises(FileNotFoundError, match=r"an interrupted save left the earlier one in .*\.saved\..*\.old"):
        vitzoo.from_pretrained(tmp_path / "saved")
    second = tiny(2)
    second.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert same_model(vitzoo.from_pretrained(tmp_path / "saved"), second)


def test_a_crash_in_the_swap_then_a_failed_save_brings_the_earlier_save_back(tmp_path):
    """When the next save fails, the directory holds the earlier save again (restored from where the
    crash left it), whole and loadable."""
    from vitzoo.errors import ConfigError

    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    crash_in_the_swap(tmp_path / "saved", seed=1)
    with pytest.raises(ConfigError):
        tiny(3).save_pretrained(tmp_path / "saved", card={"metrics": {"accuracy": None}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert same_model(vitzoo.from_pretrained(tmp_path / "saved"), first)


# ------------------------------------------------------------------ a NaN before the first checkpoint
def test_a_run_that_diverged_before_a_checkpoint_says_how_to_start_again(tmp_path):
    """A NaN with no checkpoint written: the error says nothing can be resumed and how to start again
    in the same --out; a new run there is refused with the same advice; once removed, it runs."""
    import shutil

    from vitzoo.train import fit

    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=rf"no checkpoint was written, so nothing can be resumed: remove {run} "
                                               r"to start again there"):
        fit(train_config(run, lr=1e30))
    with pytest.raises(ValueError, match=r"diverged before its first checkpoint .* remove it to start again there"):
        fit(train_config(run))
    shutil.rmtree(run)
    assert fit(train_config(run))["status"] == "finished"


# ------------------------------------------------------------------ resuming a finished run
def test_resuming_a_finished_run_is_a_no_op_that_says_so(tmp_path, capsys):
    """--resume of a run that finished: nothing is trained or evaluated again, no line is added to
    metrics.jsonl, summary.json is kept byte for byte, its summary is returned, and a line says so."""
    from vitzoo.cli import main
    from vitzoo.train import fit

    run = tmp_path / "run"
    summary = fit(train_config(run))
    before = snapshot(run)
    again = fit(train_config(run, resume=True, quiet=False))
    assert again == json.loads((run / "summary.json").read_text()) and again["test_top1"] == summary["test_top1"]
    assert snapshot(run) == before
    assert f"{run} is finished" in capsys.readouterr().out
    assert main(["train", "--resume", str(run), "--no-quiet"]) == 0
    assert snapshot(run) == before and "nothing to resume" in capsys.readouterr().out
