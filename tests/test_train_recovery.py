"""A run that meets a fault says what it is and keeps what it can: a NaN loss is reported at its
step with its cause and the last good checkpoint, a failed few-shot evaluation keeps the last
checkpoint, a damaged checkpoint is named and nothing deleted, and a moved run resumes with the
losses of an uninterrupted run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from train_testing import TINY, losses, short_config, snapshot, summary_of, tiny_config

import vitzoo
from vitzoo.errors import CheckpointError, TrainingDiverged
from vitzoo.train import checkpoint, fit, loop


def poison(monkeypatch, from_call: int) -> None:
    """The loss is NaN from its `from_call`-th computation on (one a step here)."""
    calls, real = [], loop.loss_fn

    def poisoned(logits, targets, smoothing):
        calls.append(1)
        return real(logits, targets, smoothing) * (float("nan") if len(calls) >= from_call else 1)

    monkeypatch.setattr(loop, "loss_fn", poisoned)


def test_a_nan_is_reported_at_its_step_and_the_last_good_checkpoint_kept(tmp_path, monkeypatch):
    """Losses are read at log time (every 4 steps), yet a NaN at step 6 is step 6's; the
    checkpoint of step 4 stays whole, and summary.json says the run diverged there."""
    poison(monkeypatch, 6)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 6.*last good checkpoint "
                                               r"\(step 4\).*lower the learning rate"):
        fit(tiny_config(tmp_path, log_every=4, checkpoint_every=2))
    good = checkpoint.latest(tmp_path / "run" / "checkpoints")
    assert good.name == "step_00000004" and [s for s, _ in losses(tmp_path / "run")] == [4]
    assert all(torch.isfinite(p).all() for p in vitzoo.from_pretrained(good).parameters())
    assert summary_of(tmp_path)["status"] == "diverged" and summary_of(tmp_path)["step"] == 6


def test_a_nan_before_any_checkpoint_says_how_to_start_again(tmp_path):
    with pytest.raises(TrainingDiverged, match=rf"no checkpoint was written: remove "
                                               rf"{tmp_path / 'run'} to start again there"):
        fit(short_config(tmp_path / "run", lr=1e30, warmup=0))


def test_a_nan_from_the_normalisation_blames_the_data_not_the_learning_rate(tmp_path):
    """A std so small that x / std overflows: the normalised images are not finite."""
    with pytest.raises(TrainingDiverged, match="normalised images hold NaN or infinite values"
                       ) as err:
        fit(short_config(tmp_path / "run", model_options={**TINY, "std": 1e-45}))
    assert "learning rate" not in str(err.value) and "--mean, --std" in str(err.value)


def test_a_failed_fewshot_evaluation_keeps_the_last_checkpoint_and_resume_finishes(tmp_path,
                                                                                  monkeypatch):
    from vitzoo.train import report

    def broken(*args, **kwargs):
        raise RuntimeError("few-shot broke")

    monkeypatch.setattr(report, "fewshot_linear_accuracy", broken)
    with pytest.raises(RuntimeError, match="few-shot broke"):
        fit(short_config(tmp_path / "run", fewshot=(1,)))
    assert checkpoint.latest(tmp_path / "run" / "checkpoints").name == "step_00000002"
    assert fit(short_config(tmp_path / "run", resume=True))["status"] == "finished"
    assert vitzoo.from_pretrained(tmp_path / "run").config.embed_dim == TINY["embed_dim"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[tuple[int, float]]:
    """The losses of the 6-step run that the resumed runs below must reproduce."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    fit(short_config(run, steps=6))
    return losses(run)


def stopped_run(tmp_path) -> Path:
    """A 6-step run stopped after step 4, with the checkpoints of steps 2 and 4."""
    fit(short_config(tmp_path / "run", steps=6, stop_at=4, checkpoint_every=2, keep_checkpoints=2))
    return tmp_path / "run"


def resume(run: Path):
    return fit(short_config(run, steps=6, checkpoint_every=2, keep_checkpoints=2, resume=True))


@pytest.mark.parametrize("damage", ["a pointer out of the run", "a truncated checkpoint"])
def test_a_damaged_checkpoint_is_named_and_resume_stops_deleting_nothing(tmp_path, damage):
    run = stopped_run(tmp_path)
    path = run / "checkpoints" / "step_00000004" / "model.safetensors"
    if damage == "a pointer out of the run":
        (run / "checkpoints" / "latest").write_text("../../elsewhere\n")
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = snapshot(run)
    with pytest.raises(CheckpointError, match="is not a checkpoint of" if "pointer" in damage
                       else "step_00000004/model.safetensors is damaged, truncated"):
        resume(run)
    assert snapshot(run) == before


def test_a_moved_run_resumes_where_it_is(tmp_path, uninterrupted):
    shutil.move(stopped_run(tmp_path), tmp_path / "elsewhere")
    assert resume(tmp_path / "elsewhere")["step"] == 6
    assert losses(tmp_path / "elsewhere") == uninterrupted
