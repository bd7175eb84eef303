"""The data order of training: which images each process takes at each step, for any number of processes.

The global batch is `batch_size` whatever the number of processes: each optimizer step consumes one
global batch of the epoch's permutation, split into `world_size` equal shares, each share into
micro-batches (gradient accumulation). The order depends on the seed and the epoch only: the N
processes of a run together see the images one process would, and a resumed run those of an
uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler):
    """Micro-batches of keys (epoch, index) for one process.

    Epoch e's order is a permutation seeded by (seed, e), cut into global batches of `global_batch`
    (an incomplete last batch is dropped). Process `rank` takes the rank-th of `world_size` equal
    contiguous shares of each global batch, in micro-batches of `micro_batch`. The global batches do
    not depend on the world size, and `start_step` skips the steps already done (resume).
    """

    def __init__(self, size: int, global_batch: int, micro_batch: int, rank: int, world_size: int, seed: int,
                 epoch: int, start_step: int = 0) -> None:
        self.size, self.global_batch, self.micro_batch = size, global_batch, micro_batch
        self.rank, self.world_size, self.seed, self.epoch, self.start_step = rank, world_size, seed, epoch, start_step
        self.steps = size // global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Continue with this epoch's order from `start_step` (one loader, its workers kept, serves every epoch)."""
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps - self.start_step) * (self.global_batch // self.world_size // self.micro_batch)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=g).tolist()
        share = self.global_batch // self.world_size
        for step in range(self.start_step, self.steps):
            start = step * self.global_batch + self.rank * share
            mine = order[start : start + share]
            for i in range(0, share, self.micro_batch):
                yield [(self.epoch, index) for index in mine[i : i + self.micro_batch]]


__all__ = ["GlobalBatchSampler"]
