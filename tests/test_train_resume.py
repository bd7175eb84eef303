"""Exact resume: a run stopped by `stop_at`, a signal or a crash and resumed with --resume computes
what the uninterrupted run computes, from checkpoints written atomically; a resume that cannot be
exact is refused or said."""

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_testing import TINY, losses, summary_of, tiny_config

import vitzoo
from vitzoo.train import build, checkpoint, fit, loop


def test_resume_gives_the_same_losses(tmp_path):
    # dropout, stochastic depth, augmentation and MixUp all draw random numbers; 4 steps per epoch, so
    # the interruption falls inside an epoch and the run crosses epochs
    # ... and the moving average of the weights (--model-ema) and layer-wise decay go on where they stopped
    changes = dict(model_options=dict(dropout=0.1, drop_path=0.1), train_limit=128, hflip=True, crop_padding=2,
                   mixup=0.2, steps=10, model_ema=True, model_ema_decay=0.8, layer_decay=0.75)
    fit(tiny_config(tmp_path / "straight", **changes))
    first = fit(tiny_config(tmp_path / "split", stop_at=5, **changes))
    assert first["status"] == "stopped" and first["step"] == 5
    second = fit(tiny_config(tmp_path / "split", resume=True, **changes))
    assert second["status"] == "finished" and second["step"] == 10
    straight, split = losses(tmp_path / "straight" / "run"), losses(tmp_path / "split" / "run")
    assert [s for s, _ in split] == list(range(1, 11))
    for (s1, a), (s2, b) in zip(straight, split):
        assert s1 == s2 and abs(a - b) <= 1e-6, (s1, a, b)
    a = vitzoo.from_pretrained(tmp_path / "straight" / "run").state_dict()
    b = vitzoo.from_pretrained(tmp_path / "split" / "run").state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    from safetensors.torch import load_file

    a, b = (load_file(tmp_path / run / "run" / "model_ema.safetensors") for run in ("straight", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert second["ema_test_loss"] == summary_of(tmp_path / "straight")["ema_test_loss"]

def test_a_run_stopped_at_its_last_step_and_resumed_reports_the_runs_final_loss(tmp_path):
    # a preemption's warning that arrives during the last step: the checkpoint is at the end, nothing is left
    # to train, and the summary still gives the final loss (from the checkpoint)
    straight = fit(tiny_config(tmp_path / "straight", steps=4))
    assert fit(tiny_config(tmp_path / "split", steps=4, stop_at=4))["status"] == "stopped"
    resumed = fit(tiny_config(tmp_path / "split", steps=4, resume=True))
    assert resumed["status"] == "finished" and resumed["step"] == 4
    assert resumed["final_loss"] is not None and resumed["final_loss"] == straight["final_loss"]
    assert resumed["test_top1"] == straight["test_top1"]

def test_resume_survives_a_half_written_metrics_line(tmp_path):
    """A run killed while writing metrics.jsonl leaves a partial last line: resuming drops it."""
    fit(tiny_config(tmp_path, stop_at=2, steps=4))
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 3, "lo')
    summary = fit(tiny_config(tmp_path, resume=True, steps=4))
    assert summary["status"] == "finished"
    assert [s for s, _ in losses(tmp_path / "run")] == [1, 2, 3, 4]

def test_resume_refuses_changed_settings(tmp_path):
    fit(tiny_config(tmp_path, stop_at=2))
    with pytest.raises(ValueError, match="lr"):
        fit(tiny_config(tmp_path, stop_at=2, resume=True, lr=1.0))
    with pytest.raises(ValueError, match="already holds a run"):
        fit(tiny_config(tmp_path))

def test_a_resume_with_no_checkpoint_says_it_starts_from_step_0(tmp_path, capsys):
    """A run stopped before its first checkpoint holds train_config.json and nothing to resume: the
    resume trains from step 0, and says so (quiet or not)."""
    loop.Trainer.from_config(tiny_config(tmp_path, steps=2, warmup=1))  # set up, never trained: its settings alone
    assert (tmp_path / "run" / "train_config.json").exists() and not (tmp_path / "run" / "checkpoints").exists()
    summary = fit(tiny_config(tmp_path, steps=2, warmup=1, resume=True))
    assert summary["status"] == "finished" and summary["step"] == 2
    assert f"no checkpoint in {tmp_path / 'run'}: starting from step 0" in capsys.readouterr().err

def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}

def test_resuming_a_finished_run_is_a_no_op_that_says_so(tmp_path, capsys):
    """--resume of a run that finished: nothing is trained or evaluated again, no line is added to
    metrics.jsonl, summary.json is kept byte for byte, its summary is returned, and a line says so."""
    from vitzoo.cli import main

    run = tmp_path / "run"
    summary = fit(tiny_config(tmp_path, train_limit=32, test_limit=16, batch_size=16, steps=2, warmup=0, model_options=dict(depth=1)))
    before = snapshot(run)
    again = fit(tiny_config(tmp_path, resume=True, quiet=False, train_limit=32, test_limit=16, batch_size=16, steps=2, warmup=0, model_options=dict(depth=1)))
    assert again == json.loads((run / "summary.json").read_text()) and again["test_top1"] == summary["test_top1"]
    assert snapshot(run) == before
    assert f"{run} is finished" in capsys.readouterr().out
    assert main(["train", "--resume", str(run), "--no-quiet"]) == 0
    assert snapshot(run) == before and "nothing to resume" in capsys.readouterr().out

# SIGHUP's process run is slow-marked (15-45 s on a busy machine): the fast lane checks its handler in process
@pytest.mark.parametrize("sent", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path, sent):
    """SIGTERM (a scheduler) and SIGHUP (the terminal that started the run closed) end training at the
    end of a step with a checkpoint, as SIGINT does; the exit status says which signal."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "vitzoo", "train", "vit_ti16", "--data", "synthetic", "--steps", "100000",
           "--batch-size", "16", "--train-limit", "256", "--test-limit", "64", "--checkpoint-every", "0",
           "--log-every", "1", "--out", str(run), "--quiet", "--no-tensorboard", "--device", "cpu"]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    # started as a terminal starts it, SIGHUP's default disposition kept (nohup's pytest ignores it)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.time() + 120
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "training did not start"
        time.sleep(0.2)
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sent, err
    assert "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == sent.name
    latest = checkpoint.latest(run / "checkpoints")
    assert latest is not None and latest.name == f"step_{summary['step']:08d}"
    assert not list(run.rglob("*.tmp"))


def test_sighup_stops_training_unless_the_run_was_started_ignoring_it():
    """SIGHUP asks the loop to stop as SIGINT does; under nohup (SIGHUP ignored when training starts) it
    stays ignored, so that the run outlives its terminal; the previous handlers come back afterwards."""
    from vitzoo.train.distributed import stop_signals

    previous = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal starts a process
        flag = {}
        with stop_signals(flag):
            signal.raise_signal(signal.SIGHUP)
        assert flag == {"signal": signal.SIGHUP}
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a process
        flag = {}
        with stop_signals(flag):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
        assert flag == {} and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_checkpoints_are_atomic(tmp_path, monkeypatch):
    model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    directory = tmp_path / "checkpoints"
    checkpoint.save(directory, 1, model, {"step": 1})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    checkpoint.save(directory, 2, model, {"step": 2})
    assert checkpoint.latest(directory).name == "step_00000002"
    assert [p.name for p in directory.iterdir() if p.is_dir()] == ["step_00000002"]  # keep=1
    assert not [p for p in directory.rglob("*") if p.name.startswith(".")]  # no temp files
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)  # the crash happens after the weights were written
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(directory, 3, model, {"step": 3})
    monkeypatch.undo()
    assert checkpoint.latest(directory).name == "step_00000002"
    assert not (directory / "step_00000003").exists()
    assert not [p for p in directory.rglob("*") if p.name.startswith(".")]
    restored = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    saved = checkpoint.load(checkpoint.latest(directory), restored)
    assert saved["step"] == 2
    for k, v in restored.state_dict().items():
        torch.testing.assert_close(v, before[k])

def test_checkpoints_come_at_each_epochs_end_and_by_time_whichever_first(tmp_path):
    """256 images in batches of 32: 8 steps an epoch, shorter than --checkpoint-every's 1000."""
    trainer = loop.Trainer.from_config(tiny_config(tmp_path, steps=12, checkpoint_every=1000, checkpoint_every_min=10))
    trainer._start_loop()
    due = {}
    for step, seconds in ((5, 0.0), (8, 0.0), (16, 0.0), (5, 599.0), (5, 600.0), (1000, 0.0)):
        trainer.step, trainer.train_seconds = step, seconds
        due[step, seconds] = trainer.checkpoint_due()
    assert due == {(5, 0.0): False, (8, 0.0): True, (16, 0.0): True, (5, 599.0): False, (5, 600.0): True,
                   (1000, 0.0): True}
    trainer.last_checkpoint_s = 600.0  # counted from the last checkpoint
    trainer.step, trainer.train_seconds = 5, 900.0
    assert not trainer.checkpoint_due()
    trainer.cfg.checkpoint_every = 0  # the end's checkpoint only
    trainer.step = 8
    assert not trainer.checkpoint_due()
    # and in a run: the epoch's end (step 8) and the end (12) are checkpointed
    summary = fit(tiny_config(tmp_path / "run2", steps=12, checkpoint_every=1000, keep_checkpoints=5))
    assert summary["status"] == "finished"
    kept = sorted(p.name for p in (tmp_path / "run2" / "run" / "checkpoints").glob("step_*"))
    assert kept == ["step_00000008", "step_00000012"]

def test_a_run_resumed_where_auto_would_choose_another_precision_keeps_the_one_it_trained_in(tmp_path, monkeypatch):
    """A job requeued onto another kind of machine (an H100's bf16, then a V100's fp16; here a
    stand-in for the rule) resumes in the precision of its checkpoint: the same losses as the run
    never moved."""

    def machine_picks(dtype):
        monkeypatch.setattr(loop, "training_dtype", lambda precision, device: dtype)

    machine_picks(torch.bfloat16)
    fit(tiny_config(tmp_path / "straight", precision="auto", steps=6))
    fit(tiny_config(tmp_path / "moved", precision="auto", steps=6, stop_at=3))
    machine_picks(None)  # the machine it resumes on would compute in float32
    messages = []
    monkeypatch.setattr(loop.Trainer, "say", lambda self, message: messages.append(message))
    summary = fit(tiny_config(tmp_path / "moved", precision="auto", steps=6, resume=True))
    assert summary["precision"] == "bfloat16"
    assert any("resuming in bf16, the precision the checkpoint was trained in, not fp32" in m for m in messages)
    assert losses(tmp_path / "moved" / "run") == losses(tmp_path / "straight" / "run")

def test_an_fp16_checkpoint_cannot_go_on_without_cuda():
    with pytest.raises(vitzoo.errors.ConfigError, match="trained in fp16, which needs CUDA"):
        build.resumed_precision("fp16", None, torch.device("cpu"))
    assert build.resumed_precision(None, torch.bfloat16, torch.device("cpu")) == torch.bfloat16  # older checkpoints
