"""Class token against global average pooling (paper Appendix D.3, Figure 9): both heads at two
learning rates, accuracy against epochs.

The paper's findings: both heads work equally well, each at its own learning rate; GAP at the class
token's learning rate (8e-4) underperforms, and catches up at a lower one (3e-4).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.figures import plt, save_figure
from benchmarks.spec import Ablation, Cell, Finding, Margin, Scale, Table, combine, difference
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


def learning_rate_effect(table: Table) -> tuple[str, dict[str, float]] | None:
    """What the learning rate changes within a head: each head's best cell minus its others, averaged
    over the two heads (None without two learning rates of each)."""
    terms = []
    for pool in POOLS:
        top = best(table, pool) if table.where(pool=pool) else None
        others = [row["label"] for row in table.where(pool=pool) if row["label"] != top]
        if not others:
            return None
        terms += [(1.0 / (len(POOLS) * len(others)), difference(top, other)) for other in others]
    return "best lr - other lr, mean over heads", combine(*terms)


# How far apart the heads may be and still "work equally well": a quarter of what the learning rate changes
# within a head in the same table. Figure 9 gives curves, not numbers: the class token at 8e-4 and GAP at
# 3e-4 end together, GAP at 8e-4 lies below both throughout, and Appendix D.3 puts the whole difference
# between the heads down to the learning rate each needs. The claim is thus that the head matters little
# next to its learning rate: relative to that, with the same quarter as Table 8's "barely matters".
HEAD_MARGIN = Margin(
    "Figure 9 (curves, no table) shows the class token at 8e-4 and GAP at 3e-4 ending together while GAP at "
    "8e-4 stays clearly below: the paper puts the difference between heads down to the learning rate each "
    "needs. So the heads at their best count as equal within a quarter of what the learning rate (a factor "
    "8/3) changes within a head in the same table, the share Table 8's finding allows its encodings.",
    fraction=0.25, reference=learning_rate_effect)

FINDINGS = (
    Finding("Both heads work equally well, each at its own learning rate", "Figure 9: equal at their best", ZERO,
            lambda t: [(f"best token ({best(t, 'token')}) - best GAP ({best(t, 'gap')})",
                        difference(best(t, "token"), best(t, "gap")))] if t.where(pool="gap") and t.where(pool="token") else [],
            margin=HEAD_MARGIN),
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
