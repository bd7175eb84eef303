"""The one rule (benchmarks/verdict.py) on constructed data: Student's t over paired seeds (Welch's
degrees of freedom for independent cells); reproduced, contradicted or inconclusive, against zero
or a stated margin; not testable, with the reason, where seeds give no spread; Holm's correction."""

import math

import pytest

from benchmarks.spec import Finding, Table, difference, format_findings, metric_cell
from benchmarks.verdict import (ALPHA, Comparison, Estimate, contrast, holm, incomplete_beta, judge,
                                paired_contrast, t_cdf, t_quantile)


def test_the_t_distribution_agrees_with_its_printed_tables_and_closed_forms():
    for df, table in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042),
                      (1e6, 1.960), (math.inf, 1.960)):
        assert t_quantile(0.975, df) == pytest.approx(table, abs=6e-4), df
    for t in (-3.0, -0.5, 0.0, 0.7, 12.706):  # df = 1 is Cauchy's distribution
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    for t in (-2.0, 0.3, 4.303):
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert incomplete_beta(2, 3, 0.4) == pytest.approx(0.5248)  # sum_{j>=2} C(4,j) .4^j .6^(4-j)
    assert t_quantile(0.975, 2.5) == pytest.approx(3.5747, abs=1e-3)  # Welch's df need not be whole


def two_cells(a: list[float], b: list[float]) -> Estimate:
    return contrast({"a": a, "b": b}, {"a": 1.0, "b": -1.0})


def test_independent_cells_get_welch_satterthwaites_degrees_of_freedom():
    equal = two_cells([0.80, 0.82, 0.84], [0.70, 0.72, 0.74])
    assert equal.value == pytest.approx(0.10) and equal.df == pytest.approx(4.0)  # n1 + n2 - 2
    assert equal.se == pytest.approx((2 * 0.02**2 / 3) ** 0.5)
    unequal = two_cells([0.80, 0.90], [0.70, 0.71, 0.72, 0.73, 0.74])
    va, vb = 0.005 / 2, 0.00025 / 5
    assert unequal.df == pytest.approx((va + vb) ** 2 / (va**2 / 1 + vb**2 / 4))


def verdict(margin: float | None, *estimates: Estimate) -> str:
    return judge([Comparison(str(i), e, margin) for i, e in enumerate(estimates)]).verdict


def test_a_claim_of_no_difference_is_judged_by_its_intervals_against_the_margin():
    a, b = [0.8700, 0.8702, 0.8704, 0.8701, 0.8703], [0.8730, 0.8732, 0.8734, 0.8731, 0.8733]
    d = two_cells(b, a)  # a real difference of 0.3 points, well inside a margin of 1
    assert d.interval[0] > 0 and verdict(None, d) == verdict(0.01, d) == "reproduced"
    wide = two_cells([0.86, 0.88, 0.84], [0.86, 0.85, 0.88])
    far = two_cells([0.80, 0.801, 0.799], [0.85, 0.851, 0.849])
    assert verdict(0.01, wide) == verdict(0.01, d, wide) == "inconclusive"
    assert verdict(0.01, far) == verdict(0.01, d, wide, far) == "contradicted"


def test_a_claimed_difference_needs_every_interval_above_zero_at_ts_quantile():
    d = two_cells([0.80, 0.82], [0.78, 0.7801])  # d = 0.03, SE 0.01, one degree of freedom
    assert d.df == pytest.approx(1.0, rel=1e-3) and d.quantile == pytest.approx(12.706, abs=5e-3)
    assert abs(d.value) > 2 * d.se and verdict(None, d) == "inconclusive"
    up, weak, down = Estimate(0.03, 0.005, 4), Estimate(0.01, 0.005, 4), Estimate(-0.03, 0.005, 4)
    assert verdict(None, up) == "reproduced" and verdict(None, down) == "contradicted"
    assert verdict(None, up, weak) == "inconclusive"  # 2 SE is under t's 2.78 SE
    assert verdict(None, up, down) == "contradicted"  # one wholly opposite contradicts the claim


def test_too_few_identical_or_constant_seeds_are_not_testable_and_say_why():
    seeded = lambda values: dict(enumerate(values))  # noqa: E731
    for why, cells in {"1 seed": ({"a": seeded([0.9]), "b": seeded([0.8])}),
                       "1 seed common": ({"a": {0: 0.9, 1: 0.91}, "b": {1: 0.8}}),
                       "'a' has no seed": ({"a": {}, "b": seeded([0.8, 0.81])}),
                       "identical": ({"a": seeded([0.7001] * 3), "b": seeded([0.70, 0.71, 0.69])}),
                       "no spread": ({"a": seeded([0.8, 0.81, 0.82]), "b": seeded([0.79, .8, .81])})
                       }.items():
        judged = judge([Comparison("a - b", paired_contrast(cells, {"a": 1.0, "b": -1.0}))])
        assert judged.verdict == "not testable" and why in judged.reason and judged.p is None, why
    assert verdict(0.01) == "not compared"


