"""Evaluation: the paper's few-shot linear evaluation, top-1 / top-5 and the linear probe, and the
shots a dataset can give."""

import pytest
import torch

import vitzoo
from vitzoo import data, evaluate
from vitzoo.errors import ConfigError

TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


class Table(torch.utils.data.Dataset):
    """Images whose features are given, as `features(dataset, indices)` hands them out."""

    def __init__(self, rows: torch.Tensor, targets: torch.Tensor) -> None:
        self.rows, self.targets = rows, targets

    def __len__(self):
        return len(self.targets)

    @staticmethod
    def features(dataset, indices):
        indices = list(range(len(dataset))) if indices is None else list(indices)
        return dataset.rows[indices], dataset.targets[indices]


def clustered(n_per_class: int, classes: int = 10, dim: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=g) * 3
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    return centers[labels] + 0.3 * torch.randn(len(labels), dim, generator=g), labels


def test_fewshot_is_accurate_on_separable_features_and_at_chance_on_random_labels():
    train, test = Table(*clustered(40)), Table(*clustered(20))
    result = evaluate.fewshot_linear_accuracy(None, train, test, shots=(1, 5, 10, 25), draws=3,
                                              features=Table.features)
    assert set(result) == {1, 5, 10, 25} and all(acc > 0.95 for acc in result.values()), result
    noise = torch.Generator().manual_seed(1)
    train.targets = torch.randint(0, 10, (len(train),), generator=noise)
    test = Table(clustered(200, seed=2)[0], torch.randint(0, 10, (2000,), generator=noise))
    chance = evaluate.fewshot_linear_accuracy(None, train, test, shots=(5, 25), details=True,
                                              features=Table.features)
    assert all(abs(r["mean"] - 0.1) < 0.04 and len(r["accuracies"]) == 5 for r in chance.values())


def test_the_ridge_regression_in_its_dual_form_is_the_primal_solution():
    x, y = clustered(3, dim=50)  # 30 samples < 51 features: the dual form
    x_test, y_test = clustered(10, dim=50, seed=5)
    mean, std = x.double().mean(0), x.double().std(0, correction=0) + 1e-5

    def prepare(v):
        return torch.cat([(v.double() - mean) / std, torch.full((len(v), 1), 100.0).double()], 1)

    a, t = prepare(x), 2.0 * torch.nn.functional.one_hot(y, 10).double() - 1
    w = torch.linalg.solve(a.T @ a + 10.0 * torch.eye(a.shape[1]).double(), a.T @ t)
    primal = float(((prepare(x_test) @ w).argmax(1) == y_test).double().mean())
    assert evaluate.ridge_fewshot_accuracy(x, y, x_test, y_test, 10, l2_reg=10.0) == primal


def test_the_draws_are_balanced_nested_and_differ():
    labels = torch.arange(10).repeat(30)
    draws = evaluate.fewshot_draws(labels, (1, 5), draws=2, seed=0)
    for k in (1, 5):
        assert all(torch.bincount(labels[i], minlength=10).tolist() == [k] * 10 for i in draws[k])
    assert set(draws[1][0].tolist()) <= set(draws[5][0].tolist())
    assert not torch.equal(draws[5][0], draws[5][1])


def test_top1_top5_loss_and_the_linear_probe_of_a_model():
    model = vitzoo.create("vit_ti16", **TINY, num_classes=10)
    load = dict(img_size=(28, 28), in_chans=3)
    test = data.subset(data.load_split("synthetic", "test", **load), 100)
    train = data.subset(data.load_split("synthetic", "train", **load), 300)
    metrics = evaluate.accuracy(model, test)
    # a zero-initialised head: every logit ties, the loss is log(10)
    assert metrics["count"] == 100 and abs(metrics["loss"] - torch.log(torch.tensor(10.0))) < 1e-5
    assert metrics["top1"] <= metrics["top5"] <= 1.0
    assert evaluate.linear_probe(model, train, test, max_iter=50)["top1"] > 0.5


def test_fewshot_computes_the_features_of_the_drawn_images_only():
    """The features of the union of the draws are asked for, each image once; the accuracies are
    those of the whole set's features."""
    train_set = data.subset(data.load_split("synthetic", "train", img_size=(8, 8), in_chans=1),
                            600, seed=1)
    labels = torch.as_tensor(train_set.targets)
    train = Table(torch.randn(10, 48)[labels] + torch.randn(600, 48), labels)
    test, asked = Table(*clustered(10, dim=48)), []

    def features(dataset, indices):
        asked.append(indices) if dataset is train else None
        return Table.features(dataset, indices)

    compact = evaluate.fewshot_linear_accuracy(None, train, test, shots=(1, 2), draws=4, seed=3,
                                               details=True, features=features)
    drawn = evaluate.fewshot_draws(labels, (1, 2), 4, seed=3)
    union = sorted({int(i) for sets in drawn.values() for idx in sets for i in idx})
    assert asked == [union] and len(union) < len(train) // 4
    for k, sets in drawn.items():
        assert compact[k]["accuracies"] == [evaluate.ridge_fewshot_accuracy(
            train.rows[idx], labels[idx], test.rows, test.targets, 10) for idx in sets]


def test_more_shots_than_any_class_holds_is_refused_before_any_feature_is_computed():
    labels = torch.tensor([0] * 6 + [1] * 3)
    with pytest.raises(ConfigError, match=r"fewshot k=7: no class .* holds 7 images \(the "
                                          r"largest holds 6, the smallest 3\)"):
        evaluate.fewshot_draws(labels, (1, 7), draws=2, seed=0)
    with pytest.warns(UserWarning, match=r"fewshot k=5: 1 of 2 classes hold fewer than 5"):
        assert [len(s) for s in evaluate.fewshot_draws(labels, (5,), 2, 0)[5]] == [8, 8]

    class Images(torch.utils.data.Dataset):
        targets = labels

        def __len__(self):
            return len(labels)

        def __getitem__(self, i):
            raise AssertionError("a feature was computed before the refusal")

    model = vitzoo.create("vit_ti16", **TINY, num_classes=2)
    with pytest.raises(ConfigError, match="fewshot k=100000"):
        evaluate.fewshot_linear_accuracy(model, Images(), Images(), shots=(100000,))
