"""The one rule by which every finding of every ablation is judged.

A finding names contrasts: weighted sums of cell means, e.g. {learned_1d: +1, none: -1}. The same
seed draws the same data in every cell, so where cells share seeds a contrast is computed per seed
and judged as one sample (n - 1 degrees of freedom); otherwise as independent cells (Welch and
Satterthwaite). Each contrast gets its 95% interval d ± t SE, t Student's quantile. A claim is
reproduced when every interval lies on the claimed side (above zero, or inside its margin: two
one-sided tests), contradicted when one lies wholly on the other, inconclusive otherwise; not
testable, with the reason, where the seeds give no spread. `holm` adjusts a table's p-values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

LEVEL = 0.95  # two-sided confidence of every interval
ALPHA = (1.0 - LEVEL) / 2.0  # each side's: the one-sided level of every verdict
RULE = ("95% confidence intervals d ± t SE over seeds, paired by seed where the cells share "
        "seeds (the same seed draws the same subset and order in every cell; otherwise "
        "Welch-Satterthwaite), t Student's quantile at the contrast's degrees of freedom; a claim "
        "is reproduced when every interval lies wholly on the claimed side (above zero, or inside "
        "the finding's stated margin), contradicted when one lies wholly on the other (below "
        "zero, or wholly outside the margin), inconclusive otherwise; not testable, with the "
        "reason, for fewer than two seeds, identical seeds or a margin's reference not above "
        "zero; Holm's correction across each table's judged rows beside every verdict")

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
NOT_TESTABLE = "not testable"  # the seeds give no interval (the reason is stated)
NOT_COMPARED = "not compared"  # the finding's cells are not in the table
DECIDED = (REPRODUCED, CONTRADICTED)
JUDGED = (*DECIDED, INCONCLUSIVE)  # the rows of a table's Holm family


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The incomplete beta function's continued fraction (modified Lentz)."""
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
    raise ArithmeticError(f"the incomplete beta fraction did not converge (a={a}, b={b}, x={x})")


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                 + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # where the fraction converges fast; else by symmetry
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom (not only whole numbers)."""
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p >= 0.5, by bisection on `t_cdf`."""
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    while high - low > 1e-10 * max(1.0, high):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


@dataclass(frozen=True)
class Estimate:
    """A contrast with its standard error and degrees of freedom; `seeds` used (pairs when
    `paired`); `untestable` why it has no interval."""

    value: float
    se: float
    df: float = math.inf
    seeds: int | None = None
    paired: bool = False
    untestable: str = ""

    @property
    def testable(self) -> bool:
        finite = math.isfinite(self.se) and self.se > 0 and not math.isnan(self.df)
        return finite and not self.untestable

    @property
    def quantile(self) -> float:
        return t_quantile((1.0 + LEVEL) / 2.0, self.df)

    @property
    def interval(self) -> tuple[float, float]:
        half = self.quantile * self.se
        return self.value - half, self.value + half

    @property
    def p_above(self) -> float:  # one-sided p-values of "above zero" and "below zero"
        return 1.0 - t_cdf(self.value / self.se, self.df)

    @property
    def p_below(self) -> float:
        return t_cdf(self.value / self.se, self.df)

    def plus(self, constant: float, sign: float = 1.0) -> Estimate:
        """constant + sign * this contrast: the same standard error."""
        return Estimate(constant + sign * self.value, self.se, self.df, self.seeds, self.paired,
                        self.untestable)

    def describe(self) -> str:
        if not self.testable:
            return f"d = {self.value:+.4f} (not testable: {self.untestable or 'no standard error'})"
        seeds = "paired seeds" if self.paired else "seeds"
        used = "" if self.seeds is None else f", {self.seeds} {seeds}"
        low, high = self.interval
        return (f"d = {self.value:+.4f}, {LEVEL:.0%} CI [{low:+.4f}, {high:+.4f}] "
                f"(t = {self.quantile:.2f}, df {self.df:.1f}{used})")


