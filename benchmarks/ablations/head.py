"""Class token against global average pooling (paper Appendix D.3, Figure 9): both heads at two
learning rates, accuracy against epochs.

The paper's findings: both heads work equally well, each at its own learning rate; GAP at the class
token's learning rate (8e-4) underperforms, and catches up at a lower one (3e-4).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.figures import plt, save_figure
from benchmarks.spec import Ablation, Cell, Finding, Scale, Table, difference
from benchmarks.training import evaluate_per_epoch
from benchmarks.verdict import POSITIVE, ZERO

PAPER_LRS = (8e-4, 3e-4)  # Figure 9: the class-token lr, and the lower lr at which GAP catches up
POOLS = ("token", "gap")


def learning_rates(scale: Scale) -> tuple[float, float]:
    """The class token's learning rate and the lower one (in the paper's ratio 3/8)."""
    return PAPER_LRS if scale.cells == "paper" else (scale.train["lr"], scale.train["lr"] * 3 / 8)


def label(pool: str, lr: float) -> str:
    return f"{pool}, lr {lr:g}"


def cells(scale: Scale) -> list[Cell]:
    train = evaluate_per_epoch(scale.train, per_epoch=1 if scale.name == "quick" else 2)
    return [Cell(label(pool, lr), {"pool": pool, "lr": lr}, {"pool": pool}, {**train, "lr": lr})
            for pool in POOLS for lr in learning_rates(scale)]


def best(table: Table, pool: str) -> str:
    return max(table.where(pool=pool), key=lambda r: r["test_acc"])["label"]


def at_high_lr(table: Table) -> dict[str, str]:
    high = max(row["lr"] for row in table.rows)
    return {row["pool"]: row["label"] for row in table.where(lr=high)}


FINDINGS = (
    Finding("Both heads work equally well, each at its own learning rate", "Figure 9: equal at their best", ZERO,
            lambda t: [(f"best token ({best(t, 'token')}) - best GAP ({best(t, 'gap')})",
                        difference(best(t, "token"), best(t, "gap")))] if t.where(pool="gap") and t.where(pool="token") else []),
    Finding("GAP at the class-token learning rate underperforms", "Figure 9, lr 8e-4", POSITIVE,
            lambda t: [(f"{h['token']} - {h['gap']}", difference(h["token"], h["gap"]))]
            if len(h := at_high_lr(t)) == 2 and len({r["lr"] for r in t.rows}) > 1 else []),
)


def figure(rows: list[dict], records: list[dict], out: Path) -> list[str]:
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(5.5, 3.5))
    for i, row in enumerate(rows):
        curves = [r["metrics"]["curve"] for r in records if r["label"] == row["label"]]
        n = min(len(c) for c in curves)
        epochs = [curves[0][k]["epoch"] for k in range(n)]
        mean = [sum(c[k]["test_acc"] for c in curves) / len(curves) for k in range(n)]
        ax.plot(epochs, mean, marker="o", linestyle="-" if row["pool"] == "token" else "--", label=row["label"], color=f"C{i}")
    ax.set_xlabel("epochs of training")
    ax.set_ylabel("test accuracy (mean over seeds)")
    ax.set_title("Class token vs global average pooling (Figure 9)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, out / "head.png")
    pyplot.close(fig)
    return ["head.png"]


SPEC = Ablation(
    name="head",
    title="Class token vs global average pooling (Appendix D.3, Figure 9)",
    cells=cells,
    findings=FINDINGS,
    columns=(("pool", "pooling"), ("lr", "learning rate")),
    figure=figure,
)
