"""Training: resume equivalence, recipes, schedules, NaN stop, signals, checkpoints, run directory."""

import copy
import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import vitzoo
from vitzoo.errors import DataError
from vitzoo.layers.pos_embed import resample_grid
from vitzoo.train import (
    Schedule,
    TrainConfig,
    TrainingDiverged,
    build,
    fit,
    loop,
    state,
)

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def tiny_config(tmp_path=None, **changes) -> TrainConfig:
    options = dict(TINY)
    options.update(changes.pop("model_options", {}))
    base = dict(model="vit_ti16", model_options=options, data="synthetic", train_limit=256, test_limit=128,
                batch_size=32, steps=8, lr=3e-3, warmup=2, log_every=1, checkpoint_every=0, quiet=True,
                tensorboard=False, device="cpu", out=str(tmp_path / "run") if tmp_path is not None else None)
    base.update(changes)
    return TrainConfig(**base)


def losses(run: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r]


def test_fit_writes_a_complete_run(tmp_path):
    summary = fit(tiny_config(tmp_path, steps=6))
    run = tmp_path / "run"
    for name in ("train_config.json", "config.json", "model.safetensors", "metrics.jsonl", "summary.json"):
        assert (run / name).is_file(), name
    assert summary["status"] == "finished" and summary["step"] == 6
    assert 0.0 <= summary["test_top1"] <= 1.0 and summary["images_per_s"] > 0
    assert json.loads((run / "summary.json").read_text())["step"] == 6
    assert TrainConfig.from_json((run / "train_config.json").read_text()).lr == 3e-3
    model = vitzoo.from_pretrained(run)  # the run directory is a save_pretrained directory
    assert model.config.num_classes == 10 and model.config.img_size == (28, 28)
    assert state.latest(run / "checkpoints").name == "step_00000006"
    assert [s for s, _ in losses(run)] == list(range(1, 7))


def test_every_line_of_metrics_jsonl_is_written_by_metrics(tmp_path, monkeypatch):
    """Training logs, evaluations during training and the final evaluation all go through `Metrics`."""
    written = []

    class Recorded(loop.Metrics):
        def write(self, record, tensorboard=True):
            written.append(json.loads(json.dumps(record)))
            super().write(record, tensorboard)

    monkeypatch.setattr(loop, "Metrics", Recorded)
    fit(tiny_config(tmp_path, steps=4, log_every=2, eval_every=2))
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines == written
    assert [(r["step"], sorted(r)[0]) for r in lines] == [(2, "epoch"), (2, "eval_loss"), (4, "epoch"), (4, "eval_loss")]


@pytest.mark.slow
def test_fit_learns_synthetic_data():
    summary = fit(tiny_config(steps=40, train_limit=512))
    assert summary["test_top1"] > 0.8


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
    assert second["ema_test_loss"] == fit_summary_of(tmp_path / "straight")["ema_test_loss"]


def test_a_run_stopped_at_its_last_step_and_resumed_reports_the_runs_final_loss(tmp_path):
    # a preemption's warning that arrives during the last step: the checkpoint is at the end, nothing is left
    # to train, and the summary still gives the final loss (from the checkpoint)
    straight = fit(tiny_config(tmp_path / "straight", steps=4))
    assert fit(tiny_config(tmp_path / "split", steps=4, stop_at=4))["status"] == "stopped"
    resumed = fit(tiny_config(tmp_path / "split", steps=4, resume=True))
    assert resumed["status"] == "finished" and resumed["step"] == 4
    assert resumed["final_loss"] is not None and resumed["final_loss"] == straight["final_loss"]
    assert resumed["test_top1"] == straight["test_top1"]


def fit_summary_of(root: Path) -> dict:
    return json.loads((root / "run" / "summary.json").read_text())


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


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = loop.loss_fn

    def poisoned(logits, targets, smoothing):
        calls["n"] += 1
        loss = real(logits, targets, smoothing)
        return loss * float("nan") if calls["n"] > 5 else loss

    monkeypatch.setattr(loop, "loss_fn", poisoned)
    # the sixth step's loss is NaN: step 6, as the metrics number steps (the fifth logged step 5)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 6.*last good checkpoint \(step 4\)"):
        fit(tiny_config(tmp_path, checkpoint_every=2))
    run = tmp_path / "run"
    good = state.latest(run / "checkpoints")
    assert good.name == "step_00000004"
    model = vitzoo.from_pretrained(good)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    latest = state.latest(run / "checkpoints")
    assert latest is not None and latest.name == f"step_{summary['step']:08d}"
    assert not list(run.rglob("*.tmp"))



def test_sighup_stops_training_unless_the_run_was_started_ignoring_it():
    """SIGHUP asks the loop to stop as SIGINT does; under nohup (SIGHUP ignored when training starts) it
    stays ignored, so that the run outlives its terminal; the previous handlers come back afterwards."""
    from vitzoo.train.signals import stop_signals

    previous = signal.getsignal(signal.SIGHUP)
    try:
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


