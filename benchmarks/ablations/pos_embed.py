"""Position embeddings (paper Appendix D.4, Table 8): none, 1-D, 2-D and relative, added at the
input, at every layer, or shared across layers.

The paper's findings: a model without position information is clearly worse (ViT-B/16, 5-shot
ImageNet: 0.614 against 0.640-0.643), and how the position is encoded barely matters (every variant
within 0.004). The main job (`./run.sh main`, scale `main`) runs the headline of this table: no
position embedding against the learned ones, two seeds each.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.figures import plt, save_figure
from benchmarks.spec import Ablation, Cell, Finding, Margin, Scale, difference
from benchmarks.verdict import POSITIVE, ZERO

CELLS = [("none", "input"), ("learned_1d", "input"), ("learned_1d", "every_layer"), ("learned_1d", "every_layer_shared"),
         ("learned_2d", "input"), ("learned_2d", "every_layer"), ("learned_2d", "every_layer_shared"), ("relative", "input")]
HEADLINE = [("none", "input"), ("learned_1d", "input")]  # what fits the main job's six minutes
QUICK = [("none", "input"), ("learned_1d", "input"), ("relative", "input")]
DEFAULT = "learned_1d / input"  # the paper's choice
# Table 8: ViT-B/16, 5-shot linear ImageNet accuracy after 7 epochs of JFT
PAPER = {"none / input": 0.61382, "learned_1d / input": 0.64206, "learned_1d / every_layer": 0.63964,
         "learned_1d / every_layer_shared": 0.64292, "learned_2d / input": 0.64001, "learned_2d / every_layer": 0.64046,
         "learned_2d / every_layer_shared": 0.64022, "relative / input": 0.64032}


def label(pos_embed: str, mode: str) -> str:
    return f"{pos_embed} / {mode}"


# Seeds beyond the scale's where a contrast was inconclusive and more decide it, fixed before they were
# trained: at the cpu scale's 3 seeds "learned_1d / input - none" in 5-shot accuracy was +0.0171 with a paired
# standard deviation of 0.0075 over seeds, and its interval reaches above zero from 4 seeds on (t at 3 degrees of
# freedom) if the spread stays; 5 seeds leave room. The other encodings' contrasts to none were decided at 3.
MORE_SEEDS = {"cpu": {label("none", "input"): 5, label("learned_1d", "input"): 5}}


def cells(scale: Scale) -> list[Cell]:
    grid = {"quick": QUICK, "main": HEADLINE}.get(scale.name, CELLS)
    more = MORE_SEEDS.get(scale.name, {})
    return [Cell(label(pe, mode), {"pos_embed": pe, "mode": mode}, {"pos_embed": pe, "pos_embed_mode": mode},
                 seeds=more.get(label(pe, mode))) for pe, mode in grid]


def with_position(table) -> list[str]:
    return [row["label"] for row in table.rows if row["pos_embed"] != "none"]


def _position_helps(t):
    return [(f"{other} - none", difference(other, "none / input")) for other in with_position(t)] \
        if "none / input" in t.by_label else []


def _encoding_barely_matters(t):
    return [(f"{other} - {DEFAULT}", difference(other, DEFAULT)) for other in with_position(t) if other != DEFAULT] \
        if DEFAULT in t.by_label else []


# How far an encoding may lie from the default and still "barely matter": half a point of accuracy, fixed in
# points (a judgement). It was a quarter of the gap the same table measured between no embedding and the learned
# ones, which moved with that gap's noise and had no meaning when the gap was not above zero.
ENCODING_MARGIN = Margin(
    "A judgement, fixed before the table is regenerated: half a point of accuracy (0.005). Table 8's encodings lie "
    "within 0.0029 of each other and 0.0024 of the default, against a 2.7-point gap to no embedding, so the paper's "
    "claim holds at 0.005 with room; at the CPU scale a cell's seeds spread by 0.2-0.4 points (one standard "
    "deviation), and a difference under half a point is one nobody reading Table 8 would call a difference. Fixed in "
    "issue 34 after the CPU table had been read; it replaces a quarter of the gap to no embedding measured in the same "
    "table (0.0042 and 0.0051 there), which moved with that gap's noise.",
    points=0.005)

# judged on both metrics: the paper's (5-shot) and the steadier test accuracy
FINDINGS = tuple(
    finding
    for metric in ("test_acc", "fewshot_5")
    for finding in (
        Finding("No position embedding is clearly worse", "0.614 vs 0.640-0.643", POSITIVE, _position_helps, metric),
        Finding("How position is encoded barely matters", "every variant within 0.004", ZERO, _encoding_barely_matters, metric,
                margin=ENCODING_MARGIN),
    )
)


def figure(rows: list[dict], records: list[dict], out: Path) -> list[str]:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(10, 3.5))
    for ax, metric, name in zip(axes, ("test_acc", "fewshot_5"), ("test accuracy", "5-shot linear accuracy")):
        ax.bar(range(len(rows)), [r[metric] for r in rows], yerr=[r[metric + "_std"] for r in rows], capsize=3,
               color=["C7" if r["pos_embed"] == "none" else "C0" for r in rows])
        ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=40, ha="right", fontsize=7)
        ax.set_ylabel(name)
        low = min(r[metric] - r[metric + "_std"] for r in rows)
        ax.set_ylim(max(0.0, low - 0.05), None)
    fig.suptitle("Position embeddings (Table 8); error bars: standard deviation over seeds", fontsize=9)
    save_figure(fig, out / "pos_embed.png")
    pyplot.close(fig)
    return ["pos_embed.png"]


SPEC = Ablation(
    name="pos_embed",
    title="Position embeddings (Appendix D.4, Table 8)",
    cells=cells,
    findings=FINDINGS,
    paper=PAPER,
    paper_caption="5-shot, ImageNet",
    columns=(("pos_embed", "position embedding"), ("mode", "injection")),
    figure=figure,
)
