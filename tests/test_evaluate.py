"""Evaluation: the few-shot linear evaluation, top-1 / top-5, linear probe, and the shots a
dataset can give."""

import pytest
import torch

import vitzoo
from vitzoo import data, evaluate
from vitzoo.errors import ConfigError

TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def clustered(n_per_class: int, classes: int = 10, dim: int = 64,
              noise: float = 0.3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=g) * 3
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    return centers[labels] + noise * torch.randn(len(labels), dim, generator=g), labels


def test_fewshot_on_separable_features_is_accurate():
    x, y = clustered(40)
    x_test, y_test = clustered(20, seed=0)
    result = evaluate.fewshot_from_features(x, y, x_test, y_test,
                                            shots=(1, 5, 10, 25), draws=3, seed=0)
    assert set(result) == {1, 5, 10, 25}
    assert all(acc > 0.95 for acc in result.values()), result


def test_fewshot_on_random_labels_is_at_chance():
    x, _ = clustered(60)
    y = torch.randint(0, 10, (len(x),), generator=torch.Generator().manual_seed(1))
    x_test, _ = clustered(200, seed=2)
    y_test = torch.randint(0, 10, (len(x_test),), generator=torch.Generator().manual_seed(3))
    result = evaluate.fewshot_from_features(x, y, x_test, y_test, shots=(5, 25),
                                            draws=5, details=True)
    for k, r in result.items():
        assert abs(r["mean"] - 0.1) < 0.04, (k, r)
        assert len(r["accuracies"]) == 5


def test_ridge_dual_and_primal_forms_agree():
    x, y = clustered(3, dim=50)  # 30 samples < 51 features: dual form
    x_test, y_test = clustered(10, dim=50, seed=5)
    dual = evaluate.ridge_fewshot_accuracy(x, y, x_test, y_test, 10, l2_reg=10.0)
    # the primal solution computed by hand
    mean, std = x.double().mean(0), x.double().std(0, correction=0) + 1e-5
    a = torch.cat([(x.double() - mean) / std,
                   torch.full((len(x), 1), 100.0, dtype=torch.float64)], 1)
    a_test = torch.cat([(x_test.double() - mean) / std,
                        torch.full((len(x_test), 1), 100.0, dtype=torch.float64)], 1)
    t = 2.0 * torch.nn.functional.one_hot(y, 10).double() - 1
    w = torch.linalg.solve(a.T @ a + 10.0 * torch.eye(a.shape[1], dtype=torch.float64), a.T @ t)
    assert dual == float(((a_test @ w).argmax(1) == y_test).double().mean())


def test_fewshot_draws_are_balanced_and_nested():
    labels = torch.arange(10).repeat(30)
    draws = evaluate.fewshot_draws(labels, (1, 5), draws=2, seed=0)
    for k in (1, 5):
        for idx in draws[k]:
            assert torch.bincount(labels[idx], minlength=10).tolist() == [k] * 10
    assert set(draws[1][0].tolist()) <= set(draws[5][0].tolist())
    assert not torch.equal(draws[5][0], draws[5][1])
def tiny_model():
    return vitzoo.create("vit_ti16", **TINY, num_classes=10)


def test_fewshot_linear_accuracy_of_a_model_computes_features_once(monkeypatch):
    model = tiny_model()
    train = data.load_split("synthetic", "train", img_size=(28, 28), in_chans=3)
    test = data.subset(data.load_split("synthetic", "test", img_size=(28, 28), in_chans=3), 200)
    calls = []
    real = evaluate.extract_features

    def counting(model, dataset, indices=None, **kw):
        calls.append(len(indices) if indices is not None else len(dataset))
        return real(model, dataset, indices, **kw)

    monkeypatch.setattr(evaluate, "extract_features", counting)
    result = evaluate.fewshot_linear_accuracy(model, train, test, shots=(1, 5), draws=3, seed=0)
    assert calls[0] <= 3 * 5 * 10 and calls[1] == 200 and len(calls) == 2
    # random features of a class-structured input still beat chance
    assert result[5] > 0.3


