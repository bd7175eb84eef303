"""A training run end to end: what it writes, what it learns, its recipes, precisions and
switches, and how bad data stops it before any work."""

import json
import sys
from pathlib import Path

import pytest
import torch
from train_testing import TINY, lines, losses, short_config, tiny_config

import vitzoo
from vitzoo.errors import DataError
from vitzoo.layers.pos_embed import resample_grid
from vitzoo.train import TrainConfig, Trainer, fit

FASHION = Path("/usr/share/datasets/fashion-mnist")


def test_a_run_writes_its_settings_metrics_checkpoint_model_and_summary(tmp_path):
    summary = fit(tiny_config(tmp_path, steps=6, eval_every=3))
    run = tmp_path / "run"
    assert summary["status"] == "finished" and summary["step"] == 6
    assert 0.0 <= summary["test_top1"] <= 1.0 and summary["images_per_s"] > 0
    assert json.loads((run / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert TrainConfig.from_json((run / "train_config.json").read_text()).lr == 3e-3
    model = vitzoo.from_pretrained(run)  # the run directory is a save_pretrained directory
    assert model.config.num_classes == 10 and model.config.img_size == (28, 28)
    assert (run / "checkpoints" / "latest").read_text() == "step_00000006\n"
    assert [s for s, _ in losses(run)] == list(range(1, 7))
    assert [r["step"] for r in lines(run) if "eval_top1" in r] == [3, 6]


@pytest.mark.slow
def test_a_run_learns_synthetic_data():
    assert fit(tiny_config(steps=40, train_limit=512))["test_top1"] > 0.8


def test_missing_or_malformed_data_fails_before_any_work(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (bad / f"{name}.gz").write_bytes(b"not gzip at all")
    for data, data_dir, said in (("fashion-mnist", tmp_path / "nowhere", "nowhere lacks train-images"),
                                 ("fashion-mnist", bad, "truncated or not an idx file"),
                                 (str(bad), None, "no train/"),
                                 ("imagenet-not-here", None, "unknown dataset")):
        with pytest.raises(DataError, match=said):
            fit(tiny_config(tmp_path, data=data, data_dir=data_dir and str(data_dir)))
    assert not (tmp_path / "run").exists()


def test_the_recipes_fill_the_knobs_left_out_and_warm_up_a_tenth_at_most(tmp_path):
    from benchmarks.scales import SMALL_RECIPE

    fit(short_config(tmp_path / "run", steps=20, warmup=None, lr=1e-3))  # min(10k, 20 // 10) = 2
    lrs = [r["lr"] for r in lines(tmp_path / "run") if "lr" in r]
    assert lrs[:2] == pytest.approx([5e-4, 1e-3]) and lrs[-1] == pytest.approx(1e-3 / 18)
    small = TrainConfig(recipe="small").resolved()
    knobs = ("batch_size", "weight_decay", "schedule", "clip_grad")
    assert {k: getattr(small, k) for k in knobs} == {k: SMALL_RECIPE[k] for k in knobs}
    assert small.optimizer == "adamw" and small.recipe_warmup(total_steps=468) == 0.05


def test_fine_tuning_zeroes_the_head_and_resamples_the_position_embedding(tmp_path):
    pre = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    torch.nn.init.normal_(pre.head.fc.weight)  # the head fine-tuning must zero
    pre.save_pretrained(tmp_path / "pre")
    trainer = Trainer.from_config(tiny_config(
        tmp_path / "ft", recipe="paper-finetune", pretrained=str(tmp_path / "pre"), lr=None,
        warmup=None, steps=3, model_options=dict(img_size=56)))
    cfg, model = trainer.cfg, trainer.model
    assert (cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.schedule, cfg.reset_head) == (
        "sgd", 0.9, 0.0, "cosine", True)
    assert model.config.img_size == (56, 56) and model.head.fc.weight.abs().sum() == 0
    pos_old, pos_new = (next(p for n, p in m.named_parameters() if "pos" in n)[0]
                        for m in (pre, model))
    torch.testing.assert_close(pos_new[1:], resample_grid(pos_old[1:], (4, 4), (8, 8)))
    torch.testing.assert_close(pos_new[:1], pos_old[:1])
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    assert trainer.run()["model_config"]["img_size"] == [56, 56]


def test_bf16_with_gradient_accumulation_trains():
    summary = fit(tiny_config(steps=2, warmup=1, batch_size=16, train_limit=64, test_limit=32,
                              precision="bf16", micro_batch=8))
    assert summary["precision"] == "bfloat16" and summary["final_loss"] == summary["final_loss"]
    with pytest.raises(ValueError, match="not a multiple"):
        fit(tiny_config(steps=4, micro_batch=5))


def test_compile_trains_through_the_compiled_model_with_checkpointed_blocks(tmp_path, monkeypatch):
    compiled, real = [], torch.compile  # dynamo's graphs run eagerly: no C++ build on a CPU
    monkeypatch.setattr(torch, "compile", lambda m: compiled.append(m) or real(m, backend="eager"))
    trainer = Trainer.from_config(tiny_config(tmp_path, steps=2, warmup=1, compile=True,
                                              grad_checkpointing=True))
    assert compiled == [trainer.model] and trainer.model.encoder.grad_checkpointing
    assert trainer.run()["status"] == "finished"


@pytest.mark.skipif(not (FASHION / "t10k-images-idx3-ubyte.gz").is_file(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_a_fashion_mnist_run_records_its_normalisation(tmp_path, data_cache):
    fit(tiny_config(tmp_path, data="fashion-mnist", train_limit=512, test_limit=256, steps=4))
    config = vitzoo.from_pretrained(tmp_path / "run").config
    assert (config.in_chans, config.mean, config.std) == (1, (0.2860,), (0.3530,))


def test_a_time_budget_ends_the_run_on_time():
    summary = fit(tiny_config(steps=None, time_budget_min=0.05, warmup=0.1))
    assert summary["status"] == "finished" and 3.0 <= summary["train_seconds"] < 6.0
    assert summary["total_steps"] is None and summary["step"] > 0


def test_a_missing_tensorboard_is_said_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    with pytest.warns(UserWarning, match=r"tensorboard is not installed.*pip install tensorboard"):
        assert fit(short_config(tmp_path / "run", tensorboard=True))["status"] == "finished"
