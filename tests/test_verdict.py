"""The one rule (benchmarks/verdict.py) on constructed data: Student's t at Welch's degrees of freedom
for every contrast, above zero for a claimed difference, inside a stated margin for a claimed absence."""

import math

import pytest

from benchmarks.spec import Finding, Margin, Table, difference
from benchmarks.verdict import (
    POSITIVE,
    RULE,
    ZERO,
    Comparison,
    Estimate,
    Within,
    contrast,
    incomplete_beta,
    judge,
    t_cdf,
    t_quantile,
)


# ---------------------------------------------------------------------------- Student's t, without scipy
@pytest.mark.parametrize("df, table", [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042),
                                       (1e6, 1.960), (math.inf, 1.960)])
def test_the_t_quantile_is_the_tables(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, abs=6e-4)


def test_the_t_distribution_agrees_with_closed_forms():
    for t in (-3.0, -0.5, 0.0, 0.7, 12.706):  # df = 1 is Cauchy's distribution
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    for t in (-2.0, 0.3, 4.303):  # df = 2: 1/2 + t / (2 sqrt(2 + t^2))
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert incomplete_beta(1, 1, 0.3) == pytest.approx(0.3)
    assert incomplete_beta(2, 3, 0.4) == pytest.approx(0.5248)  # sum_{j>=2} C(4, j) 0.4^j 0.6^(4-j)
    assert t_quantile(0.025, 4) == pytest.approx(-t_quantile(0.975, 4))
    assert t_quantile(0.975, 2.5) == pytest.approx(3.5747, abs=1e-3)  # Welch's degrees of freedom need not be whole
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_cdf(1.0, 0)


# ---------------------------------------------------------------------------- contrasts
def test_a_contrasts_degrees_of_freedom_are_welch_satterthwaites():
    equal = contrast({"a": [0.80, 0.82, 0.84], "b": [0.70, 0.72, 0.74]}, {"a": 1.0, "b": -1.0})
    assert equal.value == pytest.approx(0.10) and equal.df == pytest.approx(4.0)  # equal variances: n1 + n2 - 2
    assert equal.se == pytest.approx((2 * 0.02**2 / 3) ** 0.5)
    one_noisy = contrast({"a": [0.80, 0.82, 0.84], "b": [0.70, 0.70, 0.70]}, {"a": 1.0, "b": -1.0})
    assert one_noisy.df == pytest.approx(2.0)  # all the noise in a: its n - 1
    unequal = contrast({"a": [0.80, 0.90], "b": [0.70, 0.71, 0.72, 0.73, 0.74]}, {"a": 1.0, "b": -1.0})
    va, vb = 0.005 / 2, 0.00025 / 5
    assert unequal.df == pytest.approx((va + vb) ** 2 / (va**2 / 1 + vb**2 / 4))
    assert not contrast({"a": [0.8], "b": [0.7, 0.71]}, {"a": 1.0, "b": -1.0}).testable  # one seed: no SE


# ---------------------------------------------------------------------------- the verdicts
def two_cells(a: list[float], b: list[float]) -> Estimate:
    return contrast({"a": a, "b": b}, {"a": 1.0, "b": -1.0})


def test_a_tiny_significant_difference_inside_the_margin_is_no_difference():
    """More seeds can reproduce a claim of no difference: a difference that is real (its interval
    excludes zero) but well inside the margin is equivalent, where |d| <= 2 SE called it a difference."""
    a, b = [0.8700, 0.8702, 0.8704, 0.8701, 0.8703], [0.8730, 0.8732, 0.8734, 0.8731, 0.8733]
    d = two_cells(b, a)
    assert d.interval[0] > 0  # a significant difference of 0.3 points
    assert judge(POSITIVE, [Comparison("b - a", d)]).verdict == "reproduced"
    assert judge(ZERO, [Comparison("b - a", d, Within.absolute(d, 0.01))]).verdict == "reproduced"


def test_a_difference_with_wide_intervals_is_inconclusive():
    d = two_cells([0.86, 0.88, 0.84], [0.86, 0.85, 0.88])  # d = -0.003, the interval several points wide
    assert judge(ZERO, [Comparison("a - b", d, Within.absolute(d, 0.01))]).verdict == "inconclusive"
    # one inconclusive contrast makes the finding inconclusive, one beyond the margin makes it not reproduced
    tight = Estimate(0.001, 0.001, 10)
    far = Estimate(0.05, 0.002, 10)
    assert judge(ZERO, [Comparison("t", tight, Within.absolute(tight, 0.01)),
                        Comparison("d", d, Within.absolute(d, 0.01))]).verdict == "inconclusive"
    assert judge(ZERO, [Comparison("t", tight, Within.absolute(tight, 0.01)), Comparison("d", d, Within.absolute(d, 0.01)),
                        Comparison("f", far, Within.absolute(far, 0.01))]).verdict == "not reproduced"
    assert judge(ZERO, [Comparison("t", tight, Within.absolute(tight, 0.01))]).verdict == "reproduced"


