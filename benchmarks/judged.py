"""A table's findings judged and written down: each verdict of the one rule (`benchmarks.verdict`) with
the numbers behind it, Holm's correction across the table's judged rows beside it, the reason of a
finding that is not testable, the regime the paper's claim needs beside a verdict that is not
"reproduced", and the machine-readable form (findings.json)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

from benchmarks.verdict import ALPHA, CONTRADICTED, JUDGED, NOT_COMPARED, REPRODUCED, Comparison, Estimate, holm

if TYPE_CHECKING:
    from benchmarks.spec import Finding, Table


def numbers(e: Estimate) -> dict:
    """An estimate as JSON (which has no nan): d, its standard error, degrees of freedom and interval,
    the seeds it used, whether paired, and why it is not testable where it is not."""
    finite = lambda x: x if math.isfinite(x) else None  # noqa: E731
    low, high = e.interval if e.testable else (math.nan, math.nan)
    out = {"d": finite(e.value), "se": finite(e.se), "df": finite(e.df), "low": finite(low), "high": finite(high),
           "seeds": e.seeds, "paired": e.paired}
    return out | ({"untestable": e.untestable} if e.untestable else {})


def evidence(c: Comparison) -> dict:
    out = {"compared": c.name, **numbers(c.estimate)}
    if c.within is not None:
        out["within"] = {"margin": c.within.margin, "margin - d": numbers(c.within.below),
                         "margin + d": numbers(c.within.above)} | (
            {"untestable": c.within.untestable} if c.within.untestable else {})
    return out


def holm_text(verdict: str, adjusted: float | None, family: int) -> str:
    """Beside a verdict: whether it survives Holm's correction across the table's judged rows."""
    if adjusted is None:
        return ""
    if verdict not in (REPRODUCED, CONTRADICTED):
        return f"Holm-adjusted p {adjusted:.3g}, {family} judged rows; "
    kept = "survives" if adjusted < ALPHA else "does not survive"
    return f"{kept} Holm's correction across the table's {family} judged rows, adjusted p {adjusted:.3g}; "


def format_findings(findings: Sequence[Finding], table: Table, metric_names: Mapping[str, str]) -> tuple[str, list[dict]]:
    """The verdict lines (markdown) and their machine-readable form. Findings whose cells the table
    lacks are named in one line after the others, not judged; the margins of claims of no difference
    are stated with why, once each. The table's judged rows (reproduced, contradicted, inconclusive) are
    one family for Holm's correction."""
    judgements = [finding.judge(table) for finding in findings]
    family = [i for i, j in enumerate(judgements) if j.verdict in JUDGED]
    adjusted = dict(zip(family, holm([judgements[i].p for i in family])))
    lines, verdicts, absent, margins = [], [], [], {}
    for i, (finding, judgement) in enumerate(zip(findings, judgements)):
        note = finding.note(table) if finding.note is not None and judgement.verdict != NOT_COMPARED else ""
        regime = finding.regime if judgement.verdict not in (REPRODUCED, NOT_COMPARED) else ""
        verdict = {"claim": finding.claim, "verdict": judgement.verdict, "metric": finding.metric,
                   "evidence": [evidence(c) for c in judgement.evidence], "p": judgement.p,
                   "holm_p": adjusted.get(i), "family": len(family) if i in adjusted else None,
                   "survives_holm": (judgement.verdict in (REPRODUCED, CONTRADICTED) and adjusted[i] < ALPHA)
                   if i in adjusted else None}
        verdict |= {key: value for key, value in (("reason", judgement.reason), ("regime", regime), ("note", note)) if value}
        if finding.margin is not None:
            margin = finding.margin
            verdict["margin"] = {"kind": "absolute" if margin.points is not None else "relative", "points": margin.points,
                                 "fraction": margin.fraction, "stated": margin.describe(table), "why": margin.why}
        verdicts.append(verdict)
        if judgement.verdict == NOT_COMPARED:
            absent += [finding.claim] if finding.claim not in absent else []
            continue
        stated = f"; margin {finding.margin.describe(table)}" if finding.margin is not None else ""
        if finding.margin is not None:
            margins.setdefault(finding.claim, finding.margin.why)
        why = f" Not testable: {judgement.reason}." if judgement.reason else ""
        outside = f" *Outside the paper's regime:* {regime}." if regime else ""
        noted = f" *Note:* {note}." if note else ""
        lines.append(f"- *{finding.claim}* (paper: {finding.paper}{stated}): **{judgement.verdict}** "
                     f"({holm_text(judgement.verdict, adjusted.get(i), len(family))}"
                     f"{metric_names.get(finding.metric, finding.metric)}; {judgement.describe()}).{why}{outside}{noted}")
    if family:
        decided = [i for i in family if judgements[i].verdict in (REPRODUCED, CONTRADICTED)]
        kept = sum(adjusted[i] < ALPHA for i in decided)
        lines.append(f"\nMultiplicity: {len(family)} judged rows in this table, {len(decided)} decided (reproduced or "
                     f"contradicted) at {ALPHA:.1%} a side each; {kept} of them {'survives' if kept == 1 else 'survive'} Holm's "
                     f"correction across the "
                     f"{len(family)} (family-wise error {ALPHA:.1%} a side).")
    if margins:
        lines.append("\nMargins of the claims of no difference, fixed in the specs (a judgement, with its reasons): "
                     + " ".join(f"*{claim}*: {why}" for claim, why in margins.items()))
    if absent:
        lines.append("\nNot compared (their cells are not run at this scale): " + "; ".join(f"*{c}*" for c in absent) + ".")
    return "\n".join(lines), verdicts
