"""The one rule by which every finding of every ablation is judged.

A finding compares cells of a table (a cell: one configuration, trained with several seeds). The
comparison is a *contrast*: a weighted sum of cell means, e.g. "learned 1-D minus none" is
{+1: learned_1d, -1: none}, "ViT at the hybrid's compute" interpolates two ViT cells with weights t
and 1 - t, "the ResNet's lead shrinks with data" is (ResNet - ViT at 1k) - (ResNet - ViT at 60k).

**Seeds are paired.** The same seed index draws the same training subset and the same data order in
every cell (vitzoo/data/folders.py), so the cells' seeds are not independent samples: a seed whose
data order suits one model tends to suit the others. Where the cells of a contrast share seeds, the
contrast is computed per seed, c_s = sum_i w_i x_{i,s}, over the seeds every cell has, and judged as
one sample: d = mean(c_s), SE = sd(c_s) / sqrt(n), n - 1 degrees of freedom. Only cells that share
fewer than two seeds are treated as independent: SE = sqrt(sum_i w_i^2 s_i^2 / n_i), Welch and
Satterthwaite's degrees of freedom (sum_i v_i)^2 / sum_i (v_i^2 / (n_i - 1)).

**Every contrast gets its 95% confidence interval d ± t SE**, t Student's 0.975 quantile at its degrees
of freedom (12.7 at df = 1, 4.3 at df = 2, 1.96 only for many seeds). Every claim has three outcomes:
**reproduced** when each interval it names lies wholly on the claimed side (above zero for a claimed
difference; inside the stated margin for a claim of no difference: two one-sided tests, each at 2.5%),
**contradicted** when an interval lies wholly on the other side (below zero; wholly outside the
margin), **inconclusive** otherwise. A margin relative to another contrast g is tested as the contrasts
f*g - d and f*g + d (both above zero: |d| < f*g), so that the reference's own noise, and the cells it
shares with d, count.

**Not testable**, with the reason, where the seeds cannot give an interval: a cell with fewer than two
seeds (or fewer than two seeds common to the cells), a cell whose seeds are identical (a deterministic
run repeated, a rounded metric: identical values say nothing about the spread), a contrast with the
same value in every seed, and a relative margin whose reference contrast is not above zero (a
fraction of it is no margin). A finding whose cells a scale does not run is not compared.

**Multiplicity.** Each verdict is a one-sided test at 2.5%, with its p-value: for a reproduced claim
the largest of its contrasts' (all must hold), for a contradicted one the smallest (one suffices),
for an inconclusive one the nearer of the two. `holm` adjusts the p-values of a table's judged rows
(Holm's step-down procedure, family-wise error 2.5% a side); a verdict that survives it would survive
having tested every row of its table.

The t distribution is computed here (no scipy): bisection on Student's distribution function, written
with the regularized incomplete beta function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

LEVEL = 0.95  # two-sided confidence of every interval
ALPHA = (1.0 - LEVEL) / 2.0  # each side's: the one-sided level of every verdict
RULE = ("95% confidence intervals d ± t SE over seeds, paired by seed where the cells share seeds (the same seed "
        "draws the same subset and order in every cell; otherwise Welch-Satterthwaite), t Student's quantile at the "
        "contrast's degrees of freedom; a claim is reproduced when every interval lies wholly on the claimed side (above "
        "zero, or inside the finding's stated margin), contradicted when one lies wholly on the other (below zero, or "
        "wholly outside the margin), inconclusive otherwise; not testable, with the reason, for fewer than two seeds, "
        "identical seeds or a margin's reference not above zero; Holm's correction across each table's judged rows "
        "beside every verdict")

# what a finding claims of each of its contrasts
POSITIVE = "positive"  # the contrast is larger than zero
ZERO = "zero"  # no difference (within a margin)
REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
NOT_TESTABLE = "not testable"  # the seeds give no interval (the reason is stated)
NOT_COMPARED = "not compared"  # the finding's cells are not in the table
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE, NOT_COMPARED)
JUDGED = (REPRODUCED, CONTRADICTED, INCONCLUSIVE)  # the rows of a table's multiplicity family


# ---------------------------------------------------------------------------- Student's t
def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"the incomplete beta function's fraction did not converge (a={a}, b={b}, x={x})")


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"I_x(a, b) needs a, b > 0 and x in [0, 1], got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # where the fraction converges fast; else by symmetry
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (any df > 0, not only whole numbers)."""
    if not df > 0:
        raise ValueError(f"Student's t needs degrees of freedom > 0, got {df}")
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p: bisection on `t_cdf` (to 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    while high - low > 1e-10 * max(1.0, high):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


# ---------------------------------------------------------------------------- contrasts
@dataclass(frozen=True)
class Estimate:
    """A contrast of cell means with its standard error over seeds and its degrees of freedom; `seeds`
    the seeds it used (pairs, when `paired`), `untestable` why it has no interval ('' when it has)."""

    value: float
    se: float
    df: float = math.inf
    seeds: int | None = None
    paired: bool = False
    untestable: str = ""

    @property
    def testable(self) -> bool:
        return not self.untestable and math.isfinite(self.se) and self.se > 0 and not math.isnan(self.df)

    @property
    def quantile(self) -> float:
        """Student's t at (1 + LEVEL) / 2 for this contrast's degrees of freedom."""
        return t_quantile((1.0 + LEVEL) / 2.0, self.df)

    @property
    def interval(self) -> tuple[float, float]:
        """The LEVEL confidence interval of the contrast."""
        half = self.quantile * self.se
        return self.value - half, self.value + half

    @property
    def p_above(self) -> float:
        """One-sided p-value of "the contrast is above zero" (small when the data say so)."""
        return 1.0 - t_cdf(self.value / self.se, self.df)

    @property
    def p_below(self) -> float:
        """One-sided p-value of "the contrast is below zero"."""
        return t_cdf(self.value / self.se, self.df)

    def shifted(self, by: float) -> Estimate:
        """by + this contrast (a constant added: the same standard error)."""
        return Estimate(by + self.value, self.se, self.df, self.seeds, self.paired, self.untestable)

    def negated(self) -> Estimate:
        return Estimate(-self.value, self.se, self.df, self.seeds, self.paired, self.untestable)

    def describe(self) -> str:
        used = "" if self.seeds is None else f", {self.seeds} {'paired seeds' if self.paired else 'seeds'}"
        if not self.testable:
            return f"d = {self.value:+.4f} (not testable: {self.untestable or 'no standard error'})"
        low, high = self.interval
        return (f"d = {self.value:+.4f}, {LEVEL:.0%} CI [{low:+.4f}, {high:+.4f}] "
                f"(t = {self.quantile:.2f}, df {self.df:.1f}{used})")


def mean_and_variance(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, unbiased variance (nan for one value) and count."""
    n = len(values)
    if n == 0:
        raise ValueError("a cell without results cannot be compared")
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan")
    return mean, variance, n


def _no_spread(values: Sequence[float]) -> bool:
    """Equal to within float rounding (a difference of equal differences is not exactly zero in floats)."""
    return max(values) - min(values) <= 1e-9 * max(1.0, *(abs(v) for v in values))


def _too_few_or_identical(label: str, values: Sequence[float]) -> str:
    """Why a cell's seeds give no spread ('' when they do)."""
    if len(values) < 2:
        return f"'{label}' has {len(values)} seed{'s' * (len(values) != 1)} (a standard error needs two)"
    if _no_spread(values):
        return (f"the {len(values)} seeds of '{label}' are identical ({values[0]:.4f}): a repeated deterministic run "
                "or a rounded metric says nothing about the spread")
    return ""


def contrast(cells: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> Estimate:
    """sum_i w_i * mean(cell_i) for cells whose seeds are independent: its standard error over the seeds
    of each cell and its Welch-Satterthwaite degrees of freedom."""
    value, parts, reasons = 0.0, [], []
    for label, weight in weights.items():
        mean, var, n = mean_and_variance(cells[label])
        value += weight * mean
        parts.append((weight**2 * var / n, n))
        reasons += [why] if (why := _too_few_or_identical(label, cells[label])) else []
    seeds = min(n for _, n in parts)
    if reasons:
        return Estimate(value, float("nan"), float("nan"), seeds, False, "; ".join(reasons))
    total = sum(v for v, _ in parts)
    df = total**2 / sum(v * v / (n - 1) for v, n in parts)
    return Estimate(value, math.sqrt(total), df, seeds, False)


def paired_contrast(cells: Mapping[str, Mapping[Any, float]], weights: Mapping[str, float]) -> Estimate:
    """sum_i w_i * mean(cell_i) over seeds: per seed where the cells share at least two (`cells`: label ->
    {seed: value}), one sample of n - 1 degrees of freedom; else the cells as independent (`contrast`).
    A seed some cell lacks (its metric missing, the run absent) is left out of the pairs: `seeds` says
    how many were used."""
    means = {label: sum(cells[label].values()) / len(cells[label]) for label in weights if cells[label]}
    value = sum(w * means[label] for label, w in weights.items()) if len(means) == len(weights) else float("nan")
    if empty := [label for label in weights if not cells[label]]:
        return Estimate(value, float("nan"), float("nan"), 0, False, "; ".join(f"'{label}' has no seed with this metric"
                                                                             for label in empty))
    common = set.intersection(*(set(cells[label]) for label in weights))
    if len(common) < 2 and all(len(cells[label]) >= 2 for label in weights):
        return contrast({label: list(cells[label].values()) for label in weights}, weights)
    order = sorted(common, key=str)
    if len(order) < 2:
        return Estimate(value, float("nan"), float("nan"), len(order), True,
                        f"{len(order)} seed{'s' * (len(order) != 1)} common to every cell (a standard error needs two)")
    for label in weights:  # a cell that does not vary with the seed gives no spread to pair against
        if why := _too_few_or_identical(label, [cells[label][s] for s in order]):
            return Estimate(value, float("nan"), float("nan"), len(order), True, why)
    per_seed = [sum(w * cells[label][s] for label, w in weights.items()) for s in order]
    mean, var, n = mean_and_variance(per_seed)
    if _no_spread(per_seed):
        return Estimate(mean, float("nan"), float("nan"), n, True,
                        f"the contrast is {mean:+.4f} in each of its {n} seeds: no spread to judge by")
    return Estimate(mean, math.sqrt(var / n), float(n - 1), n, True)


@dataclass(frozen=True)
class Within:
    """A difference d against its margin M: the contrasts M - d and M + d, both above zero when
    |d| < M. An absolute margin is a constant (`absolute`); a relative one, a fraction of another
    contrast, is estimated with its own standard error (`benchmarks.spec.Margin`); `untestable` says why
    a margin is none (a relative one whose reference is not above zero)."""

    margin: float  # M's value (its point estimate when relative)
    below: Estimate  # M - d
    above: Estimate  # M + d
    untestable: str = ""

    @classmethod
    def absolute(cls, d: Estimate, margin: float) -> Within:
        if not margin > 0:
            raise ValueError(f"a margin of no difference must be above zero, got {margin}")
        return cls(margin, d.negated().shifted(margin), d.shifted(margin))

    @property
    def testable(self) -> bool:
        return not self.untestable and self.below.testable and self.above.testable

    @property
    def reason(self) -> str:
        return self.untestable or self.below.untestable or self.above.untestable

    @property
    def p_inside(self) -> float:
        """Two one-sided tests: the larger p-value of M - d > 0 and M + d > 0."""
        return max(self.below.p_above, self.above.p_above)

    @property
    def p_outside(self) -> float:
        """The smaller p-value of M - d < 0 and M + d < 0 (d wholly beyond one side)."""
        return min(self.below.p_below, self.above.p_below)

    def verdict(self) -> str:
        if min(self.below.interval[0], self.above.interval[0]) > 0:
            return REPRODUCED  # the whole interval inside the margin
        if min(self.below.interval[1], self.above.interval[1]) < 0:
            return CONTRADICTED  # the whole interval beyond one side of the margin
        return INCONCLUSIVE

    def describe(self) -> str:
        """M - |d| on the side nearer the margin, with its interval."""
        near = min((self.below, self.above), key=lambda e: e.interval[0])
        low, high = near.interval
        return f"margin ±{self.margin:.4f}, margin - |d| = {near.value:+.4f}, CI [{low:+.4f}, {high:+.4f}]"


@dataclass(frozen=True)
class Comparison:
    """One contrast a finding names: what is compared, its estimate, and for a claim of no
    difference, the estimate against its margin."""

    name: str
    estimate: Estimate
    within: Within | None = None

    @property
    def testable(self) -> bool:
        return self.estimate.testable and (self.within is None or self.within.testable)

    @property
    def reason(self) -> str:
        """Why it is not testable ('' when it is)."""
        if not self.estimate.testable:
            return self.estimate.untestable or "no standard error"
        return "" if self.within is None else self.within.reason

    def verdict(self) -> str:
        if self.within is not None:
            return self.within.verdict()
        low, high = self.estimate.interval
        return REPRODUCED if low > 0 else CONTRADICTED if high < 0 else INCONCLUSIVE

    @property
    def p_claim(self) -> float:
        """One-sided p-value of the claim (a difference above zero, or one inside the margin)."""
        return self.estimate.p_above if self.within is None else self.within.p_inside

    @property
    def p_against(self) -> float:
        """One-sided p-value of its opposite (below zero, or wholly outside the margin)."""
        return self.estimate.p_below if self.within is None else self.within.p_outside

    def describe(self) -> str:
        text = f"{self.name}: {self.estimate.describe()}"
        return text + (f"; {self.within.describe()}" if self.within is not None and self.testable else "")


@dataclass(frozen=True)
class Judgement:
    """The verdict on one finding, with the numbers behind it: `p` the one-sided p-value of the verdict
    (None where nothing was tested), `reason` why it is not testable."""

    verdict: str  # one of VERDICTS
    evidence: list[Comparison]
    p: float | None = None
    reason: str = ""

    @property
    def reproduced(self) -> bool:
        return self.verdict == REPRODUCED

    def describe(self) -> str:
        return "; ".join(c.describe() for c in self.evidence)


def judge(expect: str, evidence: list[Comparison]) -> Judgement:
    """Apply the rule to every contrast a finding names: reproduced when every one is, contradicted when
    one is, inconclusive otherwise."""
    if expect not in (POSITIVE, ZERO):
        raise ValueError(f"a finding expects {POSITIVE!r} or {ZERO!r}, not {expect!r}")
    if not evidence:
        return Judgement(NOT_COMPARED, evidence)
    if expect == ZERO and (missing := [c.name for c in evidence if c.within is None]):
        raise ValueError(f"a claim of no difference is judged against a margin; none given for {missing}")
    if expect == POSITIVE and any(c.within is not None for c in evidence):
        raise ValueError("a claimed difference is judged against zero, not against a margin")
    if untestable := [c for c in evidence if not c.testable]:
        return Judgement(NOT_TESTABLE, evidence, reason="; ".join(f"{c.name}: {c.reason}" for c in untestable))
    verdicts = [c.verdict() for c in evidence]
    p_claim, p_against = max(c.p_claim for c in evidence), min(c.p_against for c in evidence)
    if CONTRADICTED in verdicts:
        return Judgement(CONTRADICTED, evidence, p_against)
    if all(v == REPRODUCED for v in verdicts):
        return Judgement(REPRODUCED, evidence, p_claim)
    return Judgement(INCONCLUSIVE, evidence, min(p_claim, p_against))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family's p-values, in their order: the i-th smallest times
    (m - i + 1), never below an earlier one's, at most 1. A verdict survives when its adjusted p-value
    is below ALPHA."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
