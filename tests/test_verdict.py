"""The one rule (benchmarks/verdict.py) on constructed data: Student's t over paired seeds (Welch's
degrees of freedom for independent cells) for every contrast; three outcomes, on the claimed side, on the
other or neither, above zero for a claimed difference, inside a stated margin for a claimed absence; not
testable, with the reason, where seeds give no spread; Holm's correction across a table."""

import math

import pytest

from benchmarks.spec import Finding, Margin, Table, difference, metric_cell
from benchmarks.verdict import (
    ALPHA,
    POSITIVE,
    RULE,
    ZERO,
    Comparison,
    Estimate,
    Within,
    contrast,
    holm,
    incomplete_beta,
    judge,
    paired_contrast,
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
    one_noisy = contrast({"a": [0.80, 0.82, 0.84], "b": [0.70, 0.7001, 0.70]}, {"a": 1.0, "b": -1.0})
    assert one_noisy.df == pytest.approx(2.0, rel=1e-3)  # nearly all the noise in a: its n - 1
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
                        Comparison("f", far, Within.absolute(far, 0.01))]).verdict == "contradicted"
    assert judge(ZERO, [Comparison("t", tight, Within.absolute(tight, 0.01))]).verdict == "reproduced"


def test_a_difference_wholly_beyond_the_margin_contradicts_no_difference():
    d = two_cells([0.80, 0.801, 0.799], [0.85, 0.851, 0.849])
    assert judge(ZERO, [Comparison("a - b", d, Within.absolute(d, 0.01))]).verdict == "contradicted"


def test_two_seeds_need_ts_quantile_not_two_standard_errors():
    """d = 0.03 with SE 0.01 and one degree of freedom: beyond 2 SE, but within t's 12.7 SE."""
    d = two_cells([0.80, 0.82], [0.78, 0.7801])
    assert d.value == pytest.approx(0.03, abs=1e-4) and d.se == pytest.approx(0.01, rel=1e-3)
    assert d.df == pytest.approx(1.0, rel=1e-3)
    assert abs(d.value) > 2 * d.se  # what the z-test counted
    assert d.quantile == pytest.approx(12.706, abs=5e-3)
    assert judge(POSITIVE, [Comparison("a - b", d)]).verdict == "inconclusive"  # in the claimed direction, not shown
    assert judge(POSITIVE, [Comparison("a - b", Estimate(0.03, 0.01, math.inf))]).verdict == "reproduced"  # many seeds


def test_a_claimed_difference_needs_the_papers_sign_on_every_contrast():
    assert judge(POSITIVE, [Comparison("a - b", Estimate(-0.03, 0.005, 4))]).verdict == "contradicted"
    assert judge(POSITIVE, [Comparison("x", Estimate(0.03, 0.005, 4)),
                            Comparison("y", Estimate(0.01, 0.005, 4))]).verdict == "inconclusive"  # y: 2 SE < t's 2.78
    assert judge(POSITIVE, [Comparison("x", Estimate(0.03, 0.005, 4)),  # one wholly opposite contradicts the claim
                            Comparison("y", Estimate(-0.03, 0.005, 4))]).verdict == "contradicted"
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
    steady = Table(records({"none": [0.70, 0.701, 0.699], "x": [0.803, 0.805, 0.802], "y": [0.80, 0.801, 0.799]}))
    judged = finding.judge(steady)
    assert judged.verdict == "reproduced" and judged.evidence[0].within.margin == pytest.approx(0.025)
    noisy = Table(records({"none": [0.60, 0.80, 0.70], "x": [0.803, 0.805, 0.802], "y": [0.80, 0.801, 0.799]}))
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


# ---------------------------------------------------------------------------- three outcomes, honest intervals (issue 34)
def seeded(values: list[float]) -> dict[int, float]:
    return dict(enumerate(values))


def test_identical_seeds_are_not_testable_whatever_the_difference():
    """Three seeds at 0.7001 against three at 0.7000: no spread is no evidence of one; the verdict says why."""
    d = paired_contrast({"a": seeded([0.7001] * 3), "b": seeded([0.7000] * 3)}, {"a": 1.0, "b": -1.0})
    judged = judge(POSITIVE, [Comparison("a - b", d)])
    assert judged.verdict == "not testable" and "identical" in judged.reason and "'a'" in judged.reason
    assert judged.p is None
    independent = contrast({"a": [0.7001] * 3, "b": [0.70, 0.71, 0.69]}, {"a": 1.0, "b": -1.0})
    assert not independent.testable and "identical" in independent.untestable


