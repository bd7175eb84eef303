"""Class token against global average pooling (paper Appendix D.3, Figure 9): both heads at two
learning rates, accuracy against epochs."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import by_label, metrics_table, plt, save_figure, summary_rows
from benchmarks.training import per_epoch_eval, scale_settings
from benchmarks.suite import Run

NAME = "head"
PAPER_LRS = (8e-4, 3e-4)  # Figure 9: the class-token lr, and the lower lr at which GAP catches up


def plan(scale: str, quick: bool, data=None, data_dir=None) -> list[Run]:
    model, train = scale_settings(scale, quick, data, data_dir)
    name = "vit_b16" if scale == "paper" and not quick else "vit_ti16"
    lrs = PAPER_LRS if scale == "paper" else (train["lr"], train["lr"] * 3 / 8)
    epochs = train["epochs"] if quick else max(train["epochs"], 2.0)
    train = per_epoch_eval({**train, "epochs": epochs}, per_epoch=1 if quick else 2)
    seeds = range(1 if quick else 2)
    return [
        Run(NAME, f"{pool}, lr {lr:g}", {"model": name, "options": {**model, "pool": pool}, "train": {**train, "lr": lr}},
            seed, {"pool": pool, "lr": lr})
        for pool in ("token", "gap") for lr in lrs for seed in seeds
    ]


def report(records: list[dict], out: Path) -> str:
    rows = summary_rows(records)
    table = metrics_table(rows, [("pool", "pooling"), ("lr", "learning rate")])
    figure(records, out / "head.png")
    best = {pool: max((r for r in rows if r["pool"] == pool), key=lambda r: r["test_acc"]) for pool in ("token", "gap")}
    gap = abs(best["token"]["test_acc"] - best["gap"]["test_acc"])
    noise = max(best["token"]["test_acc_std"], best["gap"]["test_acc_std"]) + 0.005
    lrs = sorted({r["lr"] for r in rows}, reverse=True)
    at_high = {r["pool"]: r for r in rows if r["lr"] == lrs[0]}
    findings = [
        "- *Both heads work equally well, each at its own learning rate* (paper): "
        + ("**reproduced**" if gap <= noise else "**not reproduced**")
        + f" at this scale: best token {best['token']['test_acc']:.4f} (lr {best['token']['lr']:g}), "
        f"best GAP {best['gap']['test_acc']:.4f} (lr {best['gap']['lr']:g}).",
    ]
    if len(lrs) > 1 and {"token", "gap"} <= set(at_high):
        under = at_high["gap"]["test_acc"] < at_high["token"]["test_acc"] - noise
        findings.append(
            f"- *GAP at the class-token learning rate underperforms* (paper): "
            + ("**reproduced**" if under else "**not reproduced**")
            + f": at lr {lrs[0]:g}, GAP {at_high['gap']['test_acc']:.4f} vs token {at_high['token']['test_acc']:.4f}."
        )
    return table + "\n\n" + "\n".join(findings)


def figure(records: list[dict], path: Path) -> None:
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(5.5, 3.5))
    for i, (label, runs) in enumerate(by_label(records).items()):
        curves = [r["metrics"]["curve"] for r in runs]
        n = min(len(c) for c in curves)
        epochs = [curves[0][k]["epoch"] for k in range(n)]
        mean = [sum(c[k]["test_acc"] for c in curves) / len(curves) for k in range(n)]
        ax.plot(epochs, mean, marker="o", linestyle="-" if "token" in label else "--", label=label, color=f"C{i}")
    ax.set_xlabel("epochs of training")
    ax.set_ylabel("test accuracy")
    ax.set_title("Class token vs global average pooling (Figure 9)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    pyplot.close(fig)