def test_missing_or_malformed_data_fails_before_any_work(tmp_path):
    with pytest.raises(DataError, match="not a directory"):
        fit(tiny_config(tmp_path, data="fashion-mnist", data_dir=str(tmp_path / "nowhere")))
    assert not (tmp_path / "run").exists()
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (bad / f"{name}.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="unreadable or not gzip"):
        fit(tiny_config(tmp_path, data="fashion-mnist", data_dir=str(bad)))
    with pytest.raises(DataError, match="no train/"):
        fit(tiny_config(tmp_path, data=str(bad)))
    with pytest.raises(DataError, match="unknown dataset"):
        fit(tiny_config(tmp_path, data="imagenet-not-here"))
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- recipes and schedules
def test_linear_schedule_warmup_and_end():
    s = Schedule("linear", 10, total_steps=110)
    assert s.factor(0) == pytest.approx(0.1)
    assert s.factor(9) == 1.0  # warm-up end: the peak lr
    assert s.factor(60) == pytest.approx(0.5)
    assert s.factor(110) == 0.0  # the end
    assert s.factor(109) > 0.0  # the last update still moves
    c = Schedule("cosine", 0.1, total_steps=100)
    assert c.warmup_steps == 10 and c.factor(9) == 1.0 and c.factor(55) == pytest.approx(0.5) and c.factor(100) < 1e-12
    with pytest.raises(ValueError, match="does not fit"):
        Schedule("linear", 100, total_steps=50)


def test_time_budget_schedule_follows_the_clock():
    s = Schedule("linear", 4, budget_s=100.0)
    assert s.factor(3, 1.0) == 1.0
    assert s.factor(4, 2.0) == pytest.approx(1.0)  # decay starts where the warm-up ended
    assert s.factor(50, 51.0) == pytest.approx(0.5)
    assert s.factor(99, 100.0) == 0.0


def test_recipe_lr_in_a_run(tmp_path):
    fit(tiny_config(tmp_path, steps=20, warmup=None, lr=1e-3))  # recipe warm-up: min(10k, 20 // 10) = 2 steps
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "lr" in line]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-3 / 18)  # linear decay, one step before the end (0 at the end)


def test_paper_pretrain_optimizer():
    cfg = tiny_config().resolved()
    assert (cfg.optimizer, cfg.weight_decay, tuple(cfg.betas), cfg.clip_grad, cfg.schedule) == ("adamw", 0.1, (0.9, 0.999), 1.0, "linear")
    model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    opt = build.build_optimizer(cfg, model, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.999)
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    named = dict(model.named_parameters())
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0
    assert id(named["stem.proj.weight"]) in decayed and id(named["cls_token"]) not in decayed
    assert all(id(p) not in decayed for n, p in named.items() if n.endswith("bias") or "norm" in n)


@pytest.mark.parametrize("recipe", ["paper-pretrain", "paper-finetune"])
def test_optimizer_is_fused_on_cpu_and_steps_like_the_reference(recipe):
    cfg = tiny_config(recipe=recipe, lr=1e-2).resolved()
    torch.manual_seed(0)
    fused_model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    plain_model = copy.deepcopy(fused_model)
    fused = build.build_optimizer(cfg, fused_model, torch.device("cpu"))
    assert fused.defaults["fused"] is True
    twin = dict(zip(map(id, fused_model.parameters()), plain_model.parameters()))
    plain = type(fused)([{**{k: v for k, v in g.items() if k != "fused"}, "params": [twin[id(p)] for p in g["params"]]}
                         for g in fused.param_groups], foreach=False)  # the reference: a for-loop over parameters
    # the same gradients for both: through a backward pass Adam would amplify the rounding noise of the
    # gradients that are zero in exact arithmetic (the key bias)
    for _ in range(3):
        for a, b in zip(fused_model.parameters(), plain_model.parameters()):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        fused.step()
        plain.step()
    for (name, a), b in zip(fused_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_memory_options_reach_the_model():
    """--grad-checkpointing and --store-attention-probabilities trade memory and speed on the built model."""
    for stored in (False, True):
        cfg = tiny_config(grad_checkpointing=stored, store_attention_probabilities=stored)
        resolved = build.resolve_model(cfg)
        model = build.build_model(cfg, resolved, resolved.config.replace(num_classes=10))
        assert model.encoder.grad_checkpointing == stored
        assert [block.attn.store_probabilities for block in model.encoder.blocks] == [stored] * 2


def test_paper_finetune_replaces_head_and_interpolates_pos_embed(tmp_path):
    fit(tiny_config(tmp_path / "pre", steps=3))
    pre = vitzoo.from_pretrained(tmp_path / "pre" / "run")
    assert pre.head.fc.weight.abs().sum() > 0  # trained
    cfg = tiny_config(recipe="paper-finetune", pretrained=str(tmp_path / "pre" / "run"), lr=None, warmup=None,
                      model_options=dict(img_size=56)).resolved()
    assert (cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.schedule, cfg.clip_grad, cfg.reset_head) == ("sgd", 0.9, 0.0, "cosine", 1.0, True)
    resolved = build.resolve_model(cfg)
    model = build.build_model(cfg, resolved, resolved.config.replace(num_classes=10))
    assert model.config.img_size == (56, 56)
    assert model.head.fc.weight.abs().sum() == 0 and model.head.fc.bias.abs().sum() == 0
    pos_old = next(p for n, p in pre.named_parameters() if "pos" in n)[0]
    pos_new = next(p for n, p in model.named_parameters() if "pos" in n)[0]
    assert pos_new.shape[0] == 1 + 8 * 8
    torch.testing.assert_close(pos_new[1:], resample_grid(pos_old[1:], (4, 4), (8, 8)))
    torch.testing.assert_close(pos_new[:1], pos_old[:1])
    opt = build.build_optimizer(cfg, model, torch.device("cpu"))
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)
    summary = fit(tiny_config(tmp_path / "ft", recipe="paper-finetune", pretrained=str(tmp_path / "pre" / "run"),
                              lr=0.01, steps=3, warmup=1, model_options=dict(img_size=56)))
    assert summary["model_config"]["img_size"] == [56, 56] and summary["status"] == "finished"


