"""An ablation as a declarative spec, and its report.

A spec (`Ablation`) says its cells at each scale (what differs from the scale's base model and
training), the paper's number per cell, its findings as contrasts of cells, its table columns and
figure. `Ablation.runs` expands the cells into runs (cell x seed); `report` writes the table beside
the paper's numbers, the figure, and every finding judged by the rule of `benchmarks.verdict`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks.suite import Run, markdown_image, markdown_table
from benchmarks.verdict import (ALPHA, DECIDED, JUDGED, NOT_COMPARED, NOT_TESTABLE, REPRODUCED,
                                RULE, Comparison, Estimate, Judgement, holm, judge,
                                mean_and_variance, paired_contrast)

METRICS = {"test_acc": "test accuracy", "fewshot_5": "5-shot linear",
           # the transfer benchmark's, on classes never seen in pre-training
           "transfer_fewshot_5": "downstream 5-shot linear",
           "transfer_finetune": "downstream fine-tuned"}


@dataclass(frozen=True)
class Scale:
    """The base every cell varies: a model (ViTConfig options), its training (TrainConfig options),
    seeds per cell, and the minutes an ablation (and the suite) may take on its machine."""

    name: str
    model: dict[str, Any]
    train: dict[str, Any]
    seeds: int
    budget_min: float | None = None
    suite_budget_min: float | None = None
    zoo_name: str = "vit_ti16"  # the named model the options apply to
    cells_of: str | None = None  # take another scale's cells ("paper": the paper's models)
    # (zoo name, options) -> options: the rehearsal shrinks every model, keeping what differs
    shrink: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    processes_per_run: int = 1  # data-parallel processes of a run on the CPU

    @property
    def cells(self) -> str:
        return self.cells_of or self.name


@dataclass(frozen=True)
class Cell:
    """One configuration: its label, its coordinates (the table's columns), what it changes."""

    label: str
    coords: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # model options over the scale's
    train: dict[str, Any] = field(default_factory=dict)  # training options over the scale's
    model: str | None = None  # a zoo name other than the scale's
    inherit: bool = True  # False: the zoo model as named, `options` and `train` alone
    seeds: int | None = None  # at least this many seeds, where a contrast needs them
    more: dict[str, Any] = field(default_factory=dict)  # more of the run's config


Contrasts = list[tuple[str, dict[str, float]]]  # (name, weight per cell label)


@dataclass(frozen=True)
class Finding:
    """A claim of the paper, tested as contrasts of cells: above zero, or with a `margin` (points,
    why) none; `regime`: printed beside a verdict that is not "reproduced"; `note(table)`: beside
    any; `untestable(table)`: why this scale's table cannot show the claim ('' where it can)."""

    claim: str
    paper: str
    contrasts: Callable[[Table], Contrasts]
    metric: str = "test_acc"
    margin: tuple[float, str] | None = None
    regime: str = ""
    note: Callable[[Table], str] | None = None
    untestable: Callable[[Table], str] | None = None

    def judge(self, table: Table) -> Judgement:
        points = self.margin[0] if self.margin else None
        evidence = [Comparison(name, table.estimate(weights, self.metric), points)
                    for name, weights in self.contrasts(table)]
        reason = self.untestable(table) if self.untestable else ""
        return Judgement(NOT_TESTABLE, evidence, reason=reason) if reason else judge(evidence)


@dataclass(frozen=True)
class Ablation:
    name: str
    title: str
    cells: Callable[[Scale], list[Cell]]
    findings: tuple[Finding, ...] = ()
    paper: dict[str, float] = field(default_factory=dict)  # cell label -> the paper's number
    paper_caption: str = ""
    columns: tuple[tuple[str, str], ...] = ()  # (row key, title) before the metrics
    figure: Callable[[list[dict], list[dict], Path], list[str]] | None = None  # -> file names
    seeds: int | None = None  # default: the scale's
    measure: Callable[..., dict] | None = None  # default: benchmarks.training.measure
    # its own report (no table of cells): the body, or the body and the verdicts
    report: Callable[[list[dict], Path], str | tuple[str, list[dict]]] | None = None
    parallel: bool = True  # False: it times things and must have the machine to itself
    trains: bool = True  # False: nothing trained, its runs' keys name no threads
    notes: str = ""  # printed under the table

    def runs(self, scale: Scale) -> list[Run]:
        """Every cell, once per seed: the only place a run's config is built."""
        runs = []
        for cell in self.cells(scale):
            model = cell.model or scale.zoo_name
            options = {**scale.model, **cell.options} if cell.inherit else dict(cell.options)
            train = {**scale.train, **cell.train} if cell.inherit else dict(cell.train)
            if scale.shrink is not None:
                options = scale.shrink(model, options)
            config = {"model": model, "options": options, "train": train, **cell.more}
            seeds = max(self.seeds or scale.seeds, cell.seeds or 0)
            runs += [Run(self.name, cell.label, config, seed, dict(cell.coords))
                     for seed in range(seeds)]
        return runs


class Table:
    """The measured cells: per label, its records, and a summary row (coordinates, each metric's
    mean, standard deviation and count over the seeds that measured it, FLOPs, parameters)."""

    def __init__(self, records: list[dict]) -> None:
        self.records: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            self.records[r["label"]].append(r)
        self.rows = [self._row(label, runs) for label, runs in self.records.items()]
        self.by_label = {row["label"]: row for row in self.rows}

    @staticmethod
    def _row(label: str, runs: list[dict]) -> dict:
        row = {"label": label, "seeds": len(runs), **runs[0]["group"]}
        numeric = {k for r in runs for k, v in r["metrics"].items() if isinstance(v, (int, float))}
        for metric in numeric:
            values = [r["metrics"][metric] for r in runs if r["metrics"].get(metric) is not None]
            mean, variance, n = mean_and_variance(values)
            std = variance**0.5 if n > 1 else 0.0  # one seed: no error bar
            row[metric], row[metric + "_std"], row[metric + "_n"] = mean, std, n
        if all("flops" in r for r in runs):
            row["flops"] = sum(r["flops"] for r in runs) / len(runs)
            row["compute"] = f"{row['flops'] / 1e12:.2f} TFLOP"
        if "params" in runs[0]:
            row["params"] = runs[0]["params"]
            row["params_k"] = f"{row['params'] / 1e3:.0f}k"
        return row

    def where(self, **coords: Any) -> list[dict]:
        return [row for row in self.rows if all(row.get(k) == v for k, v in coords.items())]

    def estimate(self, weights: dict[str, float], metric: str) -> Estimate:
        seeds = {label: {r["seed"]: r["metrics"][metric] for r in self.records[label]
                         if r["metrics"].get(metric) is not None} for label in weights}
        return paired_contrast(seeds, weights)


def combine(*terms: tuple[float, dict[str, float]]) -> dict[str, float]:
    """sum_k c_k * weights_k, merged per label (a contrast of contrasts)."""
    out: dict[str, float] = defaultdict(float)
    for c, weights in terms:
        for label, w in weights.items():
            out[label] += c * w
    return {label: w for label, w in out.items() if w != 0.0}


def difference(a: str, b: str) -> dict[str, float]:
    return {a: 1.0, b: -1.0}


def metric_cell(row: dict, metric: str) -> str:
    """mean ± standard deviation over the seeds that measured it."""
    if metric not in row:
        return "n/a"
    n = row.get(metric + "_n", row["seeds"])
    used = f" ({n} of {row['seeds']} seeds)" if n < row["seeds"] else ""
    if n < 2:
        return f"{row[metric]:.4f} (one seed{'' if used else ', no spread'}){used}"
    return f"{row[metric]:.4f} ± {row[metric + '_std']:.4f}{used}"


def report(spec: Ablation, records: list[dict], out: Path) -> tuple[str, list[dict]]:
    """The table beside the paper's numbers, the figure, and every finding judged."""
    table = Table(records)
    metrics = [m for m in METRICS if any(m in row for row in table.rows)]
    header = [title for _, title in spec.columns] + ["seeds"] + [METRICS[m] for m in metrics]
    header += [f"paper ({spec.paper_caption})"] if spec.paper else []
    lines = []
    for row in table.rows:
        values = [row.get(key, "") for key, _ in spec.columns]
        lines.append([f"{v:.4g}" if isinstance(v, float) else v for v in values] + [row["seeds"]]
                     + [metric_cell(row, m) for m in metrics]
                     + ([spec.paper.get(row["label"], "n/a")] if spec.paper else []))
    body = markdown_table(header, lines) + (f"\n\n{spec.notes}" if spec.notes else "")
    if spec.figure is not None:
        body += "\n\n" + "\n\n".join(map(markdown_image, spec.figure(table.rows, records, out)))
    findings, verdicts = format_findings(spec.findings, table)
    if findings:
        body += (f"\n\nFindings, each judged by one rule ({RULE}; mean ± standard deviation over "
                 f"seeds above):\n\n{findings}")
    return body, verdicts


def numbers(e: Estimate) -> dict:
    """An estimate as JSON (no nan)."""
    finite = lambda x: x if math.isfinite(x) else None  # noqa: E731
    low, high = e.interval if e.testable else (math.nan, math.nan)
    return ({"d": finite(e.value), "se": finite(e.se), "df": finite(e.df), "low": finite(low),
             "high": finite(high), "seeds": e.seeds, "paired": e.paired}
            | ({"untestable": e.untestable} if e.untestable else {}))


def evidence(c: Comparison) -> dict:
    out = {"compared": c.name, **numbers(c.estimate)}
    if c.margin is not None:
        below, above = c.claims
        out["within"] = {"margin": c.margin, "margin - d": numbers(below),
                         "margin + d": numbers(above)}
    return out


# what a verdict says beside its numbers: its key in findings.json, its words in the README
SAID = (("reason", "Not testable:"), ("regime", "*Outside the paper's regime:*"),
        ("note", "*Note:*"))


def format_findings(findings: tuple[Finding, ...], table: Table) -> tuple[str, list[dict]]:
    """The verdict lines (markdown) and findings.json's form. The table's judged rows are one family
    for Holm's correction; findings whose cells the table lacks are named in one line."""
    judgements = [finding.judge(table) for finding in findings]
    family = [i for i, j in enumerate(judgements) if j.verdict in JUDGED]
    adjusted = dict(zip(family, holm([judgements[i].p for i in family])))
    lines, verdicts, absent, margins = [], [], [], {}
    for i, (finding, judged) in enumerate(zip(findings, judgements)):
        verdict, holm_p = judged.verdict, adjusted.get(i)
        said = {"reason": judged.reason,
                "regime": finding.regime if verdict not in (REPRODUCED, NOT_COMPARED) else "",
                "note": finding.note(table) if finding.note and verdict != NOT_COMPARED else ""}
        verdicts.append({"claim": finding.claim, "verdict": verdict, "metric": finding.metric,
                         "evidence": [evidence(c) for c in judged.evidence], "p": judged.p,
                         "holm_p": holm_p, "family": len(family) if i in adjusted else None,
                         "survives_holm": (verdict in DECIDED and holm_p < ALPHA)
                         if i in adjusted else None} | {k: v for k, v in said.items() if v})
        paper = finding.paper
        if finding.margin is not None:
            points, why = finding.margin
            stated = f"±{points:g} (absolute)"
            verdicts[-1]["margin"] = {"kind": "absolute", "points": points, "fraction": None,
                                      "stated": stated, "why": why}
            paper += f"; margin {stated}"
            if verdict != NOT_COMPARED:
                margins.setdefault(finding.claim, why)
        if verdict == NOT_COMPARED:
            absent += [finding.claim] if finding.claim not in absent else []
            continue
        if holm_p is None:
            holm_text = ""
        elif verdict in DECIDED:
            kept = "survives" if holm_p < ALPHA else "does not survive"
            holm_text = (f"{kept} Holm's correction across the table's {len(family)} judged "
                         f"rows, adjusted p {holm_p:.3g}; ")
        else:
            holm_text = f"Holm-adjusted p {holm_p:.3g}, {len(family)} judged rows; "
        lines.append(f"- *{finding.claim}* (paper: {paper}): **{verdict}** ({holm_text}"
                     f"{METRICS.get(finding.metric, finding.metric)}; {judged.describe()})."
                     + "".join(f" {words} {said[key]}." for key, words in SAID if said[key]))
    if family:
        decided = [i for i in family if judgements[i].verdict in DECIDED]
        kept = sum(adjusted[i] < ALPHA for i in decided)
        lines.append(f"\nMultiplicity: {len(family)} judged rows in this table, {len(decided)} "
                     f"decided (reproduced or contradicted) at {ALPHA:.1%} a side each; {kept} of "
                     f"them {'survives' if kept == 1 else 'survive'} Holm's correction across the "
                     f"{len(family)} (family-wise error {ALPHA:.1%} a side).")
    if margins:
        lines.append("\nMargins of the claims of no difference, fixed in the specs (a judgement, "
                     "with its reasons): " + " ".join(f"*{c}*: {w}" for c, w in margins.items()))
    if absent:
        lines.append("\nNot compared (their cells are not run at this scale): "
                     + "; ".join(f"*{c}*" for c in absent) + ".")
    return "\n".join(lines), verdicts
