"""Figures the ablations share: matplotlib without a display, and accuracy against compute (or
data) with one line per model family."""

from __future__ import annotations

from pathlib import Path

from benchmarks.suite import save_figure

METRIC_NAMES = (("test_acc", "test accuracy"), ("fewshot_5", "5-shot linear accuracy"))
# one colour and marker per family in every figure, so that figures can be read side by side
FAMILY_STYLES = {"ViT": ("tab:orange", "s"), "hybrid": ("tab:green", "^"),
                 "ResNet": ("tab:blue", "o")}
MATPLOTLIB_MISSING = ("the benchmarks draw their figures with matplotlib: "
                      "pip install -e '.[bench]' in the checkout")


def plt():
    """matplotlib's pyplot, drawing without a display (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def save(fig, path: Path) -> list[str]:
    save_figure(fig, path)
    plt().close(fig)
    return [path.name]


def lines_per_family(rows: list[dict], path: Path, title: str, x_key: str = "flops",
                     x_label: str = "training FLOPs", metrics=METRIC_NAMES) -> list[str]:
    """Two metrics against `x_key` on a log axis, one line per row["family"], error bars over
    seeds (Figures 3, 4, 5 and 8)."""
    fig, axes = plt().subplots(1, 2, figsize=(9, 3.5))
    families = list(dict.fromkeys(r["family"] for r in rows))
    for ax, (metric, name) in zip(axes, metrics):
        for i, family in enumerate(families):
            mine = sorted((r for r in rows if r["family"] == family and metric in r),
                          key=lambda r: r[x_key])
            color, marker = FAMILY_STYLES.get(family, (f"C{i + 3}", "dv<>"[i % 4]))
            ax.errorbar([r[x_key] for r in mine], [r[metric] for r in mine],
                        yerr=[r[metric + "_std"] for r in mine], color=color, marker=marker,
                        label=str(family), capsize=2)
        ax.set(xscale="log", xlabel=x_label, ylabel=name)
        ax.xaxis.set_minor_formatter("")  # decades labelled only: the minor labels overlap
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)
