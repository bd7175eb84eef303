"""Hybrid against ViT against ResNet at matched compute (paper Figure 5, Table 6): sizes of each family,
accuracy against training compute in FLOPs (counted with torch.utils.flop_counter).

The ResNet family is the hybrid's own BiT ResNet (weight-standardized convs, GroupNorm) pooled and
classified directly: `depth=0`, i.e. no Transformer layer after the stem. The paper's findings: hybrids
beat ViT at small compute, the gap vanishes for larger models, and ViT needs 2-4x less compute than a
ResNet for the same accuracy.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.figures import lines_per_family
from benchmarks.spec import Ablation, Cell, Finding, Scale, Table, combine, interpolate_log
from benchmarks.verdict import POSITIVE

FAMILIES = ("ViT", "hybrid", "ResNet")
PAPER_FAMILIES = {
    "ViT": [("B/32", "vit_b32", {}), ("B/16", "vit_b16", {}), ("L/16", "vit_l16", {})],
    "hybrid": [("R26+S/32", "vit_s32_r26_hybrid", {}), ("R50+B/16", "vit_b16_hybrid", {}), ("R50+L/16", "vit_l16_hybrid", {})],
    "ResNet": [(f"R{n}", "vit_b16_hybrid", {"stem_options": {"layers": layers}, "depth": 0, "pos_embed": "none", "pool": "gap"})
               for n, layers in (("26", (2, 2, 2, 2)), ("50", (3, 4, 6, 3)), ("101", (3, 4, 23, 3)))],
}
# The small scales, at 28 px: transformer widths of the ViT (7x7-pixel patches, 16 tokens) and of the
# hybrid (the ResNet root, stride 4: a 7x7 map, 49 tokens), and the ResNets' first stage (units of one
# stage: 28 px is not divisible by a second stage's stride 8). Training MFLOPs per image: ViT 3.9, 14.5,
# 55.7; hybrid 31.2, 50.7; ResNet 29.0, 49.4: the ResNets and hybrids lie inside the ViT's range. The
# small hybrid is D48: under D32 (16.7 MFLOPs) it reached 87.5%, below the CPU scale's 88% floor for
# hybrids (trials in benchmarks/results/trials/floors: D48 89.2%, D64 with 2 layers 88.3%).
VIT_WIDTHS = {"quick": [(32, 2)], "main": [(32, 2), (64, 4), (128, 4)], "cpu": [(32, 2), (64, 4), (128, 4)]}
HYBRID_WIDTHS = {"quick": [(32, 2)], "main": [(32, 2), (64, 4)], "cpu": [(48, 4), (64, 4)]}
STAGES = {"quick": [(1,)], "main": [(1,), (2,)], "cpu": [(1,), (2,)]}


def families(scale: Scale) -> dict[str, list[tuple[str, str | None, dict]]]:
    """family -> [(size label, zoo name or None for the scale's, options)]"""
    if scale.cells == "paper":
        return PAPER_FAMILIES
    hybrid = {"stem": "resnet", "stem_options": {"layers": ()}, "patch_size": 1}
    resnet = {"embed_dim": 64, "num_heads": 4, "depth": 0, "stem": "resnet", "patch_size": 1, "pos_embed": "none",
              "pool": "gap"}
    shape = lambda d, h: {"embed_dim": d, "num_heads": h, "mlp_dim": 2 * d}  # noqa: E731
    return {
        "ViT": [(f"D{d}", None, shape(d, h)) for d, h in VIT_WIDTHS[scale.name]],
        "hybrid": [(f"R+D{d}", None, {**hybrid, **shape(d, h)}) for d, h in HYBRID_WIDTHS[scale.name]],
        "ResNet": [(f"R{'-'.join(map(str, s))}", None, {**resnet, "stem_options": {"layers": s}}) for s in STAGES[scale.name]],
    }


def cells(scale: Scale) -> list[Cell]:
    return [Cell(f"{family} {size}", {"family": family, "size": size}, options, model=name)
            for family, sizes in families(scale).items() for size, name, options in sizes]


def vit_at(table: Table, flops: float) -> dict[str, float] | None:
    """The ViT family's accuracy at this compute, interpolated in log-compute between its cells."""
    return interpolate_log(table.where(family="ViT"), flops)


def hybrid_lead(table: Table, row: dict) -> dict[str, float] | None:
    """Hybrid minus ViT at the hybrid's compute (None outside the ViT range)."""
    vit = vit_at(table, row["flops"])
    return None if vit is None else combine((1.0, {row["label"]: 1.0}), (-1.0, vit))


def smallest_and_largest(table: Table, family: str) -> tuple[dict, dict]:
    rows = sorted(table.where(family=family), key=lambda r: r["flops"])
    return rows[0], rows[-1]


def _hybrids_win_small(t: Table):
    small, _ = smallest_and_largest(t, "hybrid")
    lead = hybrid_lead(t, small)
    return [(f"{small['label']} - ViT at its compute", lead)] if lead else []


def _gap_shrinks(t: Table):
    small, large = smallest_and_largest(t, "hybrid")
    if small is large:
        return []
    # the hybrid's lead over the ViT at its own compute (interpolated in log-compute), at both ends: matched
    lead_small, lead_large = hybrid_lead(t, small), hybrid_lead(t, large)
    if lead_small is None or lead_large is None:
        return []
    return [(f"hybrid lead at {small['label']}'s compute - at {large['label']}'s", combine((1.0, lead_small), (-1.0, lead_large)))]


def _outside_vit(t: Table, rows: list[dict], every: bool = False) -> str:
    """Why no ViT at matched compute exists for these cells (each, or with `every` all of them, outside the
    ViT cells' compute range at this scale, where interpolation cannot reach), '' where one does."""
    vit = sorted(r["flops"] for r in t.where(family="ViT"))
    if not vit or not rows:
        return ""
    outside = [r for r in rows if not vit[0] <= r["flops"] <= vit[-1]]
    if not outside or (every and len(outside) < len(rows)):
        return ""
    labels = ", ".join(r["label"] for r in outside)
    flops = ", ".join(f"{r['flops']:.3g}" for r in outside)
    return (f"{labels} trained with {flops} FLOPs, outside the ViT cells' {vit[0]:.3g}-{vit[-1]:.3g} at this "
            "scale: no ViT at matched compute")


def _small_hybrid_unmatched(t: Table) -> str:
    hybrids = t.where(family="hybrid")
    return _outside_vit(t, smallest_and_largest(t, "hybrid")[:1]) if hybrids else ""


def _resnets_unmatched(t: Table) -> str:
    return _outside_vit(t, t.where(family="ResNet"), every=True)


# How far apart in compute the hybrids must be for "the gap vanishes for larger models" to be testable: two
# doublings (a judgement). Figure 5's hybrids span about an order of magnitude of pre-training compute, from
# R50x1+B/32 to R50x1+L/16; a lead that changes within a factor of 1.6 says nothing of larger models.
GAP_SPAN = 4.0


def _gap_span_too_narrow(t: Table) -> str:
    if not t.where(family="hybrid"):
        return ""
    small, large = smallest_and_largest(t, "hybrid")
    unmatched = _outside_vit(t, [small, large])
    if unmatched:
        return unmatched
    span = large["flops"] / small["flops"]
    return "" if span >= GAP_SPAN else (
        f"the hybrids here span {span:.1f}x in training compute ({small['label']} to {large['label']}), under the "
        f"{GAP_SPAN:g}x (two doublings) a change of the gap with model size needs; Figure 5's span about ten times, "
        "so this scale cannot show it")


def _vit_beats_resnet(t: Table):
    out = []
    for row in t.where(family="ResNet"):
        vit = vit_at(t, row["flops"])
        if vit is not None:
            out.append((f"ViT at {row['label']}'s compute - {row['label']}", combine((1.0, vit), (-1.0, {row["label"]: 1.0}))))
    return out


FINDINGS = (
    Finding("Hybrids beat ViT at small compute", "R50x1+B/16 85.58 vs B/16 84.15", POSITIVE, _hybrids_win_small,
            untestable=_small_hybrid_unmatched),
    Finding("The gap vanishes for larger models", "87.12 both at L/16", POSITIVE, _gap_shrinks,
            untestable=_gap_span_too_narrow),
    Finding("ViT needs less compute than ResNets for the same accuracy", "2-4x", POSITIVE, _vit_beats_resnet,
            untestable=_resnets_unmatched,
            regime="Figure 5 compares models pre-trained on JFT-300M; section 4.3 has the ResNet's inductive biases "
                   "win on small data, and the models here train on orders of magnitude fewer images"),
)


def figure(rows: list[dict], records: list[dict], out: Path) -> list[str]:
    lines_per_family(rows, "family", out / "hybrid.png", "Accuracy vs training compute (Figure 5)")
    return ["hybrid.png"]


SPEC = Ablation(
    name="hybrid",
    title="Hybrid vs ViT vs ResNet at matched compute (Figure 5)",
    cells=cells,
    findings=FINDINGS,
    columns=(("family", "family"), ("size", "size"), ("params_k", "params"), ("compute", "training compute")),
    figure=figure,
)
