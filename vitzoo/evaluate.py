"""Evaluation: top-1 / top-5 accuracy, the paper's few-shot linear evaluation, and a linear probe.

Few-shot linear evaluation (section 4.1, Appendix D): the frozen pre-logits representation of k
training images per class is mapped to {-1, 1}^C targets by regularised least squares in closed
form; a test image's prediction is the arg max of its regressed vector. As in big_vision / scenic
`_fewshot_acc_fn`: features whitened with the k-shot set's mean and std (+1e-5), a constant
feature of 100 appended as the bias, W = (X^T X + l2_reg I)^-1 X^T T with `l2_reg = 2**10` in
float64 (the dual form X^T (X X^T + l2_reg I)^-1 T when there are fewer samples than features).

The result is averaged over random draws of the k-shot set. Features are computed once, and only
those of the training images some draw uses are held (k x classes x draws rows at most).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset

from vitzoo.data.transforms import Normalizer
from vitzoo.errors import ConfigError
from vitzoo.data.workers import worker_start
from vitzoo.precision import autocast, sum_dtype

FEWSHOT_L2_REG = 2.0**10
FEWSHOT_BIAS = 100.0


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def eval_loader(dataset: Dataset, indices: Sequence[int] | None = None, *, batch_size: int = 256,
                num_workers: int = 0, pin_memory: bool = False,
                persistent: bool = False) -> DataLoader:
    """Batches of `dataset` (or of `indices`) in order. `pin_memory` (for CUDA) lets the copies to
    the device overlap the computation; `persistent` keeps the workers between passes (a loop that
    evaluates again and again makes its loader once)."""
    data = dataset if indices is None else Subset(dataset, list(indices))
    return DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      pin_memory=pin_memory, persistent_workers=persistent and num_workers > 0,
                      multiprocessing_context=worker_start(num_workers))


def _on_device(model, loader: Iterable):
    """(normalised inputs on the model's device, labels) of each batch."""
    device = _device_of(model)
    config = model.config
    inputs = Normalizer(config.mean, config.std, config.in_chans, device)
    return ((inputs(images.to(device, non_blocking=True)), labels) for images, labels in loader)


@torch.no_grad()
def classification_sums(model, dataset: Dataset, *, indices: Sequence[int] | None = None,
                        batch_size: int = 256, num_workers: int = 0,
                        autocast_dtype: torch.dtype | None = None,
                        loader: Iterable | None = None) -> torch.Tensor:
    """[top-1 correct, top-5 correct, summed loss, count] as a tensor on the model's device, float64
    (float32 on MPS: `sum_dtype`), sums, so that processes can add theirs. `loader`: the batches of
    `dataset` (`indices`) from a loader made once (`eval_loader`), instead of one made here."""
    device = _device_of(model)
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=sum_dtype(device), device=device)
    if loader is None:
        loader = eval_loader(dataset, indices, batch_size=batch_size, num_workers=num_workers,
                             pin_memory=device.type == "cuda")
    for x, labels in _on_device(model, loader):
        labels = labels.to(device, non_blocking=True)
        with autocast(device, autocast_dtype):
            logits = model(x).float()
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        sums[0] += (top[:, 0] == labels).sum()
        sums[1] += (top == labels[:, None]).any(dim=1).sum()
        sums[2] += F.cross_entropy(logits, labels, reduction="sum")
        sums[3] += len(labels)
    model.train(was_training)
    return sums


def metrics_from_sums(sums: torch.Tensor) -> dict[str, float]:
    correct1, correct5, loss, count = sums.tolist()
    count = max(count, 1)
    return {"top1": correct1 / count, "top5": correct5 / count, "loss": loss / count,
            "count": int(count)}


def accuracy(model, dataset: Dataset, *, batch_size: int = 256, num_workers: int = 0,
             indices: Sequence[int] | None = None) -> dict[str, float]:
    """Top-1 and top-5 accuracy and mean cross-entropy of `model` on `dataset` (uint8 images)."""
    return metrics_from_sums(classification_sums(model, dataset, indices=indices,
                                                 batch_size=batch_size, num_workers=num_workers))