def mean_and_variance(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean, unbiased variance (nan for one value) and count."""
    n = len(values)
    mean = sum(values) / n
    return mean, sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else float("nan"), n


def _no_spread(values: Sequence[float]) -> bool:  # equal to within float rounding
    return max(values) - min(values) <= 1e-9 * max(1.0, *(abs(v) for v in values))


def _why_no_spread(label: str, values: Sequence[float]) -> str:
    if len(values) < 2:
        return (f"'{label}' has {len(values)} seed{'s' * (len(values) != 1)} "
                "(a standard error needs two)")
    if _no_spread(values):
        return (f"the {len(values)} seeds of '{label}' are identical ({values[0]:.4f}): a repeated "
                "deterministic run or a rounded metric says nothing about the spread")
    return ""


def contrast(cells: Mapping[str, Sequence[float]], weights: Mapping[str, float]) -> Estimate:
    """sum_i w_i mean(cell_i) over independent seeds, Welch-Satterthwaite degrees of freedom."""
    value, parts, reasons = 0.0, [], []
    for label, weight in weights.items():
        mean, var, n = mean_and_variance(cells[label])
        value += weight * mean
        parts.append((weight**2 * var / n, n))
        reasons += [why] if (why := _why_no_spread(label, cells[label])) else []
    seeds = min(n for _, n in parts)
    if reasons:
        return Estimate(value, math.nan, math.nan, seeds, False, "; ".join(reasons))
    total = sum(v for v, _ in parts)
    df = total**2 / sum(v * v / (n - 1) for v, n in parts)
    return Estimate(value, math.sqrt(total), df, seeds)


def paired_contrast(cells: Mapping[str, Mapping[Any, float]],
                    weights: Mapping[str, float]) -> Estimate:
    """The contrast per seed over the seeds every cell has (`cells`: label -> {seed: value});
    as independent cells (`contrast`) where they share fewer than two."""
    means = {label: sum(cells[label].values()) / len(cells[label])
             for label in weights if cells[label]}
    value = (sum(w * means[label] for label, w in weights.items())
             if len(means) == len(weights) else math.nan)
    if empty := [label for label in weights if not cells[label]]:
        return Estimate(value, math.nan, math.nan, 0, False,
                        "; ".join(f"'{label}' has no seed with this metric" for label in empty))
    common = sorted(set.intersection(*(set(cells[label]) for label in weights)), key=str)
    if len(common) < 2 and all(len(cells[label]) >= 2 for label in weights):
        return contrast({label: list(cells[label].values()) for label in weights}, weights)
    if len(common) < 2:
        return Estimate(value, math.nan, math.nan, len(common), True,
                        f"{len(common)} seed{'s' * (len(common) != 1)} common to every cell "
                        "(a standard error needs two)")
    for label in weights:  # a cell that does not vary with the seed gives no spread to pair against
        if why := _why_no_spread(label, [cells[label][s] for s in common]):
            return Estimate(value, math.nan, math.nan, len(common), True, why)
    per_seed = [sum(w * cells[label][s] for label, w in weights.items()) for s in common]
    mean, var, n = mean_and_variance(per_seed)
    if _no_spread(per_seed):
        return Estimate(mean, math.nan, math.nan, n, True,
                        f"the contrast is {mean:+.4f} in each of its {n} seeds: "
                        "no spread to judge by")
    return Estimate(mean, math.sqrt(var / n), float(n - 1), n, True)


@dataclass(frozen=True)
class Comparison:
    """One contrast a finding names, and for a claim of no difference its margin M."""

    name: str
    estimate: Estimate
    margin: float | None = None

    @property
    def claims(self) -> tuple[Estimate, ...]:
        """What must lie above zero: d, or M - d and M + d (two one-sided tests: |d| < M)."""
        d, m = self.estimate, self.margin
        return (d,) if m is None else (d.plus(m, -1.0), d.plus(m))

    def describe(self) -> str:
        text = f"{self.name}: {self.estimate.describe()}"
        if self.margin is None or not self.estimate.testable:
            return text
        near = min(self.claims, key=lambda e: e.interval[0])
        low, high = near.interval
        return (f"{text}; margin ±{self.margin:.4f}, margin - |d| = {near.value:+.4f}, "
                f"CI [{low:+.4f}, {high:+.4f}]")


@dataclass(frozen=True)
class Judgement:
    """A finding's verdict, its evidence, the verdict's one-sided p-value, why not testable."""

    verdict: str
    evidence: list[Comparison]
    p: float | None = None
    reason: str = ""

    def describe(self) -> str:
        return "; ".join(c.describe() for c in self.evidence)


def judge(evidence: list[Comparison]) -> Judgement:
    """Reproduced when every interval lies above zero, contradicted when one lies wholly below,
    inconclusive otherwise."""
    if not evidence:
        return Judgement(NOT_COMPARED, evidence)
    if untestable := [c for c in evidence if not c.estimate.testable]:
        reason = "; ".join(f"{c.name}: {c.estimate.untestable or 'no standard error'}"
                           for c in untestable)
        return Judgement(NOT_TESTABLE, evidence, reason=reason)
    claims = [e for c in evidence for e in c.claims]
    p_claim, p_against = max(e.p_above for e in claims), min(e.p_below for e in claims)
    if any(e.interval[1] < 0 for e in claims):
        return Judgement(CONTRADICTED, evidence, p_against)
    if all(e.interval[0] > 0 for e in claims):
        return Judgement(REPRODUCED, evidence, p_claim)
    return Judgement(INCONCLUSIVE, evidence, min(p_claim, p_against))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: the i-th smallest times (m - i + 1), never below an earlier."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
