"""A validation split held out of the training set (`val_size`) and early stopping on it
(`keep_best`): the split is fixed and never trained on, the test set is measured once, the best
weights are the ones evaluated and saved, and a resumed run picks the same best."""

from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset
from train_testing import lines, tiny_config

import vitzoo
from vitzoo import data as datasets
from vitzoo.train import Trainer, fit, inputs, loop

REAL_LOSS = loop.loss_fn
# a constant learning rate after the warm-up: a run of k steps takes a longer run's first k
PEAKED = dict(val_size=200, steps=16, eval_every=2, schedule="constant", fewshot=(5,))


def origin(dataset) -> set[int]:
    """The indices in the raw split of the samples of a chain of Subsets."""
    dataset = getattr(dataset, "base", dataset)
    indices = list(range(len(dataset)))
    while isinstance(dataset, Subset):
        indices, dataset = [dataset.indices[i] for i in indices], dataset.dataset
    return set(indices)


def spy(monkeypatch, name: str, module=inputs) -> list:
    """Record the arguments of every call of `module.name`."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    return calls


def mislabel_after(monkeypatch, good_steps: int) -> None:
    """From step good_steps + 1 on, wrong labels (class + 1): validation accuracy peaks, then
    falls. One count across the fits of a test: call n is step n."""
    calls = []

    def shifted(logits, targets, smoothing):
        calls.append(1)
        shift = len(calls) > good_steps
        return REAL_LOSS(logits, (targets + shift) % logits.shape[1], smoothing)

    monkeypatch.setattr(loop, "loss_fn", shifted)


def trained(config):
    trainer = Trainer.from_config(config)
    return trainer.model, trainer.run()


def test_the_split_is_fixed_disjoint_and_the_training_subsets_nest(monkeypatch):
    runs = {}
    for seed, limit in ((0, 200), (1, 200), (0, 400)):
        trainer = Trainer.from_config(tiny_config(seed=seed, train_limit=limit, val_size=300))
        runs[seed, limit] = origin(trainer.inputs.val_set), origin(trainer.inputs.train_set)
    val = runs[0, 200][0]
    assert len(val) == 300 and all(v == val for v, _ in runs.values())
    assert all(len(train) == limit and not train & val for (_, limit), (_, train) in runs.items())
    assert runs[0, 200][1] < runs[0, 400][1] and runs[0, 200][1] != runs[1, 200][1]
    assert len((torch.tensor(sorted(val)) % 10).unique()) == 10  # synthetic: label = index mod 10


def test_validation_replaces_the_test_set_during_training(tmp_path, monkeypatch):
    sums = spy(monkeypatch, "classification_sums")
    summary = fit(tiny_config(tmp_path / "val", val_size=96, eval_every=2, steps=6))
    measured = [len(a[1].dataset) for a, _ in sums]  # each pass's batches: of its dataset
    assert measured == [96, 96, 96, 128]  # at steps 2 and 4, and the end; the test set once, last
    evals = [r for r in lines(tmp_path / "val" / "run") if "loss" not in r]
    assert [set(r) for r in evals] == [{"step", "val_top1", "val_top5", "val_loss"}] * 3
    assert summary["val_images"] == 96 and summary["val_top1"] == evals[-1]["val_top1"]
    assert "best_step" not in summary


def test_keep_best_evaluates_saves_and_resumes_the_best_steps_weights(tmp_path, monkeypatch):
    mislabel_after(monkeypatch, 8)
    model, best = trained(tiny_config(tmp_path / "best", keep_best=True, **PEAKED))
    vals = {r["step"]: r["val_top1"] for r in lines(tmp_path / "best" / "run") if "val_top1" in r}
    assert best["best_val_top1"] == max(vals.values()) > best["val_top1"] + 0.1
    assert best["best_step"] == min(s for s, v in vals.items() if v == max(vals.values()))
    mislabel_after(monkeypatch, 8)  # the same run stopped at the best step
    short_model, short = trained(tiny_config(tmp_path / "short", **{**PEAKED,
                                                                    "steps": best["best_step"]}))
    assert (best["test_top1"], best["fewshot"]) == (short["test_top1"], short["fewshot"])
    saved = vitzoo.from_pretrained(tmp_path / "best" / "run").state_dict()
    for name, tensor in short_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor) and torch.equal(saved[name], tensor)
    mislabel_after(monkeypatch, 8)  # stopped after its best step, then resumed
    first = fit(tiny_config(tmp_path / "split", keep_best=True, stop_at=11, **PEAKED))
    assert first["best_step"] == best["best_step"] < 11 and first["test_top1"] is None
    second = fit(tiny_config(tmp_path / "split", keep_best=True, resume=True, **PEAKED))
    for key in ("best_step", "best_val_top1", "test_top1", "fewshot", "val_top1"):
        assert second[key] == best[key], key
    resumed = vitzoo.from_pretrained(tmp_path / "split" / "run").state_dict()
    assert all(torch.equal(saved[k], resumed[k]) for k in saved)


def test_keep_best_keeps_the_earliest_of_equal_scores(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "classification_sums",  # every validation point scores 50%
                        lambda model, batches, dtype: torch.tensor([100.0, 180, 200, 200]))
    _, summary = trained(tiny_config(tmp_path, keep_best=True, val_size=200, eval_every=2,
                                     steps=6, warmup=1))
    assert summary["best_step"] == 2 and summary["best_val_top1"] == 0.5


def test_bad_validation_settings_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="val_size must be >= 0"):
        tiny_config(val_size=-1)
    for changes in (dict(val_size=0), dict(val_size=100, eval_every=0)):
        with pytest.raises(ValueError, match=r"give --val-size and --eval-every \(> 0\)"):
            tiny_config(keep_best=True, **changes)
    for val_size, said in ((9990, r"batch_size=32 is larger than the training set \(10 images, "
                                  r"val_size=9990 held out\): lower --batch-size or --val-size"),
                           (20_000, r"batch_size=32 is larger than the training set \(0 images, "
                                    r"val_size=20000 held out\)")):
        with pytest.raises(ValueError, match=said):
            fit(tiny_config(tmp_path, val_size=val_size))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
                             ).is_file(), reason="Debian's dataset-fashion-mnist not installed")
def test_fashion_mnists_validation_split_and_the_data_ablations_subsets(data_cache):
    train = datasets.load_split("fashion-mnist", "train", img_size=(28, 28), in_chans=1)
    rest, val = datasets.split_validation(train, 10_000)
    counts = torch.bincount(val.targets, minlength=10)
    assert len(rest) == 50_000 and 900 < counts.min() <= counts.max() < 1100  # about 1000 a class
    previous: set[int] = set()
    for limit in (1_000, 3_000, 10_000, 30_000):
        sub = origin(datasets.subset(rest, limit, seed=0))
        assert len(sub) == limit and not sub & set(val.indices) and previous < sub
        previous = sub
    assert datasets.split_validation(train, 10_000)[1].indices == val.indices