def test_a_difference_wholly_beyond_the_margin_is_not_no_difference():
    d = two_cells([0.80, 0.801, 0.799], [0.85, 0.851, 0.849])
    assert judge(ZERO, [Comparison("a - b", d, Within.absolute(d, 0.01))]).verdict == "not reproduced"


def test_two_seeds_need_ts_quantile_not_two_standard_errors():
    """d = 0.03 with SE 0.01 and one degree of freedom: beyond 2 SE, but within t's 12.7 SE."""
    d = two_cells([0.80, 0.82], [0.78, 0.78])
    assert d.value == pytest.approx(0.03) and d.se == pytest.approx(0.01) and d.df == pytest.approx(1.0)
    assert abs(d.value) > 2 * d.se  # what the z-test counted
    assert d.quantile == pytest.approx(12.706, abs=1e-3)
    assert judge(POSITIVE, [Comparison("a - b", d)]).verdict == "not reproduced"
    assert judge(POSITIVE, [Comparison("a - b", Estimate(0.03, 0.01, math.inf))]).verdict == "reproduced"  # many seeds


def test_a_claimed_difference_needs_the_papers_sign_on_every_contrast():
    assert judge(POSITIVE, [Comparison("a - b", Estimate(-0.03, 0.005, 4))]).verdict == "not reproduced"
    assert judge(POSITIVE, [Comparison("x", Estimate(0.03, 0.005, 4)),
                            Comparison("y", Estimate(0.01, 0.005, 4))]).verdict == "not reproduced"  # y: 2 SE < t's 2.78
    assert judge(POSITIVE, [Comparison("x", Estimate(0.03, 0.005, 4))]).verdict == "reproduced"


def test_one_seed_is_not_testable_and_no_cells_not_compared():
    single = two_cells([0.9], [0.8])
    assert judge(POSITIVE, [Comparison("a - b", single)]).verdict == "not testable"
    assert judge(ZERO, [Comparison("a - b", single, Within.absolute(single, 0.01))]).verdict == "not testable"
    assert judge(ZERO, []).verdict == "not compared"
    with pytest.raises(ValueError, match="margin"):
        judge(ZERO, [Comparison("a - b", Estimate(0.0, 0.01, 4))])


# ---------------------------------------------------------------------------- margins in the specs
def records(cells: dict[str, list[float]]) -> list[dict]:
    return [{"label": label, "group": {}, "seed": i, "metrics": {"test_acc": v}}
            for label, values in cells.items() for i, v in enumerate(values)]


def test_a_relative_margin_is_a_fraction_of_another_contrast_with_its_own_noise():
    """"x and y barely differ" against a quarter of the gap y - none: the margin is 2.5 points here, the
    difference 0.3 with a tight interval: reproduced; with the gap itself noisy, inconclusive."""
    margin = Margin("a quarter of the gap to none", fraction=0.25,
                    reference=lambda t: ("y - none", difference("y", "none")) if "none" in t.by_label else None)
    finding = Finding("x and y barely differ", "-", ZERO, lambda t: [("x - y", difference("x", "y"))], margin=margin)
    steady = Table(records({"none": [0.70, 0.701, 0.699], "x": [0.803, 0.804, 0.802], "y": [0.80, 0.801, 0.799]}))
    judged = finding.judge(steady)
    assert judged.verdict == "reproduced" and judged.evidence[0].within.margin == pytest.approx(0.025)
    noisy = Table(records({"none": [0.60, 0.80, 0.70], "x": [0.803, 0.804, 0.802], "y": [0.80, 0.801, 0.799]}))
    assert finding.judge(noisy).verdict == "inconclusive"
    assert finding.judge(Table(records({"x": [0.8, 0.81], "y": [0.8, 0.8]}))).verdict == "not compared"  # no `none`


def test_a_claim_of_no_difference_states_its_margin_and_why():
    contrasts = lambda t: []  # noqa: E731
    with pytest.raises(ValueError, match="state its margin"):
        Finding("a and b barely differ", "-", ZERO, contrasts)
    with pytest.raises(ValueError, match="margin is for claims of no difference"):
        Finding("a beats b", "-", POSITIVE, contrasts, margin=Margin("why", points=0.01))
    with pytest.raises(ValueError, match="why"):
        Margin(" ", points=0.01)
    with pytest.raises(ValueError, match="either"):
        Margin("why", points=0.01, fraction=0.25, reference=lambda t: None)
    with pytest.raises(ValueError, match="fraction"):
        Margin("why", fraction=1.5, reference=lambda t: None)
    assert Margin("why", points=0.01).describe() == "±0.01 (absolute)"


def test_every_claim_of_no_difference_in_the_ablations_has_a_margin_from_the_paper():
    from benchmarks.ablations import ABLATIONS

    zero = [f for spec in ABLATIONS.values() for f in spec.findings if f.expect == ZERO]
    assert {f.claim for f in zero} == {"How position is encoded barely matters",
                                       "Both heads work equally well, each at its own learning rate"}
    for finding in zero:
        assert finding.margin is not None and ("Table" in finding.margin.why or "Figure" in finding.margin.why)


def test_the_rule_names_its_test():
    assert "Student" in RULE and "Welch-Satterthwaite" in RULE and "margin" in RULE and "inconclusive" in RULE
