"""Tables and figures the training ablations share: metrics per label, mean and std over seeds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.suite import markdown_table, mean_std, save_figure

METRICS = ("test_acc", "fewshot_5")


def by_label(records: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[r["label"]].append(r)
    return dict(groups)


def summary_rows(records: list[dict], extra: dict[str, Any] | None = None) -> list[dict]:
    """One row per label: mean and std of each metric over seeds, FLOPs, params, group coordinates."""
    rows = []
    for label, runs in by_label(records).items():
        row = {"label": label, "seeds": len(runs), **runs[0]["group"]}
        for metric in METRICS:
            values = [r["metrics"][metric] for r in runs if r["metrics"].get(metric) is not None]
            row[metric], row[metric + "_std"] = mean_std(values) if values else (float("nan"), 0.0)
        row["flops"] = sum(r["flops"] for r in runs) / len(runs)
        row["params"] = runs[0]["params"]
        rows.append(row)
    return rows


def metric_cell(row: dict, metric: str) -> str:
    return f"{row[metric]:.4f} ± {row[metric + '_std']:.4f}"


def metrics_table(rows: list[dict], first: list[tuple[str, str]], paper: dict[str, float] | None = None) -> str:
    """Markdown table: the given leading columns, then both metrics (and the paper's number)."""
    header = [title for _, title in first] + ["seeds", "test accuracy", "5-shot linear"]
    if paper is not None:
        header.append("paper (5-shot, ImageNet)")
    lines = []
    for row in rows:
        cells = [row[key] for key, _ in first] + [row["seeds"], metric_cell(row, "test_acc"), metric_cell(row, "fewshot_5")]
        if paper is not None:
            cells.append(paper.get(row["label"], "n/a"))
        lines.append(cells)
    return markdown_table(header, lines)


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def scatter_compute(rows: list[dict], family_key: str, path: Path, title: str, x_key: str = "flops") -> None:
    """Accuracy against compute, one line per family (Figures 5 and 8)."""
    from matplotlib.ticker import NullFormatter

    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(9, 3.5))
    families = list(dict.fromkeys(r[family_key] for r in rows))
    for ax, metric, name in zip(axes, METRICS, ("test accuracy", "5-shot linear accuracy")):
        for i, family in enumerate(families):
            mine = sorted((r for r in rows if r[family_key] == family), key=lambda r: r[x_key])
            ax.errorbar([r[x_key] for r in mine], [r[metric] for r in mine], yerr=[r[metric + "_std"] for r in mine],
                        marker="os^dv<>"[i % 7], label=str(family), capsize=2)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: the minor ones overlap
        ax.set_xlabel("training FLOPs" if x_key == "flops" else x_key)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
    pyplot.close(fig)
