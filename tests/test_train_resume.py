"""Exact resume: a run stopped by `stop_at`, a signal or kill -9 and resumed with --resume
computes what the uninterrupted run computes, to the bit; a resume that cannot be exact is refused
or said."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from train_testing import TINY, flags, lines, losses, short_config, tiny_config

from vitzoo.cli import main
from vitzoo.precision import training_dtype
from vitzoo.train import Trainer, checkpoint, fit, loop


def same_weights(a, b, name="model.safetensors") -> bool:
    return all(torch.equal(x, y) for x, y in zip(load_file(a / name).values(),
                                                load_file(b / name).values()))


def test_a_resumed_run_computes_what_the_uninterrupted_one_does(tmp_path):
    # dropout, stochastic depth, flips, crops and MixUp draw random numbers; 4 steps an epoch, so
    # the stop falls inside one; the moving average and layer-wise decay go on where they stopped
    changes = dict(model_options=dict(dropout=0.1, drop_path=0.1), train_limit=128, hflip=True,
                   crop_padding=2, mixup=0.2, steps=10, model_ema=True, model_ema_decay=0.8,
                   layer_decay=0.75)
    straight = fit(tiny_config(tmp_path / "straight", **changes))
    assert fit(tiny_config(tmp_path / "split", stop_at=5, **changes))["status"] == "stopped"
    split = fit(tiny_config(tmp_path / "split", resume=True, **changes))
    assert split["status"] == "finished" and split["step"] == 10
    assert losses(tmp_path / "split" / "run") == losses(tmp_path / "straight" / "run")
    for name in ("model.safetensors", "model_ema.safetensors"):
        assert same_weights(tmp_path / "straight" / "run", tmp_path / "split" / "run", name)
    assert split["ema_test_loss"] == straight["ema_test_loss"]


SIGNALLED = dict(**TINY, data="synthetic", train_limit=64, test_limit=32, batch_size=16, steps=80,
                 warmup=1, checkpoint_every=2, log_every=1, device="cpu")


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory):
    whole = tmp_path_factory.mktemp("whole")
    assert main(["train", "--out", str(whole), "--quiet", "--no-tensorboard", *flags(**SIGNALLED)
                 ]) == 0
    return whole


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=lambda s: s.name)
def test_a_run_stopped_by_a_signal_or_killed_resumes_to_the_same_weights(tmp_path, sent,
                                                                        never_stopped):
    """SIGINT and SIGTERM end training at the end of a step with a checkpoint, the exit status
    saying which; kill -9 leaves the last checkpoint. `--resume` then gives the weights of the
    run never stopped, to the bit."""
    run = tmp_path / "run"
    threads = str(torch.get_num_threads())  # the order of a float sum: the same in both
    command = [sys.executable, "-m", "vitzoo", "train", "vit_ti16", "--quiet", "--no-tensorboard",
               "--out", str(run), *flags(**SIGNALLED)]
    # started as a terminal starts it: SIGINT's default, not the ignore a background job inherits
    proc = subprocess.Popen(command, text=True, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": threads},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not ((run / "checkpoints" / "latest").exists() and len(lines(run)) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sent)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == (-sent if sent == signal.SIGKILL else 128 + sent), err
    if sent != signal.SIGKILL:
        summary = json.loads((run / "summary.json").read_text())
        assert "Traceback" not in err and summary["signal"] == sent.name
        assert checkpoint.latest(run / "checkpoints").name == f"step_{summary['step']:08d}"
    assert main(["train", "--resume", str(run)]) == 0
    assert same_weights(run, never_stopped) and not list(run.rglob("*.tmp"))


def test_a_run_stopped_at_its_last_step_reports_the_final_loss_when_resumed(tmp_path):
    straight = fit(tiny_config(tmp_path / "straight", steps=4))
    fit(tiny_config(tmp_path / "split", steps=4, stop_at=4))
    resumed = fit(tiny_config(tmp_path / "split", steps=4, resume=True))
    assert resumed["status"] == "finished" and resumed["step"] == 4
    for key in ("final_loss", "test_top1"):
        assert resumed[key] is not None and resumed[key] == straight[key]


def test_resume_drops_a_half_written_metrics_line(tmp_path):
    fit(tiny_config(tmp_path, stop_at=2, steps=4))
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 3, "lo')
    assert fit(tiny_config(tmp_path, resume=True, steps=4))["status"] == "finished"
    assert [s for s, _ in losses(tmp_path / "run")] == [1, 2, 3, 4]


def test_resume_refuses_changed_settings_and_a_new_run_refuses_the_run(tmp_path):
    fit(tiny_config(tmp_path, val_size=100, stop_at=2))
    for changes, said in ((dict(lr=1.0), r"different settings \(lr: 0.003 -> 1.0\)"),
                          (dict(val_size=200), r"val_size: 100 -> 200"),
                          (dict(keep_best=True, eval_every=2), r"keep_best: False -> True")):
        with pytest.raises(ValueError, match=said):
            fit(tiny_config(tmp_path, resume=True, **{"val_size": 100, **changes}))
    with pytest.raises(ValueError, match=r"already holds .*a run: pass --resume to continue it"):
        fit(tiny_config(tmp_path, val_size=100))


def test_a_resume_with_no_checkpoint_says_it_starts_from_step_0(tmp_path, capsys):
    Trainer.from_config(tiny_config(tmp_path, steps=2, warmup=1))  # set up, never trained
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert fit(tiny_config(tmp_path, steps=2, warmup=1, resume=True))["step"] == 2
    assert f"no checkpoint in {tmp_path / 'run'}: starting from step 0" in capsys.readouterr().err


def test_sighup_and_sigusr2_stop_as_sigint_does_unless_ignored_at_start():
    """Under nohup SIGHUP is ignored when training starts, so the run outlives its terminal."""
    from vitzoo.train.distributed import stop_signals

    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal starts a process
    try:
        for sent in (signal.SIGHUP, signal.SIGUSR2):
            with stop_signals(flag := {}):
                signal.raise_signal(sent)
            assert flag == {"signal": sent}
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts one
        with stop_signals(flag := {}):
            signal.raise_signal(signal.SIGHUP)
        assert flag == {} and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_checkpoints_come_every_k_steps_at_each_epochs_end_and_by_time(tmp_path):
    """4 steps an epoch: --checkpoint-every 1000 still checkpoints at step 4 and at the end (6);
    --checkpoint-every-min after that many minutes of training (here: every step)."""
    for name, minutes, steps, kept in (("a", 10, 6, [4, 6]), ("b", 1e-9, 3, [1, 2, 3])):
        fit(short_config(tmp_path / name / "run", steps=steps, checkpoint_every=1000,
                         checkpoint_every_min=minutes, keep_checkpoints=5))
        found = (tmp_path / name / "run" / "checkpoints").glob("step_*")
        assert sorted(int(p.name[5:]) for p in found) == kept


def test_a_run_resumed_where_auto_would_choose_another_precision_keeps_its_own(tmp_path,
                                                                              monkeypatch):
    """A job requeued from a bf16 GPU onto one that would choose otherwise (here a stand-in for
    the rule) resumes in its checkpoint's precision, with the losses of the run never moved."""
    monkeypatch.setattr(loop, "training_dtype", lambda precision, device: torch.bfloat16)
    fit(tiny_config(tmp_path / "straight", steps=4))
    fit(tiny_config(tmp_path / "moved", steps=4, stop_at=2))
    shutil.copytree(tmp_path / "moved", tmp_path / "fp16")
    monkeypatch.setattr(loop, "training_dtype", lambda precision, device: None  # auto's rule
                        if precision == "auto" else training_dtype(precision, device))
    summary = fit(tiny_config(tmp_path / "moved", steps=4, resume=True))
    assert summary["precision"] == "bfloat16"
    assert losses(tmp_path / "moved" / "run") == losses(tmp_path / "straight" / "run")
    path = tmp_path / "fp16" / "run" / "checkpoints" / "step_00000002" / "state.pt"
    torch.save({**torch.load(path), "precision": "fp16"}, path)  # trained on a GPU in fp16
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        fit(tiny_config(tmp_path / "fp16", steps=4, resume=True))
