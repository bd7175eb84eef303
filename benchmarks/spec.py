"""An ablation as a declarative spec: the cells it trains at each scale, the paper's numbers, and its
findings as contrasts of cells judged by the one rule of `benchmarks.verdict`.

    cells(scale) -> [Cell]     what differs from the scale's base model and training, per cell
    findings                   the paper's claims, each a list of contrasts between cells
    paper                      the paper's number per cell label, printed beside ours
    columns, figure            how the table and the figure present the cells

`runs(spec, scale)` expands the cells into runs (every cell trained with `scale.seeds` seeds, or the
spec's own count, or the cell's where it asks for more), `report(spec, records, out)` writes the table, the verdicts and the figure. Every
ablation is a spec in `benchmarks/ablations/`, registered in its `ABLATIONS`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks.judged import format_findings
from benchmarks.suite import Run, markdown_image, markdown_table
from benchmarks.verdict import (
    NOT_TESTABLE,
    POSITIVE,
    RULE,
    ZERO,
    Comparison,
    Estimate,
    Judgement,
    Within,
    judge,
    mean_and_variance,
    paired_contrast,
)

METRICS = {"test_acc": "test accuracy", "fewshot_5": "5-shot linear",
           # the transfer benchmark's, measured on classes never seen in pre-training
           "transfer_fewshot_5": "downstream 5-shot linear", "transfer_finetune": "downstream fine-tuned"}


@dataclass(frozen=True)
class Scale:
    """The base every cell of an ablation varies: a model (ViTConfig options), its training (TrainConfig
    options), the number of seeds per cell, and the time each ablation may take on the machine it is
    meant for (checked by `python -m benchmarks --dry-run` and a test)."""

    name: str
    model: dict[str, Any]
    train: dict[str, Any]
    seeds: int
    budget_min: float | None = None  # per ablation
    suite_budget_min: float | None = None  # all ablations together
    zoo_name: str = "vit_ti16"  # the named model the options apply to
    # the cells the ablations take: the scale's own, or another's ("paper": the paper's models, also at
    # the scales that shrink them)
    cells_of: str | None = None
    # the model of every run, changed as the scale says (zoo name, options -> options): the rehearsal
    # shrinks every dimension of the paper's models, keeping what tells the cells apart
    shrink: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    processes_per_run: int = 1  # data-parallel processes of a run on the CPU (GPUs: one per GPU)

    @property
    def cells(self) -> str:
        """Whose cells the ablations take at this scale: the paper's, or the scale's own."""
        return self.cells_of or self.name


@dataclass(frozen=True)
class Cell:
    """One configuration of an ablation: what it changes from the scale's base, and its coordinates
    (the table's columns: position embedding, family, subset size ...)."""

    label: str
    coords: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # model options over the scale's
    train: dict[str, Any] = field(default_factory=dict)  # training options over the scale's
    model: str | None = None  # a zoo name other than the scale's
    inherit: bool = True  # False: the zoo model as named, only `options` applied (cost's models at their sizes)
    # at least this many seeds, more than the ablation's (where a contrast of this cell needs them to be decided)
    seeds: int | None = None


Contrasts = list[tuple[str, dict[str, float]]]


@dataclass(frozen=True)
class Margin:
    """How far from zero a difference may lie and still count as none, for a finding that claims no
    difference: a judgement, stated in its spec with `why`, fixed before the table it judges is
    regenerated. Either `points`, in the metric's own units (absolute: what every committed finding
    uses), or `fraction` of a `reference` contrast measured in the same table (relative: e.g. a quarter
    of the gap between no position embedding and the learned ones); `reference(table)` names that
    contrast and its weights, None when the table lacks its cells. A relative margin is estimated with
    the table's noise (`benchmarks.verdict`), and is no margin when its reference is not above zero."""

    why: str
    points: float | None = None
    fraction: float | None = None
    reference: Callable[[Table], tuple[str, dict[str, float]] | None] | None = None

    def __post_init__(self) -> None:
        if not self.why.strip():
            raise ValueError("a margin states why it is what it is (a judgement, and what it rests on)")
        if (self.points is None) == (self.fraction is None) or (self.fraction is None) != (self.reference is None):
            raise ValueError("a margin is either `points` (absolute) or `fraction` of a `reference` contrast (relative)")
        if self.points is not None and not self.points > 0:
            raise ValueError(f"a margin in points is above zero, got {self.points}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"a margin's fraction of its reference lies in (0, 1], got {self.fraction}")

    def describe(self, table: Table | None = None) -> str:
        if self.points is not None:
            return f"±{self.points:g} (absolute)"
        named = self.reference(table) if table is not None else None
        return f"±{self.fraction:g} × ({named[0] if named else 'the reference contrast'}) (relative)"

    def within(self, table: Table, weights: dict[str, float], metric: str, d: Estimate) -> Within | None:
        """The difference with `weights` (estimated as `d`) against this margin; None when the table
        lacks the reference's cells."""
        if self.points is not None:
            return Within.absolute(d, self.points)
        named = self.reference(table)
        if named is None:
            return None
        margin = combine((self.fraction, named[1]))
        value = table.estimate(margin, metric).value
        # a fraction of a reference at or below zero bounds nothing: no difference could lie inside it
        untestable = "" if value > 0 else (f"the margin's reference ({named[0]}) is {value / self.fraction:+.4f}, "
                                           "not above zero: a fraction of it is no margin")
        return Within(value, table.estimate(combine((1.0, margin), (-1.0, weights)), metric),
                      table.estimate(combine((1.0, margin), (1.0, weights)), metric), untestable)


@dataclass(frozen=True)
class Finding:
    """A claim of the paper, tested as contrasts of cells: `contrasts(table)` names each comparison and
    its weights per cell label (e.g. ("learned_1d - none", {"learned_1d": 1, "none": -1})); `expect`
    says whether the paper claims a positive difference or none (`benchmarks.verdict`). A claim of
    no difference states its `margin`. `regime`: the regime the paper's claim is made in, where a scale
    may lie outside it (e.g. the paper's ~100M images), printed beside a verdict that is not
    "reproduced"; `note(table)`: what a reader must know beside any verdict, computed from the table
    (e.g. unequal compute); `untestable(table)`: why this scale's table cannot show the claim at all
    (the verdict is then "not testable", with the reason), '' where it can."""

    claim: str
    paper: str
    expect: str
    contrasts: Callable[[Table], Contrasts]
    metric: str = "test_acc"
    margin: Margin | None = None
    regime: str = ""
    note: Callable[[Table], str] | None = None
    untestable: Callable[[Table], str] | None = None

    def __post_init__(self) -> None:
        if self.expect == ZERO and self.margin is None:
            raise ValueError(f"{self.claim!r} claims no difference: state its margin (benchmarks.spec.Margin) and why")
        if self.expect == POSITIVE and self.margin is not None:
            raise ValueError(f"{self.claim!r} claims a difference: a margin is for claims of no difference")

    def judge(self, table: Table) -> Judgement:
        evidence = []
        for name, weights in self.contrasts(table):
            d = table.estimate(weights, self.metric)
            within = self.margin.within(table, weights, self.metric, d) if self.margin is not None else None
            if self.margin is not None and within is None:  # the margin's reference is not in the table
                return judge(self.expect, [])
            evidence.append(Comparison(name, d, within))
        judged = judge(self.expect, evidence)
        # a table that holds the cells but cannot compare them (e.g. no ViT at a hybrid's compute) is not testable
        reason = self.untestable(table) if self.untestable is not None and (evidence or table.rows) else ""
        return Judgement(NOT_TESTABLE, evidence, reason=reason) if reason else judged


@dataclass(frozen=True)
class Ablation:
    name: str
    title: str
    cells: Callable[[Scale], list[Cell]]
    findings: tuple[Finding, ...] = ()
    paper: dict[str, float] = field(default_factory=dict)  # cell label -> the paper's number
    paper_caption: str = ""  # what the paper's number is (metric, dataset)
    columns: tuple[tuple[str, str], ...] = ()  # (row key, title) before the metrics
    figure: Callable[[list[dict], list[dict], Path], list[str]] | None = None  # rows, records, folder -> files
    seeds: Callable[[Scale], int] | None = None  # default: the scale's
    measure: Callable[..., dict] | None = None  # default: benchmarks.training.measure
    # an ablation that is not a table of cells (cost), or whose table depends on the scale (transfer): the
    # body, or the body and the verdicts
    report: Callable[[list[dict], Path], str | tuple[str, list[dict]]] | None = None
    parallel: bool = True  # False: it times things and must have the machine to itself
    trains: bool = True  # False: its runs are not trained (cost): no training settings from the scale
    notes: str = ""  # printed under the table

    def runs(self, scale: Scale) -> list[Run]:
        """Every cell, once per seed: the only place a run's config is built."""
        seeds = self.seeds(scale) if self.seeds else scale.seeds
        runs = []
        for cell in self.cells(scale):
            options = {**scale.model, **cell.options} if cell.inherit else dict(cell.options)
            train = {**scale.train, **cell.train} if self.trains else dict(cell.train)
            model = cell.model or scale.zoo_name
            if scale.shrink is not None:
                options = scale.shrink(model, options)
            config = {"model": model, "options": options, "train": train}
            runs += [Run(self.name, cell.label, config, seed, dict(cell.coords)) for seed in range(max(seeds, cell.seeds or 0))]
        return runs


class Table:
    """The measured cells of an ablation: per label, the seeds' values of each metric, and a summary
    row (coordinates, mean and standard deviation of each metric with the seeds it was measured in,
    training FLOPs, parameters). A metric some seeds lack is averaged over those that have it, and the
    row says how many (`<metric>_n`)."""

    def __init__(self, records: list[dict]) -> None:
        self.records: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            self.records[r["label"]].append(r)
        self.rows = [self._row(label, runs) for label, runs in self.records.items()]
        self.by_label = {row["label"]: row for row in self.rows}

    @staticmethod
    def _row(label: str, runs: list[dict]) -> dict:
        row = {"label": label, "seeds": len(runs), **runs[0]["group"]}
        for metric in {k for r in runs for k, v in r["metrics"].items() if isinstance(v, (int, float))}:
            values = [r["metrics"][metric] for r in runs if r["metrics"].get(metric) is not None]
            mean, variance, n = mean_and_variance(values)
            # one seed: no spread (0.0 for the figures' error bars; the table says "one seed")
            row[metric], row[metric + "_std"], row[metric + "_n"] = mean, variance**0.5 if n > 1 else 0.0, n
        if all("flops" in r for r in runs):
            row["flops"] = sum(r["flops"] for r in runs) / len(runs)
            row["compute"] = f"{row['flops'] / 1e12:.2f} TFLOP"
        if "params" in runs[0]:
            row["params"] = runs[0]["params"]
            row["params_k"] = f"{row['params'] / 1e3:.0f}k"
        return row

    def values(self, label: str, metric: str) -> list[float]:
        return list(self.by_seed(label, metric).values())

    def by_seed(self, label: str, metric: str) -> dict[Any, float]:
        """seed -> the metric's value, for the seeds of the cell that measured it."""
        return {r.get("seed", i): r["metrics"][metric] for i, r in enumerate(self.records[label])
                if r["metrics"].get(metric) is not None}

    def where(self, **coords: Any) -> list[dict]:
        """Summary rows whose coordinates match."""
        return [row for row in self.rows if all(row.get(k) == v for k, v in coords.items())]

    def estimate(self, weights: dict[str, float], metric: str) -> Estimate:
        """The contrast over seeds, paired where the cells share seeds (`benchmarks.verdict.paired_contrast`)."""
        return paired_contrast({label: self.by_seed(label, metric) for label in weights}, weights)


def combine(*terms: tuple[float, dict[str, float]]) -> dict[str, float]:
    """sum_k c_k * weights_k, merged per label (a contrast of contrasts)."""
    out: dict[str, float] = defaultdict(float)
    for c, weights in terms:
        for label, w in weights.items():
            out[label] += c * w
    return {label: w for label, w in out.items() if w != 0.0}


def difference(a: str, b: str) -> dict[str, float]:
    return {a: 1.0, b: -1.0}


def interpolate_log(rows: list[dict], x: float, key: str = "flops") -> dict[str, float] | None:
    """Weights giving a family's accuracy at `x`, linear in log(x) between its two neighbouring cells;
    None outside the family's range."""
    import math

    points = sorted(rows, key=lambda r: r[key])
    for lo, hi in zip(points, points[1:]):
        if lo[key] <= x <= hi[key]:
            t = (math.log(x) - math.log(lo[key])) / (math.log(hi[key]) - math.log(lo[key])) if hi[key] > lo[key] else 0.0
            return combine((1 - t, {lo["label"]: 1.0}), (t, {hi["label"]: 1.0}))
    return None


def column_value(value: Any) -> Any:
    """Coordinates as given; averaged numbers with four significant digits (a step stays a whole number)."""
    return f"{value:.4g}" if isinstance(value, float) else value


def metric_cell(row: dict, metric: str) -> str:
    """mean ± standard deviation over the seeds that measured it, saying so when some did not (one seed:
    no spread to print)."""
    if metric not in row:
        return "n/a"
    n = row.get(metric + "_n", row["seeds"])
    used = f" ({n} of {row['seeds']} seeds)" if n < row["seeds"] else ""
    if n < 2:
        return f"{row[metric]:.4f} (one seed{'' if used else ', no spread'}){used}"
    return f"{row[metric]:.4f} ± {row[metric + '_std']:.4f}{used}"


def report(spec: Ablation, records: list[dict], out: Path) -> tuple[str, list[dict]]:
    """The table beside the paper's numbers, the figure, and every finding judged by the one rule."""
    table = Table(records)
    metrics = [m for m in METRICS if any(m in row for row in table.rows)]
    header = [title for _, title in spec.columns] + ["seeds"] + [METRICS[m] for m in metrics]
    if spec.paper:
        header.append(f"paper ({spec.paper_caption})")
    lines = []
    for row in table.rows:
        cells = [column_value(row.get(key, "")) for key, _ in spec.columns] + [row["seeds"]] + [metric_cell(row, m) for m in metrics]
        if spec.paper:
            cells.append(spec.paper.get(row["label"], "n/a"))
        lines.append(cells)
    body = markdown_table(header, lines)
    if spec.notes:
        body += "\n\n" + spec.notes
    if spec.figure is not None:
        files = spec.figure(table.rows, records, out)
        body += "\n\n" + "\n\n".join(markdown_image(f) for f in files)
    findings, verdicts = format_findings(spec.findings, table, METRICS)
    if findings:
        body += f"\n\nFindings, each judged by one rule ({RULE}; mean ± standard deviation over seeds above):\n\n{findings}"
    return body, verdicts