@torch.no_grad()
def extract_features(model, dataset: Dataset, indices: Sequence[int] | None = None, *,
                     batch_size: int = 256, num_workers: int = 0,
                     loader: Iterable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen pre-logits representations (float32, CPU) and labels of `dataset` (or of `indices`).
    `loader`: the batches of `dataset` (`indices`) from a loader made elsewhere."""
    device = _device_of(model)
    was_training = model.training
    model.eval()
    features, targets = [], []
    if loader is None:
        loader = eval_loader(dataset, indices, batch_size=batch_size, num_workers=num_workers,
                             pin_memory=device.type == "cuda")
    for x, labels in _on_device(model, loader):
        tokens = model.forward_features(x)
        features.append(model.forward_head(tokens, pre_logits=True).float().cpu())
        targets.append(labels)
    model.train(was_training)
    return torch.cat(features), torch.cat(targets)


# ---------------------------------------------------------------------------- few-shot
def _labels_of(dataset: Dataset) -> torch.Tensor:
    targets = getattr(dataset, "targets", None)
    if targets is None:
        return torch.tensor([int(dataset[i][1]) for i in range(len(dataset))])
    return torch.as_tensor(targets).long()


def fewshot_draws(labels: torch.Tensor, shots: Iterable[int], draws: int,
                  seed: int) -> dict[int, list[torch.Tensor]]:
    """For each k, `draws` index sets with k training samples per class (all of a class if it has
    fewer, said in a warning). Draw d's k-shot set is the first k of a random per-class order, so
    the sets of one draw are nested. A k larger than every class holds is a ConfigError: each draw
    would be the whole training set, the same every time, and no k-shot figure at all."""
    shots = sorted({int(k) for k in shots})
    classes, counts = labels.unique(return_counts=True)
    classes = classes.tolist()
    check_shots(shots, dict(zip(classes, counts.tolist())))
    out: dict[int, list[torch.Tensor]] = {k: [] for k in shots}
    for d in range(draws):
        g = torch.Generator().manual_seed(seed * 100_003 + d)
        orders = []
        for c in classes:
            members = (labels == c).nonzero().flatten()
            orders.append(members[torch.randperm(len(members), generator=g)])
        for k in shots:
            out[k].append(torch.cat([order[:k] for order in orders]))
    return out


def check_shots(shots: Iterable[int], per_class: dict[int, int]) -> None:
    """Refuse a k-shot count larger than every class of the training set holds (`per_class`: images
    per class); warn, naming them, where some classes hold fewer than k (they give all)."""
    if not per_class:
        return
    largest, smallest = max(per_class.values()), min(per_class.values())
    for k in shots:
        if k > largest:
            raise ConfigError(f"fewshot k={k}: no class of the training set holds {k} images (the "
                              f"largest holds {largest}, the smallest {smallest}); a k-shot set "
                              f"takes k images of every class, so choose k <= {smallest} (k <= "
                              f"{largest} with some classes giving all they hold)")
        short = sorted(c for c, n in per_class.items() if n < k)
        if short:
            warnings.warn(f"fewshot k={k}: {len(short)} of {len(per_class)} classes hold fewer "
                          f"than {k} training images (the smallest {smallest}: class "
                          f"{min(per_class, key=per_class.get)}); their k-shot sets take all they "
                          "hold", stacklevel=3)


def ridge_fewshot_accuracy(x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor,
                           y_test: torch.Tensor, num_classes: int,
                           l2_reg: float = FEWSHOT_L2_REG) -> float:
    """Closed-form regularised least squares from features to {-1, 1} targets; test accuracy."""
    x, x_test = x.double(), x_test.double()
    mean, std = x.mean(dim=0, keepdim=True), x.std(dim=0, correction=0, keepdim=True) + 1e-5

    def prepare(features: torch.Tensor) -> torch.Tensor:
        whitened = (features - mean) / std
        return torch.cat([whitened,
                          torch.full((len(features), 1), FEWSHOT_BIAS, dtype=torch.float64)], dim=1)

    a, a_test = prepare(x), prepare(x_test)
    targets = 2.0 * F.one_hot(y.long(), num_classes).double() - 1.0
    n, d = a.shape
    if n < d:  # dual form: W = A^T (A A^T + l2 I)^-1 T
        w = a.T @ torch.linalg.solve(a @ a.T + l2_reg * torch.eye(n, dtype=torch.float64), targets)
    else:
        w = torch.linalg.solve(a.T @ a + l2_reg * torch.eye(d, dtype=torch.float64), a.T @ targets)
    return float(((a_test @ w).argmax(dim=1) == y_test.long()).double().mean())


def fewshot_from_features(train_features: torch.Tensor, train_labels: torch.Tensor,
                          test_features: torch.Tensor, test_labels: torch.Tensor,
                          shots: Iterable[int] = (1, 5, 10, 25), draws: int = 5, seed: int = 0,
                          l2_reg: float = FEWSHOT_L2_REG, details: bool = False) -> dict:
    """Few-shot linear accuracy from precomputed features: {k: mean accuracy over the draws}
    (`details=True`: {k: {"mean", "std", "accuracies"}})."""
    drawn = fewshot_draws(train_labels, shots, draws, seed)
    return _fewshot_scores(drawn, lambda idx: train_features[idx], train_labels, test_features,
                           test_labels, l2_reg, details)


def _fewshot_scores(drawn: dict[int, list[torch.Tensor]],
                    rows: Callable[[torch.Tensor], torch.Tensor], train_labels: torch.Tensor,
                    test_features: torch.Tensor, test_labels: torch.Tensor, l2_reg: float,
                    details: bool) -> dict:
    """{k: mean accuracy over the draws} (or its details) of the draws `drawn` (training-set
    indices), `rows(indices)` giving those training images' features."""
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    result = {}
    for k, index_sets in drawn.items():
        accs = [ridge_fewshot_accuracy(rows(idx), train_labels[idx], test_features, test_labels,
                                       num_classes, l2_reg)
                for idx in index_sets]
        mean = sum(accs) / len(accs)
        std = math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs))
        result[k] = {"mean": mean, "std": std, "accuracies": accs} if details else mean
    return result


