"""Evaluation: top-1 / top-5 accuracy, the paper's few-shot linear evaluation, and a linear probe.

Few-shot linear evaluation (section 4.1, Appendix D), as big_vision's `_fewshot_acc_fn`: the frozen
pre-logits features of k training images per class, whitened with their mean and std (+1e-5) and a
constant 100 appended as the bias, are mapped to {-1, 1}^C targets by ridge regression in closed
form, W = (X^T X + 2**10 I)^-1 X^T T in float64; a test image's class is the arg max of its
regressed vector. Averaged over random draws of the k-shot sets.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset

from vitzoo.data.transforms import Normalizer
from vitzoo.data.workers import worker_start
from vitzoo.errors import ConfigError
from vitzoo.precision import autocast, sum_dtype

FEWSHOT_L2_REG = 2.0**10
FEWSHOT_BIAS = 100.0
Features = Callable[[Dataset, Sequence[int] | None], tuple[torch.Tensor, torch.Tensor]]


def eval_loader(dataset: Dataset, indices: Sequence[int] | None = None, *, batch_size: int = 256,
                num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """Batches of `dataset` (or of its `indices`) in order."""
    data = dataset if indices is None else Subset(dataset, list(indices))
    return DataLoader(data, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                      multiprocessing_context=worker_start(num_workers))


def _normalised(model: torch.nn.Module, batches: Iterable):
    """(normalised images on the model's device, labels there) of each (uint8 images, labels)."""
    config, device = model.config, next(model.parameters()).device
    normalize = Normalizer(config.mean, config.std, config.in_chans, device)
    for images, labels in batches:
        yield normalize(images.to(device, non_blocking=True)), labels.to(device, non_blocking=True)


@torch.no_grad()
def classification_sums(model: torch.nn.Module, batches: Iterable,
                        autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[top-1 correct, top-5 correct, summed loss, count]: sums, which processes add."""
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    sums = torch.zeros(4, dtype=sum_dtype(device), device=device)
    for x, labels in _normalised(model, batches):
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


def accuracy(model: torch.nn.Module, dataset: Dataset, *, batch_size: int = 256,
             num_workers: int = 0) -> dict[str, float]:
    """Top-1 and top-5 accuracy and mean cross-entropy of `model` on `dataset` (uint8 images)."""
    loader = eval_loader(dataset, batch_size=batch_size, num_workers=num_workers)
    return metrics_from_sums(classification_sums(model, loader))


@torch.no_grad()
def extract_features(model: torch.nn.Module,
                     batches: Iterable) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen pre-logits representations (float32, on the CPU) and labels of the batches."""
    was_training = model.training
    model.eval()
    features, targets = [], []
    for x, labels in _normalised(model, batches):
        tokens = model.forward_features(x)
        features.append(model.forward_head(tokens, pre_logits=True).float().cpu())
        targets.append(labels.cpu())
    model.train(was_training)
    return torch.cat(features), torch.cat(targets)


def fewshot_draws(labels: torch.Tensor, shots: Iterable[int], draws: int,
                  seed: int) -> dict[int, list[torch.Tensor]]:
    """For each k, `draws` nested index sets of k images per class (all a class holds if fewer);
    a k no class holds is refused: every draw would be the whole training set."""
    classes, counts = labels.unique(return_counts=True)
    per_class = dict(zip(classes.tolist(), counts.tolist()))
    shots = sorted({int(k) for k in shots})
    largest, smallest = max(per_class.values()), min(per_class.values())
    for k in shots:
        if k > largest:
            raise ConfigError(f"fewshot k={k}: no class of the training set holds {k} images (the "
                              f"largest holds {largest}, the smallest {smallest}): choose k <= "
                              f"{smallest}")
        if short := [c for c, n in per_class.items() if n < k]:
            warnings.warn(f"fewshot k={k}: {len(short)} of {len(per_class)} classes hold fewer "
                          f"than {k} training images (the smallest {smallest}); their k-shot sets "
                          "take all they hold", stacklevel=3)
    out: dict[int, list[torch.Tensor]] = {k: [] for k in shots}
    for d in range(draws):
        g = torch.Generator().manual_seed(seed * 100_003 + d)
        orders = []
        for c in per_class:
            members = (labels == c).nonzero().flatten()
            orders.append(members[torch.randperm(len(members), generator=g)])
        for k in shots:
            out[k].append(torch.cat([order[:k] for order in orders]))
    return out


def ridge_fewshot_accuracy(x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor,
                           y_test: torch.Tensor, num_classes: int,
                           l2_reg: float = FEWSHOT_L2_REG) -> float:
    """Closed-form regularised least squares from features to {-1, 1} targets; test accuracy."""
    x, x_test = x.double(), x_test.double()
    mean, std = x.mean(dim=0, keepdim=True), x.std(dim=0, correction=0, keepdim=True) + 1e-5

    def prepare(features: torch.Tensor) -> torch.Tensor:
        bias = torch.full((len(features), 1), FEWSHOT_BIAS, dtype=torch.float64)
        return torch.cat([(features - mean) / std, bias], dim=1)

    a, a_test = prepare(x), prepare(x_test)
    targets = 2.0 * F.one_hot(y.long(), num_classes).double() - 1.0
    n, d = a.shape
    if n < d:  # the dual form: W = A^T (A A^T + l2 I)^-1 T
        w = a.T @ torch.linalg.solve(a @ a.T + l2_reg * torch.eye(n, dtype=torch.float64), targets)
    else:
        w = torch.linalg.solve(a.T @ a + l2_reg * torch.eye(d, dtype=torch.float64), a.T @ targets)
    return float(((a_test @ w).argmax(dim=1) == y_test.long()).double().mean())


def fewshot_linear_accuracy(model: torch.nn.Module, train_set: Dataset, test_set: Dataset,
                            shots: Iterable[int] = (1, 5, 10, 25), draws: int = 5, seed: int = 0, *,
                            l2_reg: float = FEWSHOT_L2_REG, batch_size: int = 256,
                            num_workers: int = 0, details: bool = False,
                            features: Features | None = None) -> dict:
    """{k: the mean test accuracy over `draws` draws} of the model's frozen features, computed
    once for the training images the draws use (`features` replaces the model's extraction)."""
    if features is None:
        def features(dataset, indices):
            return extract_features(model, eval_loader(dataset, indices, batch_size=batch_size,
                                                       num_workers=num_workers))

    targets = getattr(train_set, "targets", None)
    labels = (torch.as_tensor(targets).long() if targets is not None
              else torch.tensor([int(train_set[i][1]) for i in range(len(train_set))]))
    drawn = fewshot_draws(labels, shots, draws, seed)  # refused before any feature
    needed = torch.cat([idx for sets in drawn.values() for idx in sets]).unique()  # sorted
    rows, _ = features(train_set, needed.tolist())  # row i: training image needed[i]
    test_features, test_labels = features(test_set, None)
    num_classes = int(max(labels.max(), test_labels.max())) + 1
    result = {}
    for k, index_sets in drawn.items():
        accs = [ridge_fewshot_accuracy(rows[torch.searchsorted(needed, idx)], labels[idx],
                                       test_features, test_labels, num_classes, l2_reg)
                for idx in index_sets]
        mean = sum(accs) / len(accs)
        std = math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs))
        result[k] = {"mean": mean, "std": std, "accuracies": accs} if details else mean
    return result


def linear_probe(model: torch.nn.Module, train_set: Dataset, test_set: Dataset, *,
                 l2_reg: float = 1e-4, max_iter: int = 200, batch_size: int = 256,
                 num_workers: int = 0) -> dict[str, float]:
    """Logistic regression on frozen standardised features (full-batch L-BFGS): top-1."""
    x, y = extract_features(model, eval_loader(train_set, batch_size=batch_size,
                                               num_workers=num_workers))
    x_test, y_test = extract_features(model, eval_loader(test_set, batch_size=batch_size,
                                                         num_workers=num_workers))
    mean, std = x.mean(0, keepdim=True), x.std(0, keepdim=True) + 1e-5
    x, x_test = (x - mean) / std, (x_test - mean) / std
    linear = torch.nn.Linear(x.shape[1], int(max(y.max(), y_test.max())) + 1)
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
        return {"top1": float((linear(x_test).argmax(1) == y_test).float().mean())}
