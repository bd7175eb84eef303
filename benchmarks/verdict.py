"""The one rule by which every finding of every ablation is judged.

A finding compares cells of a table (a cell: one configuration, trained with several seeds). The
comparison is a *contrast*: a weighted sum of cell means, e.g. "learned 1-D minus none" is
{+1: learned_1d, -1: none}, "ViT at the hybrid's compute" interpolates two ViT cells with weights t
and 1 - t, "the ResNet's lead shrinks with data" is (ResNet - ViT at 1k) - (ResNet - ViT at 60k).
Its standard error over seeds is SE = sqrt(sum_i v_i), v_i = w_i^2 s_i^2 / n_i, s_i the seeds' standard
deviation in cell i (the cells' seeds are independent runs), and its degrees of freedom are Welch and
Satterthwaite's, (sum_i v_i)^2 / sum_i (v_i^2 / (n_i - 1)): the cells' variances are not assumed equal.

**Every contrast gets its 95% confidence interval d ± t SE**, t Student's 0.975 quantile at those
degrees of freedom (12.7 with two seeds a cell, 4.3 at df = 2, 1.96 only for many seeds: 2 SE, a
z-test, would claim far more than 2-3 seeds can show). A finding that claims a difference is
reproduced when every interval it names lies above zero (the paper's sign), and not reproduced
otherwise. A finding that claims *no* difference states, before looking, a margin within which a
difference counts as none (in the metric's units, or a fraction of another contrast of the same
table); it is reproduced when every interval lies inside the margin (equivalence: two one-sided
tests, each at 2.5% since the interval is the 95% one), not reproduced when an interval lies wholly
outside it, and **inconclusive** when an interval straddles it. More seeds narrow the intervals, so
more evidence can reproduce a claim of no difference, not only refute it. A margin relative to
another contrast g is tested as the contrasts f*g - d and f*g + d (both above zero: |d| < f*g), so
that the reference's own noise, and the cells it shares with d, count.

With one seed per cell there is no standard error and the finding is not testable; a finding whose
cells a scale does not run (the main job runs two cells of Table 8) is not compared.

The t quantile is computed here (no scipy): bisection on Student's distribution function, written
with the regularized incomplete beta function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

LEVEL = 0.95  # two-sided confidence of every interval
RULE = ("95% confidence intervals d ± t SE over seeds, t Student's quantile at each contrast's Welch-Satterthwaite "
        "degrees of freedom; a claimed difference is reproduced when every interval lies above zero; a claim of "
        "no difference when every interval lies inside the finding's stated margin, not reproduced when one lies "
        "wholly outside it, inconclusive when one straddles it")

# what a finding claims of each of its contrasts
POSITIVE = "positive"  # the contrast is larger than zero
ZERO = "zero"  # no difference (within a margin)
NOT_COMPARED = "not compared"  # the finding's cells are not in the table
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not testable", NOT_COMPARED)


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
    """A contrast of cell means with its standard error over seeds and its Welch-Satterthwaite degrees
    of freedom (both nan when a cell has a single seed)."""

    value: float
    se: float
    df: float = math.inf

    @property
    def testable(self) -> bool:
        return math.isfinite(self.se) and not math.isnan(self.df)

    @property
    def quantile(self) -> float:
        """Student's t at (1 + LEVEL) / 2 for this contrast's degrees of freedom."""
        return t_quantile((1.0 + LEVEL) / 2.0, self.df)

    @property
    def interval(self) -> tuple[float, float]:
        """The LEVEL confidence interval of the contrast."""
        half = self.quantile * self.se
        return self.value - half, self.value + half

    def describe(self) -> str:
        if not self.testable:
            return f"d = {self.value:+.4f} (one seed: no standard error)"
        low, high = self.interval
        return f"d = {self.value:+.4f}, {LEVEL:.0%} CI [{low:+.4f}, {high:+.4f}] (t = {self.quantile:.2f}, df {self.df:.1f})"


def mean_and_variance(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, unbiased variance (nan for one value) and count."""
    n = len(values)
    if n == 0:
        raise ValueError("a cell without results cannot be compared")
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan")
    return mean, variance, n


def contrast(cells: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> Estimate:
    """sum_i w_i * mean(cell_i), with its standard error over the seeds of each cell and its
    Welch-Satterthwaite degrees of freedom."""
    value, parts = 0.0, []
    for label, weight in weights.items():
        mean, var, n = mean_and_variance(cells[label])
        value += weight * mean
        parts.append((weight**2 * var / n, n))
    if any(math.isnan(v) for v, _ in parts):
        return Estimate(value, float("nan"), float("nan"))
    total = sum(v for v, _ in parts)
    spread = sum(v * v / (n - 1) for v, n in parts)
    # no spread in any cell: the interval is a point whatever t is; the pooled count keeps df finite
    df = total**2 / spread if spread > 0 else float(sum(n - 1 for _, n in parts)) or math.inf
    return Estimate(value, math.sqrt(total), df)


@dataclass(frozen=True)
class Within:
    """A difference d against its margin M: the contrasts M - d and M + d, both above zero when
    |d| < M. An absolute margin is a constant (`absolute`); a relative one, a fraction of another
    contrast, is estimated with its own standard error (`benchmarks.spec.Margin`)."""

    margin: float  # M's value (its point estimate when relative)
    below: Estimate  # M - d
    above: Estimate  # M + d

    @classmethod
    def absolute(cls, d: Estimate, margin: float) -> Within:
        if not margin > 0:
            raise ValueError(f"a margin of no difference must be above zero, got {margin}")
        return cls(margin, Estimate(margin - d.value, d.se, d.df), Estimate(margin + d.value, d.se, d.df))

    @property
    def testable(self) -> bool:
        return self.below.testable and self.above.testable

    def verdict(self) -> str:
        if min(self.below.interval[0], self.above.interval[0]) > 0:
            return "reproduced"  # the whole interval inside the margin
        if min(self.below.interval[1], self.above.interval[1]) < 0:
            return "not reproduced"  # the whole interval beyond one side of the margin
        return "inconclusive"

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

    def describe(self) -> str:
        text = f"{self.name}: {self.estimate.describe()}"
        return text + (f"; {self.within.describe()}" if self.within is not None and self.testable else "")


@dataclass(frozen=True)
class Judgement:
    """The verdict on one finding, with the numbers behind it."""

    verdict: str  # one of VERDICTS
    evidence: list[Comparison]

    @property
    def reproduced(self) -> bool:
        return self.verdict == "reproduced"

    def describe(self) -> str:
        return "; ".join(c.describe() for c in self.evidence)


def judge(expect: str, evidence: list[Comparison]) -> Judgement:
    """Apply the rule to every contrast a finding names."""
    if expect not in (POSITIVE, ZERO):
        raise ValueError(f"a finding expects {POSITIVE!r} or {ZERO!r}, not {expect!r}")
    if not evidence:
        return Judgement(NOT_COMPARED, evidence)
    if not all(c.testable for c in evidence):
        return Judgement("not testable", evidence)
    if expect == POSITIVE:
        ok = all(c.estimate.interval[0] > 0 for c in evidence)
        return Judgement("reproduced" if ok else "not reproduced", evidence)
    missing = [c.name for c in evidence if c.within is None]
    if missing:
        raise ValueError(f"a claim of no difference is judged against a margin; none given for {missing}")
    verdicts = {c.within.verdict() for c in evidence}
    verdict = next(v for v in ("not reproduced", "inconclusive", "reproduced") if v in verdicts)
    return Judgement(verdict, evidence)