def test_a_contrast_with_no_spread_over_its_seeds_is_not_testable():
    """Cells that vary with the seed but differ by the same amount in every seed (to the float's last bits)."""
    d = paired_contrast({"a": seeded([0.80, 0.81, 0.82]), "b": seeded([0.79, 0.80, 0.81])}, {"a": 1.0, "b": -1.0})
    assert not d.testable and "no spread" in d.untestable and d.value == pytest.approx(0.01)


def test_too_few_seeds_are_not_testable():
    for cells in ({"a": seeded([0.9]), "b": seeded([0.8])}, {"a": {0: 0.9, 1: 0.91}, "b": {1: 0.8}}):
        d = paired_contrast(cells, {"a": 1.0, "b": -1.0})
        assert not d.testable and "seed" in d.untestable
        assert judge(POSITIVE, [Comparison("a - b", d)]).verdict == "not testable"
    empty = paired_contrast({"a": {}, "b": seeded([0.8, 0.81])}, {"a": 1.0, "b": -1.0})
    assert not empty.testable and "'a' has no seed" in empty.untestable


def test_seeds_are_paired_where_cells_share_them():
    """The same seed draws the same data in every cell: a seed effect common to both cells cancels in the
    paired difference. The independent interval straddles zero; the paired one does not."""
    base = [0.80, 0.85, 0.90, 0.83]
    a, b = [x + 0.010 + e for x, e in zip(base, (0.001, -0.001, 0.002, 0.0))], base
    paired = paired_contrast({"a": seeded(a), "b": seeded(b)}, {"a": 1.0, "b": -1.0})
    diffs = [x - y for x, y in zip(a, b)]
    mean = sum(diffs) / 4
    assert paired.paired and paired.seeds == 4 and paired.df == 3
    assert paired.value == pytest.approx(mean)
    assert paired.se == pytest.approx((sum((x - mean) ** 2 for x in diffs) / 3 / 4) ** 0.5)
    assert paired.interval[0] > 0
    independent = contrast({"a": a, "b": b}, {"a": 1.0, "b": -1.0})
    assert not independent.paired and independent.interval[0] < 0 < independent.interval[1]
    # cells with no seed in common fall back to the independent interval
    apart = paired_contrast({"a": {0: a[0], 1: a[1]}, "b": {2: b[2], 3: b[3]}}, {"a": 1.0, "b": -1.0})
    assert not apart.paired and apart.df == pytest.approx(contrast({"a": a[:2], "b": b[2:]}, {"a": 1, "b": -1}).df)


def test_a_missing_metric_is_left_out_and_the_seeds_used_are_said():
    recs = records({"x": [0.80, 0.81, 0.83], "y": [0.78, 0.80, 0.79]})
    del recs[2]["metrics"]["test_acc"]  # x's seed 2 never measured it
    table = Table(recs)
    d = table.estimate(difference("x", "y"), "test_acc")
    assert d.seeds == 2 and d.paired and d.value == pytest.approx((0.80 - 0.78 + 0.81 - 0.80) / 2)
    assert "2 paired seeds" in d.describe()
    row = table.by_label["x"]
    assert row["seeds"] == 3 and row["test_acc_n"] == 2 and metric_cell(row, "test_acc").endswith("(2 of 3 seeds)")
    del recs[1]["metrics"]["test_acc"]
    one = Table(recs).by_label["x"]
    assert metric_cell(one, "test_acc") == "0.8000 (one seed) (1 of 3 seeds)" and "±" not in metric_cell(one, "test_acc")


def test_a_relative_margin_whose_reference_is_not_above_zero_is_no_margin():
    margin = Margin("a quarter of the gap to none (Table 8)", fraction=0.25,
                    reference=lambda t: ("y - none", difference("y", "none")))
    finding = Finding("x and y barely differ", "-", ZERO, lambda t: [("x - y", difference("x", "y"))], margin=margin)
    backwards = Table(records({"none": [0.82, 0.83, 0.825], "x": [0.803, 0.805, 0.802], "y": [0.80, 0.801, 0.799]}))
    judged = finding.judge(backwards)
    assert judged.verdict == "not testable" and "not above zero" in judged.reason


