"""A validation split held out of the training set (`val_size`), and early stopping on it (`keep_best`):
the split is fixed and never trained on, the test set is measured once, the best weights are the ones
evaluated and saved, and a resumed run picks the same best."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import train_testing
from train_testing import TINY
from torch.utils.data import Subset

import vitzoo
from vitzoo import data as datasets
from vitzoo.cli import main
from vitzoo.train import TrainConfig, Trainer, build, fit, loop

REAL_LOSS = loop.loss_fn  # before any test wraps it


def tiny_config(tmp_path=None, **changes) -> TrainConfig:
    """The shared tiny run with a validation split of 200 images."""
    return train_testing.tiny_config(tmp_path, **{"val_size": 200, **changes})


def fit_with_model(config: TrainConfig):
    """A run's trained model and summary (the model is the Trainer's)."""
    trainer = Trainer.from_config(config)
    summary = trainer.run()
    return trainer.model, summary


def origin(dataset) -> list[int]:
    """The indices in the raw split of the samples of a (Transformed) chain of Subsets."""
    dataset = getattr(dataset, "base", dataset)
    indices = list(range(len(dataset)))
    while isinstance(dataset, Subset):
        indices = [dataset.indices[i] for i in indices]
        dataset = dataset.dataset
    return indices


def metric_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def spy_evaluations(monkeypatch) -> list[int]:
    """Record the size of every dataset the training loop evaluates top-1 on."""
    sizes = []
    real = build.classification_sums

    def spy(model, dataset, **kwargs):
        sizes.append(len(dataset))
        return real(model, dataset, **kwargs)

    monkeypatch.setattr(build, "classification_sums", spy)
    return sizes


def poison_after(monkeypatch, good_steps: int) -> None:
    """From step good_steps + 1 on, train on wrong labels (class + 1): the validation accuracy peaks and
    falls. Counts loss calls (one per step at micro_batch = batch_size), across fits of one test."""
    calls = {"n": 0}

    def shifted(logits, targets, smoothing):
        calls["n"] += 1
        if calls["n"] > good_steps:
            targets = (targets + 1) % logits.shape[1]
        return REAL_LOSS(logits, targets, smoothing)

    monkeypatch.setattr(loop, "loss_fn", shifted)


# a constant learning rate after the warm-up: a run of `steps=k` takes the same k steps as a longer one
PEAKED = dict(steps=16, eval_every=2, schedule="constant", train_limit=256, fewshot=(5,))


# ---------------------------------------------------------------------------- the split
def test_validation_split_is_fixed_disjoint_and_training_subsets_nest(monkeypatch):
    seen = {}
    real_fewshot = build.fewshot_linear_accuracy

    def capture(model, train_set, test_set, shots, **kwargs):
        seen["fewshot_train"] = train_set
        return real_fewshot(model, train_set, test_set, shots, **kwargs)

    monkeypatch.setattr(build, "fewshot_linear_accuracy", capture)
    real_sums = build.classification_sums

    def capture_val(model, dataset, **kwargs):
        if len(dataset) == 300:
            seen["val"] = dataset
        return real_sums(model, dataset, **kwargs)

    monkeypatch.setattr(build, "classification_sums", capture_val)
    runs = {}
    for seed, limit in ((0, 200), (1, 200), (0, 400)):
        fit(tiny_config(seed=seed, train_limit=limit, val_size=300, steps=1, warmup=0, fewshot=(1,)))
        runs[seed, limit] = set(origin(seen["val"])), set(origin(seen["fewshot_train"]))
    val = runs[0, 200][0]
    assert len(val) == 300
    assert all(v == val for v, _ in runs.values())  # the same images whatever the seed and train_limit
    for (seed, limit), (_, trained) in runs.items():
        assert len(trained) == limit and not trained & val  # few-shot draws from the images trained on
    assert runs[0, 200][1] < runs[0, 400][1]  # nested subsets of one seed
    assert runs[0, 200][1] != runs[1, 200][1]  # another seed, another subset
    labels = torch.arange(10_000) % 10  # synthetic: label = index mod 10
    assert len(labels[sorted(val)].unique()) == 10  # class-mixed


@pytest.mark.skipif(not (Path("/usr/share/datasets/fashion-mnist") / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_validation_split_and_the_ablation_subsets(tmp_path, monkeypatch):
    monkeypatch.setenv("VITZOO_CACHE", str(tmp_path / "cache"))
    train = datasets.load_split("fashion-mnist", "train", img_size=(28, 28), in_chans=1)
    rest, val = datasets.split_validation(train, 10_000)
    assert len(rest) == 50_000 and len(val) == 10_000
    counts = torch.bincount(val.targets, minlength=10)
    assert counts.min() > 900 and counts.max() < 1100, counts  # a random split: about 1000 per class
    held = set(val.indices)
    previous: set[int] = set()
    for limit in (1_000, 3_000, 10_000, 30_000):
        sub = set(origin(datasets.subset(rest, limit, seed=0)))
        assert len(sub) == limit and not sub & held and previous < sub
        previous = sub
    assert datasets.split_validation(train, 10_000)[1].indices == val.indices


# ---------------------------------------------------------------------------- evaluations
def test_validation_replaces_the_test_set_during_training(tmp_path, monkeypatch):
    sizes = spy_evaluations(monkeypatch)
    summary = fit(tiny_config(tmp_path / "val", val_size=96, test_limit=128, eval_every=2, steps=6))
    assert sizes == [96, 96, 96, 128]  # validation at steps 2, 4 and the end; the test set once, last
    evals = [r for r in metric_lines(tmp_path / "val" / "run") if "loss" not in r]
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert all(set(r) == {"step", "val_top1", "val_top5", "val_loss"} for r in evals), evals
    assert summary["val_images"] == 96 and summary["val_top1"] == evals[-1]["val_top1"]
    assert 0.0 <= summary["test_top1"] <= 1.0 and "best_step" not in summary
    sizes.clear()
    fit(tiny_config(tmp_path / "test", val_size=0, test_limit=128, eval_every=2, steps=6))
    assert sizes == [128, 128, 128]  # without a validation split: the test set, as before
    assert any("eval_top1" in r for r in metric_lines(tmp_path / "test" / "run"))


def test_keep_best_evaluates_and_saves_the_weights_of_the_best_step(tmp_path, monkeypatch):
    poison_after(monkeypatch, 8)
    model, best = fit_with_model(tiny_config(tmp_path / "best", keep_best=True, **PEAKED))
    assert best["status"] == "finished" and best["step"] == 16
    assert best["best_step"] < 16 and best["best_val_top1"] > best["val_top1"] + 0.1, best
    vals = {r["step"]: r["val_top1"] for r in metric_lines(tmp_path / "best" / "run") if "val_top1" in r}
    assert best["best_val_top1"] == max(vals.values()) == vals[best["best_step"]]
    assert best["best_step"] == min(s for s, v in vals.items() if v == max(vals.values()))  # ties: the earliest
    # the same run stopped at the best step: its final weights and test accuracy are the ones reported
    poison_after(monkeypatch, 8)
    short_model, short = fit_with_model(tiny_config(tmp_path / "short", **{**PEAKED, "steps": best["best_step"]}))
    assert best["test_top1"] == short["test_top1"] and best["fewshot"] == short["fewshot"]
    saved = vitzoo.from_pretrained(tmp_path / "best" / "run").state_dict()
    for name, tensor in short_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
        assert torch.equal(saved[name], tensor), name
    # without keep_best, the final (worse) weights are evaluated
    poison_after(monkeypatch, 8)
    last = fit(tiny_config(**PEAKED))
    assert last["val_top1"] == best["val_top1"] and last["test_top1"] < best["test_top1"]


def test_keep_best_ties_keep_the_earliest(tmp_path, monkeypatch):
    real = build.classification_sums

    def flat_validation(model, dataset, **kwargs):  # every validation point scores 50%
        if len(dataset) == 200:
            return torch.tensor([100.0, 180.0, 200.0, 200.0], dtype=torch.float64)
        return real(model, dataset, **kwargs)

    monkeypatch.setattr(build, "classification_sums", flat_validation)
    model, summary = fit_with_model(tiny_config(tmp_path / "tie", keep_best=True, eval_every=2, steps=6, schedule="constant", warmup=1))
    assert summary["best_step"] == 2 and summary["best_val_top1"] == summary["val_top1"] == 0.5
    short_model, _ = fit_with_model(tiny_config(tmp_path / "short", eval_every=2, steps=2, schedule="constant", warmup=1))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), short_model.state_dict().values()))


def test_keep_best_survives_a_resume(tmp_path, monkeypatch):
    poison_after(monkeypatch, 8)
    straight = fit(tiny_config(tmp_path / "straight", keep_best=True, **PEAKED))
    poison_after(monkeypatch, 8)  # one counter for both halves: call n is step n
    first = fit(tiny_config(tmp_path / "split", keep_best=True, stop_at=11, **PEAKED))
    assert first["status"] == "stopped" and first["test_top1"] is None
    assert first["best_step"] == straight["best_step"] < 11  # the best lies before the interruption
    second = fit(tiny_config(tmp_path / "split", keep_best=True, resume=True, **PEAKED))
    assert second["status"] == "finished"
    for key in ("best_step", "best_val_top1", "test_top1", "fewshot", "val_top1"):
        assert second[key] == straight[key], key
    a = vitzoo.from_pretrained(tmp_path / "straight" / "run").state_dict()
    b = vitzoo.from_pretrained(tmp_path / "split" / "run").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_processes_shard_the_validation_and_agree_on_the_best(tmp_path):
    settings = dict(val_size=200, eval_every=2, steps=8, keep_best=True, checkpoint_every=4)
    one = fit(tiny_config(tmp_path / "one", **settings))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tiny_config(**settings)
    flags = {k: v for k, v in cfg.to_dict().items() if k in ("data", "train_limit", "test_limit", "val_size", "batch_size",
                                                            "steps", "lr", "warmup", "log_every", "eval_every",
                                                            "checkpoint_every")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "-m", "vitzoo", "train", "vit_ti16", "--device", "cpu", "--keep-best",
           "--out", str(tmp_path / "two" / "run"), "--micro-batch", "8", "--quiet", "--no-tensorboard"]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, **flags}.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "run" / "summary.json").read_text())
    assert two["world_size"] == 2 and two["val_images"] == 200
    # the same validation curve up to float rounding, hence the same best; a rank that kept other weights
    # would change the (all-reduced) test accuracy
    curves = [{r["step"]: r["val_top1"] for r in metric_lines(tmp_path / name / "run") if "val_top1" in r}
              for name in ("one", "two")]
    assert curves[0].keys() == curves[1].keys() == {2, 4, 6, 8}
    assert all(abs(curves[0][k] - curves[1][k]) <= 1 / 200 for k in curves[0]), curves
    assert two["best_step"] == one["best_step"] and abs(two["test_top1"] - one["test_top1"]) <= 1 / 128


# ---------------------------------------------------------------------------- bad input
def test_bad_validation_settings_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="val_size must be >= 0"):
        tiny_config(val_size=-1)
    with pytest.raises(ValueError, match=r"give --val-size N and --eval-every K \(> 0\)"):
        tiny_config(val_size=0, keep_best=True)
    with pytest.raises(ValueError, match=r"give --eval-every K \(> 0\)"):
        tiny_config(val_size=100, keep_best=True, eval_every=0)
    # synthetic has 10,000 training images: 9,990 held out leave 10, less than a batch of 32
    with pytest.raises(ValueError, match=r"val_size=9990 leaves 10 of the 10000 training images, fewer than one "
                                         r"batch \(32\); lower --val-size or --batch-size"):
        fit(tiny_config(tmp_path, val_size=9990))
    with pytest.raises(ValueError, match="lower --val-size"):
        fit(tiny_config(tmp_path, val_size=20_000))
    assert not (tmp_path / "run").exists()
    with pytest.warns(UserWarning, match="train_limit=20000 is more than the 9900 training images left"):
        summary = fit(tiny_config(val_size=100, train_limit=20_000, steps=1, warmup=0))
    assert summary["train_images"] == 9900


def test_resume_refuses_another_validation_split(tmp_path):
    fit(tiny_config(tmp_path, val_size=100, stop_at=2))
    with pytest.raises(ValueError, match=r"val_size: 100 -> 200"):
        fit(tiny_config(tmp_path, val_size=200, resume=True))
    with pytest.raises(ValueError, match=r"keep_best: False -> True"):
        fit(tiny_config(tmp_path, val_size=100, keep_best=True, eval_every=2, resume=True))


def test_the_flags(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "vit_ti16", *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()], "--data", "synthetic",
            "--train-limit", "128", "--test-limit", "64", "--batch-size", "32", "--steps", "4", "--warmup", "1",
            "--quiet", "--no-tensorboard", "--device", "cpu", "--out", str(run)]
    assert main([*args, "--val-size", "64", "--eval-every", "2", "--keep-best"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_config"]["val_size"] == 64 and summary["train_config"]["keep_best"] is True
    assert summary["best_step"] in (2, 4) and summary["val_images"] == 64
    assert main([*args[:-1], str(tmp_path / "other"), "--keep-best"]) == 2
    assert "keep_best picks the best" in capsys.readouterr().err