def fewshot_linear_accuracy(model, train_set: Dataset, test_set: Dataset,
                            shots: Iterable[int] = (1, 5, 10, 25), draws: int = 5, seed: int = 0, *,
                            l2_reg: float = FEWSHOT_L2_REG, test_limit: int | None = None,
                            batch_size: int = 256, num_workers: int = 0, details: bool = False,
                            features: Callable[[Dataset, Sequence[int] | None],
                                               tuple[torch.Tensor, torch.Tensor]] | None = None,
                            ) -> dict:
    """The paper's few-shot linear evaluation of a model's frozen representation.

    `train_set` / `test_set` yield (uint8 image, label) at the model's resolution (vitzoo.data); the
    model's config says how to normalise. Returns {k: mean test accuracy over `draws` draws}. Only
    the training images some draw uses are passed through the model, once, and only their features
    are held; the test set (or its first `test_limit` images) once. `features(dataset, indices)`
    replaces `extract_features` (the training loop's shares the work between processes).
    """
    if features is None:
        def features(dataset, indices):
            return extract_features(model, dataset, indices, batch_size=batch_size,
                                    num_workers=num_workers)

    shots = sorted({int(k) for k in shots})
    labels = _labels_of(train_set)
    drawn = fewshot_draws(labels, shots, draws, seed)
    needed = torch.cat([idx for sets in drawn.values() for idx in sets]).unique()  # sorted
    feats, _ = features(train_set, needed.tolist())  # row i: training image needed[i]
    test_indices = list(range(min(len(test_set), test_limit))) if test_limit else None
    test_feats, test_labels = features(test_set, test_indices)
    return _fewshot_scores(drawn, lambda idx: feats[torch.searchsorted(needed, idx)], labels,
                           test_feats, test_labels, l2_reg, details)


# ---------------------------------------------------------------------------- linear probe
def linear_probe(model, train_set: Dataset, test_set: Dataset, *, l2_reg: float = 1e-4,
                 max_iter: int = 200, train_limit: int | None = None, batch_size: int = 256,
                 num_workers: int = 0) -> dict[str, float]:
    """Multinomial logistic regression on frozen (standardised) features, full-batch L-BFGS;
    returns the test top-1 accuracy. `l2_reg` is the weight penalty per sample."""
    train_idx = list(range(min(len(train_set), train_limit))) if train_limit else None
    x, y = extract_features(model, train_set, train_idx, batch_size=batch_size,
                            num_workers=num_workers)
    x_test, y_test = extract_features(model, test_set, batch_size=batch_size,
                                      num_workers=num_workers)
    mean, std = x.mean(0, keepdim=True), x.std(0, keepdim=True) + 1e-5
    x, x_test = (x - mean) / std, (x_test - mean) / std
    num_classes = int(max(y.max(), y_test.max())) + 1
    linear = torch.nn.Linear(x.shape[1], num_classes)
    torch.nn.init.zeros_(linear.weight)
    torch.nn.init.zeros_(linear.bias)
    optimizer = torch.optim.LBFGS(linear.parameters(), lr=1.0, max_iter=max_iter,
                                  line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(linear(x), y) + l2_reg * linear.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        top1 = float((linear(x_test).argmax(1) == y_test).float().mean())
        train_top1 = float((linear(x).argmax(1) == y).float().mean())
    return {"top1": top1, "train_top1": train_top1}


__all__ = [
    "FEWSHOT_L2_REG", "accuracy", "check_shots", "classification_sums", "eval_loader",
    "extract_features", "fewshot_draws", "fewshot_from_features", "fewshot_linear_accuracy",
    "linear_probe", "metrics_from_sums", "ridge_fewshot_accuracy", "sum_dtype",
]
