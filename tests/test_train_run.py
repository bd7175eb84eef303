"""A training run end to end: what it writes, what it learns, its recipes and precisions, and how
bad data or a diverging loss stop it."""

import csv
import dataclasses
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from train_testing import losses, tiny_config

import vitzoo
from vitzoo.errors import DataError
from vitzoo.layers.pos_embed import resample_grid
from vitzoo.train import TrainConfig, TrainingDiverged, build, checkpoint, fit, loop, optim, summary


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
    assert checkpoint.latest(run / "checkpoints").name == "step_00000006"
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
    good = checkpoint.latest(run / "checkpoints")
    assert good.name == "step_00000004"
    model = vitzoo.from_pretrained(good)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"

def test_a_run_that_diverged_before_a_checkpoint_says_how_to_start_again(tmp_path):
    """A NaN with no checkpoint written: the error says nothing can be resumed and how to start again
    in the same --out; a new run there is refused with the same advice; once removed, it runs."""
    import shutil

    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match=rf"no checkpoint was written, so nothing can be resumed: remove {run} "
                                               r"to start again there"):
        fit(tiny_config(tmp_path, lr=1e30, train_limit=32, test_limit=16, batch_size=16, steps=2, warmup=0, model_options=dict(depth=1)))
    with pytest.raises(ValueError, match=r"diverged before its first checkpoint .* remove it to start again there"):
        fit(tiny_config(tmp_path, train_limit=32, test_limit=16, batch_size=16, steps=2, warmup=0, model_options=dict(depth=1)))
    shutil.rmtree(run)
    assert fit(tiny_config(tmp_path, train_limit=32, test_limit=16, batch_size=16, steps=2, warmup=0, model_options=dict(depth=1)))["status"] == "finished"

def test_recipe_lr_in_a_run(tmp_path):
    fit(tiny_config(tmp_path, steps=20, warmup=None, lr=1e-3))  # recipe warm-up: min(10k, 20 // 10) = 2 steps
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "lr" in line]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-3 / 18)  # linear decay, one step before the end (0 at the end)

def test_the_small_recipe_is_the_cpu_scales_and_warms_up_over_a_twentieth_of_the_run():
    from benchmarks.scales import SMALL_RECIPE

    cfg = TrainConfig(recipe="small").resolved()
    for knob in ("lr", "batch_size", "weight_decay", "schedule", "clip_grad"):
        assert getattr(cfg, knob) == {**SMALL_RECIPE, "lr": 2e-3}[knob], knob
    assert cfg.optimizer == "adamw" and cfg.recipe_warmup(total_steps=468) == 0.05  # a fraction of the run

def test_memory_options_reach_the_model():
    """--grad-checkpointing trades memory for speed on the built model."""
    for enabled in (False, True):
        cfg = tiny_config(grad_checkpointing=enabled)
        resolved = build.resolve_model(cfg)
        model = build.build_model(cfg, resolved, resolved.config.replace(num_classes=10))
        assert model.encoder.grad_checkpointing == enabled

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
    opt = optim.build_optimizer(cfg, model, torch.device("cpu"))
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups)
    summary = fit(tiny_config(tmp_path / "ft", recipe="paper-finetune", pretrained=str(tmp_path / "pre" / "run"),
                              lr=0.01, steps=3, warmup=1, model_options=dict(img_size=56)))
    assert summary["model_config"]["img_size"] == [56, 56] and summary["status"] == "finished"

def test_a_pretrained_directory_of_another_model_than_named_is_trained_with_a_warning(tmp_path):
    """The saved model decides what is trained; a model name that says otherwise is flagged."""
    fit(tiny_config(tmp_path / "pre", steps=3, warmup=1))
    with pytest.warns(UserWarning, match=r"holds another model than vit_b16: embed_dim=32 \(not 768\)"):
        cfg = tiny_config(tmp_path / "ft", model="vit_b16", pretrained=str(tmp_path / "pre" / "run"), steps=3, warmup=1)
        summary = fit(dataclasses.replace(cfg, model_options={}))  # B/16 as named, nothing of TINY
    assert summary["model_config"]["embed_dim"] == 32

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

def test_a_missing_tensorboard_is_said_once_and_metrics_csv_holds_the_numbers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed, whatever this machine has
    monkeypatch.setattr(summary, "_warned", False)
    with pytest.warns(UserWarning, match=r"tensorboard is not installed.*pip install tensorboard"):
        first = summary.Metrics(tmp_path, enabled=True, resume_step=0, tensorboard=True)
    first.write({"step": 1, "loss": 2.5, "lr": 0.1})
    first.write({"step": 2, "loss": 2.25, "lr": 0.2})
    first.write({"step": 2, "val_top1": 0.5, "val_loss": 2.0})  # a new column: the table is written again
    first.write({"step": 3, "loss": 2.0, "lr": 0.3})
    first.close()
    with (tmp_path / "metrics.csv").open(newline="") as table:
        rows = list(csv.DictReader(table))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert list(rows[0]) == ["step", "loss", "lr", "val_top1", "val_loss"] and len(rows) == len(lines) == 4
    assert all({k: str(v) for k, v in line.items()} == {k: v for k, v in row.items() if v != ""}
               for line, row in zip(lines, rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not once per run
        second = summary.Metrics(tmp_path / "again", enabled=True, resume_step=0, tensorboard=True)
    second.close()
    # a resumed run's table keeps the lines its checkpoint had seen
    summary.Metrics(tmp_path, enabled=True, resume_step=2, tensorboard=False).close()
    with (tmp_path / "metrics.csv").open(newline="") as table:
        assert [row["step"] for row in csv.DictReader(table)] == ["1", "2", "2"]
