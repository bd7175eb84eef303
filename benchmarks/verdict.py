"""The one rule by which every finding of every ablation is judged.

A finding compares cells of a table (a cell: one configuration, trained with several seeds). The
comparison is a *contrast*: a weighted sum of cell means, e.g. "learned 1-D minus none" is
{+1: learned_1d, -1: none}, "ViT at the hybrid's compute" interpolates two ViT cells with weights t
and 1 - t, "the ResNet's lead shrinks with data" is (ResNet - ViT at 1k) - (ResNet - ViT at 60k).
Its standard error over seeds is sqrt(sum_i w_i^2 s_i^2 / n_i), s_i the seeds' standard deviation in
cell i (the cells' seeds are independent runs).

**A difference counts when it is larger than twice its standard error** (|d| > 2 SE, about a 95%
two-sided test). A finding that claims a difference is reproduced when every difference it names
counts and has the paper's sign; a finding that claims no difference is reproduced when none counts.
With one seed per cell there is no standard error and the finding is not testable; a finding whose
cells a scale does not run (the main job runs two cells of Table 8) is not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

RULE = "a difference counts when |d| > 2 SE (standard error over seeds)"

# what a finding claims of each of its contrasts
POSITIVE = "positive"  # the contrast is larger than zero
ZERO = "zero"  # no difference
NOT_COMPARED = "not compared"  # the finding's cells are not in the table


@dataclass(frozen=True)
class Estimate:
    """A contrast of cell means with its standard error over seeds (nan with a single seed)."""

    value: float
    se: float

    @property
    def counts(self) -> bool:
        """The rule: a difference counts when it is larger than twice its standard error."""
        return math.isfinite(self.se) and abs(self.value) > 2 * self.se

    def describe(self) -> str:
        if not math.isfinite(self.se):
            return f"d = {self.value:+.4f} (one seed: no standard error)"
        return f"d = {self.value:+.4f}, 2 SE = {2 * self.se:.4f}"


def mean_and_variance(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, unbiased variance (nan for one value) and count."""
    n = len(values)
    if n == 0:
        raise ValueError("a cell without results cannot be compared")
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan")
    return mean, variance, n


def contrast(cells: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> Estimate:
    """sum_i w_i * mean(cell_i), with its standard error over the seeds of each cell."""
    value, variance = 0.0, 0.0
    for label, weight in weights.items():
        mean, var, n = mean_and_variance(cells[label])
        value += weight * mean
        variance += weight**2 * var / n
    return Estimate(value, math.sqrt(variance) if math.isfinite(variance) else float("nan"))


@dataclass(frozen=True)
class Judgement:
    """The verdict on one finding, with the numbers behind it."""

    verdict: str  # "reproduced" | "not reproduced" | "not testable" | "not compared"
    evidence: list[tuple[str, Estimate]]  # (what was compared, the estimate)

    @property
    def reproduced(self) -> bool:
        return self.verdict == "reproduced"

    def describe(self) -> str:
        return "; ".join(f"{name}: {estimate.describe()}" for name, estimate in self.evidence)


def judge(expect: str, evidence: list[tuple[str, Estimate]]) -> Judgement:
    """Apply the rule to every contrast a finding names."""
    if expect not in (POSITIVE, ZERO):
        raise ValueError(f"a finding expects {POSITIVE!r} or {ZERO!r}, not {expect!r}")
    if not evidence:
        return Judgement(NOT_COMPARED, evidence)
    if any(not math.isfinite(e.se) for _, e in evidence):
        return Judgement("not testable", evidence)
    if expect == POSITIVE:
        ok = all(e.counts and e.value > 0 for _, e in evidence)
    else:
        ok = not any(e.counts for _, e in evidence)
    return Judgement("reproduced" if ok else "not reproduced", evidence)