# ---------------------------------------------------------------------------- checkpoints
def test_checkpoints_are_atomic(tmp_path, monkeypatch):
    model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    directory = tmp_path / "checkpoints"
    state.save(directory, 1, model, {"step": 1})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state.save(directory, 2, model, {"step": 2})
    assert state.latest(directory).name == "step_00000002"
    assert [p.name for p in directory.iterdir() if p.is_dir()] == ["step_00000002"]  # keep=1
    assert not [p for p in directory.rglob("*") if p.name.startswith(".")]  # no temp files
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)  # the crash happens after the weights were written
    with pytest.raises(OSError, match="disk full"):
        state.save(directory, 3, model, {"step": 3})
    monkeypatch.undo()
    assert state.latest(directory).name == "step_00000002"
    assert not (directory / "step_00000003").exists()
    assert not [p for p in directory.rglob("*") if p.name.startswith(".")]
    restored = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    saved = state.load(state.latest(directory), restored)
    assert saved["step"] == 2
    for k, v in restored.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_bf16_autocast_on_cpu_and_gradient_accumulation(tmp_path):
    # the mixed-precision path is the one CUDA takes (autocast, float32 loss, scaler disabled for bf16)
    summary = fit(tiny_config(steps=4, precision="bf16", micro_batch=8))
    assert summary["precision"] == "bfloat16" and summary["status"] == "finished"
    assert summary["final_loss"] == summary["final_loss"]  # not NaN
    with pytest.raises(ValueError, match="fp16 needs CUDA"):
        fit(tiny_config(steps=4, precision="fp16", device="cpu"))
    with pytest.raises(ValueError, match="not a multiple"):
        fit(tiny_config(steps=4, micro_batch=5))


@pytest.mark.skipif(not all((Path("/usr/share/datasets/fashion-mnist") / f).is_file() for f in
                            ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz")),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_subset_run_records_its_normalisation(tmp_path, monkeypatch):
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))
    fit(tiny_config(tmp_path, data="fashion-mnist", train_limit=512, test_limit=256, steps=4))
    model = vitzoo.from_pretrained(tmp_path / "run")
    assert model.config.in_chans == 1 and model.config.mean == (0.2860,) and model.config.std == (0.3530,)


def test_time_budget_run_ends_on_time():
    summary = fit(tiny_config(steps=None, time_budget_min=0.05, warmup=0.1))
    assert summary["status"] == "finished" and 3.0 <= summary["train_seconds"] < 6.0
    assert summary["total_steps"] is None and summary["step"] > 0


def test_a_pretrained_directory_of_another_model_than_named_is_trained_with_a_warning(tmp_path):
    """The saved model decides what is trained; a model name that says otherwise is flagged."""
    fit(tiny_config(tmp_path / "pre", steps=3, warmup=1))
    with pytest.warns(UserWarning, match=r"holds another model than vit_b16: embed_dim=32 \(not 768\)"):
        cfg = tiny_config(tmp_path / "ft", model="vit_b16", pretrained=str(tmp_path / "pre" / "run"), steps=3, warmup=1)
        summary = fit(dataclasses.replace(cfg, model_options={}))  # B/16 as named, nothing of TINY
    assert summary["model_config"]["embed_dim"] == 32


def test_the_small_recipe_is_the_cpu_scales_and_warms_up_over_a_twentieth_of_the_run():
    from benchmarks.scales import SMALL_RECIPE

    cfg = TrainConfig(recipe="small").resolved()
    for knob in ("lr", "batch_size", "weight_decay", "schedule", "clip_grad"):
        assert getattr(cfg, knob) == {**SMALL_RECIPE, "lr": 2e-3}[knob], knob
    assert cfg.optimizer == "adamw" and cfg.recipe_warmup(total_steps=468) == 0.05  # a fraction of the run


def test_a_run_resumed_where_auto_would_choose_another_precision_keeps_the_one_it_trained_in(tmp_path, monkeypatch):
    """A job requeued onto another kind of machine (an H100's bf16, then a V100's fp16; here the CPU's
    stand-in for them) resumes in the precision of its checkpoint: the same losses as the run never moved."""

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