def test_accuracy_and_linear_probe():
    model = tiny_model()
    test = data.subset(data.load_split("synthetic", "test", img_size=(28, 28), in_chans=3), 100)
    train = data.subset(data.load_split("synthetic", "train", img_size=(28, 28), in_chans=3), 300)
    metrics = evaluate.accuracy(model, test)
    assert metrics["count"] == 100
    # the head is zero-initialised: every logit ties, the loss is log(10)
    assert abs(metrics["loss"] - torch.log(torch.tensor(10.0)).item()) < 1e-5
    assert metrics["top1"] <= metrics["top5"] <= 1.0
    probe = evaluate.linear_probe(model, train, test, max_iter=50)
    assert probe["top1"] > 0.5


class FeatureTable:
    """Fixed features of every image (as a model would give them), handed out by index; records
    which training indices were asked for."""

    def __init__(self, train_set, test_set, dim: int = 48) -> None:
        g = torch.Generator().manual_seed(5)
        self.train_set, self.asked = train_set, []
        centers = torch.randn(10, dim, generator=g)
        self.tables = {id(ds): centers[torch.as_tensor(ds.targets)] + torch.randn(len(ds), dim, generator=g)
                       for ds in (train_set, test_set)}

    def __call__(self, dataset, indices):
        indices = list(range(len(dataset))) if indices is None else list(indices)
        if dataset is self.train_set:
            self.asked.append(indices)
        return self.tables[id(dataset)][indices], torch.as_tensor(dataset.targets)[indices]


def few_shot_sets():
    train = data.subset(data.load_split("synthetic", "train", img_size=(8, 8),
                                        in_chans=1), 600, seed=1)
    test = data.subset(data.load_split("synthetic", "test", img_size=(8, 8), in_chans=1), 100)
    return train, test


def test_fewshot_accuracies_from_the_drawn_rows_are_those_from_the_whole_training_set():
    """Holding only the drawn images' features gives the accuracies, draw by draw, of the regression
    on the whole training set's features (the rows are the same)."""
    train, test = few_shot_sets()
    table = FeatureTable(train, test)
    compact = evaluate.fewshot_linear_accuracy(None, train, test, shots=(1, 2, 5), draws=4,
                                               seed=3, details=True,
                                               features=table)
    whole = evaluate.fewshot_from_features(table.tables[id(train)],
                                           torch.as_tensor(train.targets), *table(test, None),
                                           shots=(1, 2, 5), draws=4, seed=3, details=True)
    assert compact == whole


def test_fewshot_extracts_and_holds_the_features_of_the_drawn_images_only():
    """The training features asked for are the union of the draws (each image once), and no matrix
    of the training set's size is made."""
    from torch.overrides import TorchFunctionMode

    train, test = few_shot_sets()
    table = FeatureTable(train, test)
    drawn = evaluate.fewshot_draws(torch.as_tensor(train.targets), (1, 2), 5, seed=0)
    union = sorted({int(i) for sets in drawn.values() for idx in sets for i in idx})
    sizes = []

    class Sizes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                sizes.append(out.shape)
            return out

    with Sizes():
        evaluate.fewshot_linear_accuracy(None, train, test, shots=(1, 2), draws=5,
                                         seed=0, features=table)
    assert table.asked == [union] and len(union) < len(train) // 4
    assert not any(len(shape) == 2 and shape[0] == len(train) for shape in sizes)


def test_more_shots_than_any_class_holds_is_refused_before_any_feature_is_computed():
    """A k that no class holds (every draw would be the whole training set) is refused, naming the
    largest and smallest class; a k between them is said."""
    labels = torch.tensor([0] * 6 + [1] * 3)
    with pytest.raises(ConfigError,
                       match=r"fewshot k=7: no class .* holds 7 images \(the largest holds 6, the "
                             r"smallest 3\)"):
        evaluate.fewshot_draws(labels, (1, 7), draws=2, seed=0)
    with pytest.warns(UserWarning,
                      match=r"fewshot k=5: 1 of 2 classes hold fewer than 5 .*smallest 3: class 1"):
        drawn = evaluate.fewshot_draws(labels, (5,), draws=2, seed=0)
    assert [len(s) for s in drawn[5]] == [8, 8]  # 5 of class 0, all 3 of class 1

    class Images(torch.utils.data.Dataset):
        targets = labels

        def __len__(self):
            return len(labels)

        def __getitem__(self, i):
            raise AssertionError("a feature was computed before the refusal")

    model = vitzoo.create("vit_ti16", **TINY, num_classes=2)
    with pytest.raises(ConfigError, match="fewshot k=100000"):
        evaluate.fewshot_linear_accuracy(model, Images(), Images(), shots=(100000,))
