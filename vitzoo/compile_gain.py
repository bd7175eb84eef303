"""Whether compiling a model for inference pays on this machine: eager and compiled timed in turns,
repeated, and the gain bounded by what the model's FLOPs allow (`vitzoo.inference`'s `compile="auto"`).

A gain is kept for the next process (`vitzoo.measurements`) only where it can be trusted:

- its repeats agree: the gain of each repeat (eager's best seconds per call over compiled's) within
  `MAX_SPREAD` of each other, relative to their median;
- it is plausible: neither path ran faster than the model's FLOPs at `FLOP_MARGIN` x the matrix-product
  speed this device reaches at the model's own product shape (compiled kernels may lay out the weights
  better than a plain product, not by more than that), and the gain is at most `MAX_GAIN` (removing
  Python's per-operator cost and fusing element-wise work gave 1.1-1.2x eager in this project's CPU
  measurements; a 2-layer ViT once measured 46x on a busy machine, where 1.06x was true).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from vitzoo.fastest import mlp_shape, time_matmul
from vitzoo.measurements import MAX_SPREAD, spread

REPEATS = 3  # eager and compiled timed in turns this many times
CHECK_REPEATS = 1  # at use of a kept gain, after the compilation it pays for anyway
CALLS = 2  # calls per timing, the fastest counted
FLOP_MARGIN = 2.0  # x the plain product's speed: the fastest a compiled model may run its FLOPs
MAX_GAIN = 4.0  # x eager's speed: more than compiling has given on a CPU, taken for a faulty measurement


@dataclasses.dataclass(frozen=True)
class Gain:
    """Compiled's speed over eager's (the median of the repeats' gains), the spread of those gains, the
    median seconds per call of each, and `least_s`: the fewest seconds per call the model's FLOPs allow
    (0: not bounded)."""

    gain: float
    spread: float
    eager_s: float
    compiled_s: float
    least_s: float = 0.0

    @property
    def ceiling(self) -> float:
        """The largest gain that is plausible: eager's time over the least one, at most `MAX_GAIN`."""
        return min(MAX_GAIN, self.eager_s / self.least_s) if self.least_s > 0 else MAX_GAIN

    def plausible(self) -> bool:
        return self.gain <= self.ceiling and self.eager_s >= self.least_s and self.compiled_s >= self.least_s

    def trusted(self) -> bool:
        """Plausible and repeatable: what may be kept for the next process."""
        return self.plausible() and self.spread <= MAX_SPREAD

    def doubt(self) -> str:
        """Why the gain is not kept ("" where it is)."""
        if not self.plausible():
            return (f"implausible: more than the model's FLOPs and compilation allow here (at most {self.ceiling:.2f}x), "
                    "so eager and not kept")
        if self.spread > MAX_SPREAD:
            return f"noisy: its {REPEATS} repeats spread {self.spread:.0%}, so not kept"
        return ""

    def entry(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in dataclasses.asdict(self).items()}


def seconds_per_call(run: Callable[[torch.Tensor], object], example: torch.Tensor, calls: int = CALLS) -> float:
    """The fewest seconds of `calls` calls of `run` on `example` (the device synchronised)."""
    best = float("inf")
    for _ in range(calls):
        if example.device.type == "cuda":
            torch.cuda.synchronize(example.device)
        start = time.perf_counter()
        run(example)
        if example.device.type == "cuda":
            torch.cuda.synchronize(example.device)
        best = min(best, time.perf_counter() - start)
    return best


def measure(eager: Callable[[torch.Tensor], object], compiled: Callable[[torch.Tensor], object], example: torch.Tensor,
            repeats: int = REPEATS, least_s: float = 0.0) -> Gain:
    """Eager and compiled timed in turns (which goes first alternates), `repeats` times, after a warm-up
    call of each."""
    eager(example)
    compiled(example)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for repeat in range(repeats):
        turns = [("eager", eager), ("compiled", compiled)]
        for name, run in turns[::-1] if repeat % 2 else turns:
            times[name].append(timed(name, run, example))
    gains = [e / c for e, c in zip(times["eager"], times["compiled"])]
    return Gain(statistics.median(gains), spread(gains), statistics.median(times["eager"]),
                statistics.median(times["compiled"]), least_s)


def timed(name: str, run: Callable[[torch.Tensor], object], example: torch.Tensor, calls: int = CALLS) -> float:
    """One timing of the path `name` ("eager" or "compiled"): `seconds_per_call` (tests fake this)."""
    return seconds_per_call(run, example, calls)


def least_seconds(model: nn.Module, example: torch.Tensor, run: Callable[[torch.Tensor], object]) -> float:
    """The fewest seconds a call of `model` on `example` can take: its FLOPs (counted over one call of
    `run`; a fused attention kernel is not seen, which only lowers the bound) at `FLOP_MARGIN` x the speed
    of the model's widest matrix product in its dtype on its device."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run(example)
    batch = example.shape[0] if example.dim() == 4 else 1
    rate = time_matmul(*mlp_shape(model, batch), example.dtype, budget_s=0.05, device=example.device)
    return counter.get_total_flops() / (FLOP_MARGIN * rate * 1e9)


__all__ = ["Gain", "least_seconds", "measure", "seconds_per_call"]