def test_an_effect_in_the_claimed_direction_straddling_zero_is_inconclusive_and_one_wholly_opposite_contradicts():
    straddles = paired_contrast({"a": seeded([0.81, 0.80, 0.84]), "b": seeded([0.80, 0.81, 0.82])}, {"a": 1, "b": -1})
    assert straddles.value > 0 and straddles.interval[0] < 0 < straddles.interval[1]
    judged = judge(POSITIVE, [Comparison("a - b", straddles)])
    assert judged.verdict == "inconclusive" and ALPHA <= judged.p
    opposite = paired_contrast({"a": seeded([0.70, 0.71, 0.72]), "b": seeded([0.80, 0.82, 0.81])}, {"a": 1, "b": -1})
    judged = judge(POSITIVE, [Comparison("a - b", opposite)])
    assert judged.verdict == "contradicted" and judged.p < ALPHA
    assert judged.p == pytest.approx(opposite.p_below)


def test_a_verdicts_p_value_is_below_the_level_exactly_when_the_verdict_is_decided():
    for value in (-0.05, -0.012, -0.005, 0.0, 0.004, 0.0125, 0.05):
        e = Estimate(value, 0.005, 3)
        for c in (Comparison("d", e), Comparison("d", e, Within.absolute(e, 0.02))):
            judged = judge(POSITIVE if c.within is None else ZERO, [c])
            assert (judged.p < ALPHA) == (judged.verdict != "inconclusive"), (value, c.within, judged)


def test_holms_step_down_adjustment():
    assert holm([0.01, 0.04, 0.002, 0.5]) == pytest.approx([0.03, 0.08, 0.008, 0.5])
    assert holm([0.02, 0.011]) == pytest.approx([0.022, 0.022])  # never below an earlier, smaller one's
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0]) and holm([]) == []


def test_a_tables_findings_carry_holm_regimes_notes_and_reasons(tmp_path):
    """Holm across the table's judged rows, the regime beside a verdict that is not reproduced (never
    beside a reproduced one), a note beside any, and why a finding cannot be tested at this scale."""
    from benchmarks.judged import format_findings

    pos = lambda name: lambda t: [(name, difference(*name.split(" - ")))]  # noqa: E731
    findings = (Finding("x beats y", "-", POSITIVE, pos("x - y"), regime="the paper's 300M images"),
                Finding("y beats x", "-", POSITIVE, pos("y - x"), regime="the paper's 300M images",
                        note=lambda t: "computed beside"),
                Finding("z beats y", "-", POSITIVE, pos("z - y")),
                Finding("x beats z", "-", POSITIVE, pos("x - z"), untestable=lambda t: "too coarse a grid here"))
    table = Table(records({"x": [0.85, 0.87, 0.86], "y": [0.80, 0.81, 0.79], "z": [0.80, 0.82, 0.83]}))
    text, verdicts = format_findings(findings, table, {})
    assert [v["verdict"] for v in verdicts] == ["reproduced", "contradicted", "inconclusive", "not testable"]
    assert [v["family"] for v in verdicts] == [3, 3, 3, None] and verdicts[3]["reason"] == "too coarse a grid here"
    assert holm([v["p"] for v in verdicts[:3]]) == pytest.approx([v["holm_p"] for v in verdicts[:3]])
    assert "regime" not in verdicts[0] and verdicts[1]["regime"] == "the paper's 300M images"
    assert verdicts[1]["note"] == "computed beside" and verdicts[0]["survives_holm"] is (verdicts[0]["holm_p"] < ALPHA)
    lines = text.splitlines()
    assert "Outside the paper's regime" not in lines[0] and "*Outside the paper's regime:* the paper's 300M" in lines[1]
    assert "Holm's correction across the table's 3 judged rows" in lines[0] and "Not testable: too coarse" in lines[3]
    assert "Multiplicity: 3 judged rows in this table, 2 decided" in text