def test_seeds_are_paired_where_cells_share_them():
    """A seed effect common to both cells cancels in the paired difference."""
    b = [0.80, 0.85, 0.90, 0.83]
    a = [x + 0.010 + e for x, e in zip(b, (0.001, -0.001, 0.002, 0.0))]
    paired = paired_contrast({"a": dict(enumerate(a)), "b": dict(enumerate(b))}, {"a": 1, "b": -1})
    diffs = [x - y for x, y in zip(a, b)]
    mean = sum(diffs) / 4
    assert paired.paired and paired.seeds == 4 and paired.df == 3
    assert paired.value == pytest.approx(mean)
    assert paired.se == pytest.approx((sum((x - mean) ** 2 for x in diffs) / 3 / 4) ** 0.5)
    independent = two_cells(a, b)
    assert paired.interval[0] > 0 and independent.interval[0] < 0 < independent.interval[1]
    apart = paired_contrast({"a": {0: a[0], 1: a[1]}, "b": {2: b[2], 3: b[3]}}, {"a": 1, "b": -1})
    assert not apart.paired and apart.df == pytest.approx(two_cells(a[:2], b[2:]).df)


def records(cells: dict[str, list[float]]) -> list[dict]:
    return [{"label": label, "group": {}, "seed": i, "metrics": {"test_acc": v}}
            for label, values in cells.items() for i, v in enumerate(values)]


def test_a_missing_metric_is_left_out_and_the_seeds_used_are_said():
    recs = records({"x": [0.80, 0.81, 0.83], "y": [0.78, 0.80, 0.79]})
    del recs[2]["metrics"]["test_acc"]  # x's seed 2 never measured it
    table = Table(recs)
    d = table.estimate(difference("x", "y"), "test_acc")
    assert d.seeds == 2 and d.value == pytest.approx((0.80 - 0.78 + 0.81 - 0.80) / 2)
    assert "2 paired seeds" in d.describe()
    assert metric_cell(table.by_label["x"], "test_acc").endswith("(2 of 3 seeds)")
    del recs[1]["metrics"]["test_acc"]
    assert metric_cell(Table(recs).by_label["x"], "test_acc") == "0.8000 (one seed) (1 of 3 seeds)"


def test_a_verdicts_p_value_is_below_the_level_exactly_when_the_verdict_is_decided():
    for value in (-0.05, -0.012, -0.005, 0.0, 0.004, 0.0125, 0.05):
        for margin in (None, 0.02):
            judged = judge([Comparison("d", Estimate(value, 0.005, 3), margin)])
            assert (judged.p < ALPHA) == (judged.verdict != "inconclusive"), (value, margin)


def test_holms_step_down_adjustment():
    assert holm([0.01, 0.04, 0.002, 0.5]) == pytest.approx([0.03, 0.08, 0.008, 0.5])
    assert holm([0.02, 0.011]) == pytest.approx([0.022, 0.022])  # never below an earlier one's
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])


def test_a_tables_findings_carry_holm_regimes_notes_margins_and_reasons():
    pos = lambda name: lambda t: [(name, difference(*name.split(" - ")))]  # noqa: E731
    findings = (Finding("x beats y", "-", pos("x - y"), regime="300M images"),
                Finding("y beats x", "-", pos("y - x"), regime="300M images",
                        note=lambda t: "computed beside"),
                Finding("z beats y", "-", pos("z - y")),
                Finding("x beats z", "-", pos("x - z"), untestable=lambda t: "coarse"),
                Finding("x is z", "-", pos("x - z"), margin=(0.05, "a judgement")))
    table = Table(records({"x": [0.85, 0.87, 0.86], "y": [0.80, 0.81, 0.79],
                           "z": [0.80, 0.82, 0.83]}))
    text, verdicts = format_findings(findings, table)
    assert [v["verdict"] for v in verdicts] == ["reproduced", "contradicted", "inconclusive",
                                                "not testable", "inconclusive"]
    assert [v["family"] for v in verdicts] == [4, 4, 4, None, 4]
    assert verdicts[3]["reason"] == "coarse"
    judged = [v for v in verdicts if v["family"]]
    assert holm([v["p"] for v in judged]) == pytest.approx([v["holm_p"] for v in judged])
    assert "regime" not in verdicts[0] and verdicts[1]["regime"] == "300M images"
    assert verdicts[1]["note"] == "computed beside"
    assert verdicts[4]["margin"]["stated"] == "±0.05 (absolute)"
    assert verdicts[4]["evidence"][0]["within"]["margin"] == 0.05
    lines = text.splitlines()
    assert "regime" not in lines[0] and "*Outside the paper's regime:* 300M" in lines[1]
    assert "Holm's correction across the table's 4 judged rows" in lines[0]
    assert "Not testable: coarse" in lines[3] and "margin ±0.05 (absolute)" in lines[4]
    assert "Multiplicity: 4 judged rows in this table, 2 decided" in text
    assert "*x is z*: a judgement" in text
