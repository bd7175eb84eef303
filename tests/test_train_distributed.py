"""Eight CPU processes (gloo, launched by torchrun: an 8-GPU node's world size) follow the loss
curve of one process with the same global batch, layer-wise decay, the moving average, the
validation split with the best step kept and the few-shot evaluation included."""

import json

import pytest
import torch
from safetensors.torch import load_file
from train_testing import TINY, flags, lines, tiny_config, torchrun

from vitzoo.train import fit

SETTINGS = dict(data="synthetic", train_limit=256, test_limit=64, batch_size=32, steps=8, lr=3e-3,
                warmup=2, log_every=1, checkpoint_every=4, layer_decay=0.75, model_ema_decay=0.8,
                val_size=200, eval_every=4)


@pytest.mark.slow
def test_eight_processes_follow_the_one_process_loss_curve(tmp_path):
    fit(tiny_config(tmp_path / "one", fewshot=(1, 2), model_ema=True, keep_best=True, **SETTINGS))
    # each global batch of 32 shared between the processes: one micro-batch of 4 each
    torchrun(8, "vit_ti16", "--out", str(tmp_path / "eight"), "--micro-batch", "4",
             "--fewshot", "1,2", "--model-ema", "--keep-best", *flags(**TINY, **SETTINGS))
    runs = tmp_path / "one" / "run", tmp_path / "eight"
    one, eight = ([r["loss"] for r in lines(run) if "loss" in r] for run in runs)
    assert len(one) == len(eight) == 8 and all(abs(a - b) <= 1e-5 for a, b in zip(one, eight))
    reference, summary = (json.loads((run / "summary.json").read_text()) for run in runs)
    assert summary["world_size"] == 8 and summary["status"] == "finished"
    assert summary["val_images"] == 200 and summary["best_step"] == reference["best_step"]
    curves = [{r["step"]: r["val_top1"] for r in lines(run) if "val_top1" in r} for run in runs]
    assert curves[0].keys() == curves[1].keys() == {4, 8}
    assert all(abs(curves[0][k] - curves[1][k]) <= 1 / 200 for k in curves[0]), curves
    for key in ("test_top1", "ema_test_top1"):
        assert abs(summary[key] - reference[key]) < 0.05
    assert summary["fewshot"].keys() == reference["fewshot"].keys() == {"1", "2"}
    assert all(abs(summary["fewshot"][k] - reference["fewshot"][k]) < 0.05 for k in ("1", "2"))
    # each process averages its own replica, which DDP keeps equal: the one process's average, but
    # for the key's bias, whose gradient is rounding noise that Adam scales up to whole steps
    ema, raw = ([load_file(run / name) for run in runs]
                for name in ("model_ema.safetensors", "model.safetensors"))
    for k in ema[0]:
        drift = (ema[0][k] - ema[1][k]).abs().max()
        assert drift <= (raw[0][k] - raw[1][k]).abs().max() + 1e-6
        assert drift <= 1e-5 or "qkv.bias" in k, k
