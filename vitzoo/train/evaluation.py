"""The model of a run measured during and after training, each process a share of the images and every
process the same numbers.

Top-1, top-5 and loss (`measure`): rank r scores images r, r + W, r + 2W, ... (W the world size) and
the sums are all-reduced. The paper's few-shot linear accuracy (`fewshot`, vitzoo.evaluate): each rank
extracts the features of its share of the images, and every rank gets all of them back, in order, for
the closed-form regression. A rank whose share fails (a damaged image) fails every rank at once
(`distributed.all_or_none`), never leaving the others waiting in the gather. Each evaluation makes its
loader and its workers end with it: a rank keeps only the training loader's workers alive between
evaluations (a persistent loader per evaluated split would triple them: 192 processes on an 8-GPU node
with 8 workers each, each holding the dataset's file list).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch.utils.data import Dataset

from vitzoo.evaluate import (
    classification_sums,
    eval_loader,
    extract_features,
    fewshot_linear_accuracy,
    metrics_from_sums,
)
from vitzoo.train import distributed


class Evaluation:
    """`model` (the plain module, not its DDP or compiled wrapper) measured in batches of `batch_size`
    under autocast to `autocast_dtype` (None: float32). `batches(dataset, indices, batch_size)`, where
    given, makes each pass's (uint8 images, labels) (vitzoo.train.inputs: decoded on the device);
    otherwise a loader of `num_workers` workers does."""

    def __init__(self, model: torch.nn.Module, env: distributed.Env, *, batch_size: int, num_workers: int,
                 pin_memory: bool, autocast_dtype: torch.dtype | None,
                 batches: Callable[[Dataset, Sequence[int], int], Iterable] | None = None) -> None:
        self.model, self.env, self.autocast_dtype = model, env, autocast_dtype
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.batches = batches

    def loader(self, dataset: Dataset, indices: Sequence[int]) -> Iterable:
        if self.batches is not None:
            return self.batches(dataset, indices, self.batch_size)
        return eval_loader(dataset, indices, batch_size=self.batch_size, num_workers=self.num_workers,
                           pin_memory=self.pin_memory)

    def measure(self, dataset: Dataset) -> dict[str, float]:
        """Top-1, top-5 and loss on `dataset`, each rank a share (its workers end with the pass)."""
        loader = self.loader(dataset, range(self.env.rank, len(dataset), self.env.world_size))
        sums = distributed.all_or_none(lambda: classification_sums(  # the loader says which images, how batched
            self.model, dataset, autocast_dtype=self.autocast_dtype, loader=loader), self.env)
        return metrics_from_sums(distributed.all_reduce(sums, self.env))

    def fewshot(self, train_set: Dataset, test_set: Dataset, shots: Iterable[int], seed: int) -> dict:
        """The few-shot linear accuracy for each of `shots`, averaged over 5 draws of the training images."""
        return fewshot_linear_accuracy(self.model, train_set, test_set, shots, draws=5, seed=seed, features=self.features)

    def features(self, dataset: Dataset, indices: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features of `indices` (None: all of `dataset`): each rank extracts every world_size-th image,
        every rank gets all of them, in order."""
        env = self.env
        indices = list(range(len(dataset))) if indices is None else list(indices)
        mine = indices[env.rank :: env.world_size]
        # a rank with no image of its own passes one through anyway, to learn the features' width
        passed = mine or indices[:1]
        features, labels = distributed.all_or_none(
            lambda: extract_features(self.model, dataset, passed, loader=self.loader(dataset, passed)), env)
        features, labels = features[: len(mine)], labels[: len(mine)]
        return (distributed.gather_strided(features, len(indices), env), distributed.gather_strided(labels, len(indices), env))


__all__ = ["Evaluation"]
