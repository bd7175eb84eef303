"""A training run that meets a fault says what it is and keeps what it can: a NaN loss is reported
at the step the metrics give it and blames its cause, a failed evaluation after the last step leaves
the trained model, and a run resumes past a damaged pointer or checkpoint, or from where it was
moved, with the losses of an uninterrupted run; with nothing left to resume from it stops and
deletes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_testing import TINY, losses, short_config, snapshot, summary_of  # tests/train_testing.py

import vitzoo
from vitzoo.errors import CheckpointError, TrainingDiverged
from vitzoo.train import fit


@pytest.mark.parametrize("log_every", [1, 3])
def test_a_nan_is_reported_at_the_step_the_metrics_give_it(tmp_path, log_every):
    """The step a NaN loss is reported at is numbered as the metrics number steps (1 for the first):
    the metrics' last line is the step before it, and summary.json gives the same step."""
    config = short_config(tmp_path / "run", model_options={**TINY, "depth": 1}, train_limit=32,
                          test_limit=16, steps=3, lr=1e30, warmup=0, log_every=log_every)
    with pytest.raises(TrainingDiverged) as err:
        fit(config)
    step = int(str(err.value).split(" at step ")[1].split()[0].rstrip(";,"))
    logged = dict(losses(tmp_path / "run"))
    # the steps before it logged finite losses, the last of them numbered step - 1; summary.json agrees
    assert step >= 1 and (max(logged, default=0) == step - 1 or log_every > 1)
    assert all(loss is not None and loss == loss for loss in logged.values())
    summary = summary_of(tmp_path)
    assert summary["status"] == "diverged" and summary["step"] == step


def test_a_nan_loss_from_the_normalisation_does_not_advise_a_lower_learning_rate(tmp_path):
    """A loss that is NaN because the normalised images are not finite (here a std so small that x /
    std overflows) says so and names mean and std; it does not advise lowering the learning rate."""
    config = short_config(tmp_path / "run", model_options={**TINY, "std": 1e-45})
    with pytest.raises(TrainingDiverged,
                       match="normalised images hold NaN or infinite values") as err:
        fit(config)
    assert "learning rate" not in str(err.value) and "std" in str(err.value)


def test_a_crash_in_fewshot_evaluation_still_leaves_the_weights_and_summary(tmp_path, monkeypatch):
    """A training whose few-shot evaluation fails after the last step raises that error, and the run
    still holds the trained model (loadable) and summary.json, which records the failure."""
    from vitzoo.train import build

    def broken(*args, **kwargs):
        raise RuntimeError("few-shot broke")

    monkeypatch.setattr(build, "fewshot_linear_accuracy", broken)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="few-shot broke") as err:
        fit(short_config(run, fewshot=(1,)))
    assert "trained model and summary.json are saved" in "".join(getattr(err.value, "__notes__", []))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 2
    assert summary["fewshot_error"] == "RuntimeError: few-shot broke"
    assert vitzoo.from_pretrained(run).config.embed_dim == TINY["embed_dim"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[tuple[int, float]]:
    """The losses of the 6-step run the resumed runs below must reproduce."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    fit(short_config(run, steps=6))
    return losses(run)


def stopped_run(tmp_path, keep: int = 1) -> Path:
    """A 6-step run stopped after step 4, with a checkpoint every 2 steps."""
    run = tmp_path / "run"
    fit(short_config(run, steps=6, stop_at=4, checkpoint_every=2, keep_checkpoints=keep))
    return run


def resume(run: Path):
    return fit(short_config(run, steps=6, checkpoint_every=2, resume=True))


@pytest.mark.parametrize("pointer",
                         [b"step_00000099\n", b"", b"\xff\xfe garbage", b"../../elsewhere\n"])
def test_resume_with_a_damaged_latest_pointer_uses_the_newest_complete_checkpoint(
        tmp_path, uninterrupted, pointer):
    """A `checkpoints/latest` that names a missing directory, is empty, unreadable or points outside
    the run is said (a warning) and the newest complete checkpoint is resumed from: the run goes on
    at step 5 and its losses are those of an uninterrupted run."""
    run = stopped_run(tmp_path)
    (run / "checkpoints" / "latest").write_bytes(pointer)
    with pytest.warns(UserWarning,
                      match="resuming from the newest complete checkpoint, step_00000004"):
        summary = resume(run)
    assert summary["step"] == 6 and losses(run) == uninterrupted


def test_resume_with_a_damaged_pointer_and_no_complete_checkpoint_stops(tmp_path):
    """With the pointer naming a missing checkpoint and none complete left, resume stops with a
    CheckpointError that says so, instead of starting again from step 0; nothing is deleted."""
    run = stopped_run(tmp_path)
    (run / "checkpoints" / "step_00000004" / "state.pt").unlink()
    (run / "checkpoints" / "latest").write_text("step_00000099\n")
    before = snapshot(run)
    with pytest.raises(CheckpointError,
                       match=r"latest names 'step_00000099', which is not a complete checkpoint.*"
                                              r"holds no complete checkpoint"):
        resume(run)
    assert snapshot(run) == before


@pytest.mark.parametrize("damaged", ["model.safetensors", "state.pt"])
def test_resume_from_a_truncated_checkpoint_names_it_and_uses_the_previous_one(
        tmp_path, uninterrupted, damaged):
    """A truncated file in the newest checkpoint is named (a warning) and the previous checkpoint is
    resumed from; the losses are those of an uninterrupted run."""
    run = stopped_run(tmp_path, keep=2)
    path = run / "checkpoints" / "step_00000004" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.warns(UserWarning,
                      match=rf"step_00000004/{damaged} is damaged or truncated.*previous "
                            rf"checkpoint, step_00000002"):
        summary = resume(run)
    assert summary["step"] == 6 and losses(run) == uninterrupted


def test_resume_from_the_only_checkpoint_truncated_stops_and_keeps_it(tmp_path):
    """When the only checkpoint is truncated, resume stops with a CheckpointError naming the file;
    the checkpoint is kept for the user to restore."""
    run = stopped_run(tmp_path)
    path = run / "checkpoints" / "step_00000004" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    before = snapshot(run)
    with pytest.raises(CheckpointError,
                       match=r"no checkpoint reads: .*step_00000004/model.safetensors is damaged"):
        resume(run)
    assert snapshot(run) == before


@pytest.mark.parametrize("how", ["move", "copy"])
def test_a_moved_or_copied_run_resumes(tmp_path, uninterrupted, how):
    """A run directory moved or copied elsewhere resumes from its checkpoint there, with the same
    losses."""
    import shutil

    run = stopped_run(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "run"
    elsewhere.parent.mkdir()
    (shutil.move if how == "move" else shutil.copytree)(run, elsewhere)
    summary = resume(elsewhere)
    assert summary["step"] == 6 and losses(elsewhere) == uninterrupted
