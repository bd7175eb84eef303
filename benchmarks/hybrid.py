"""Hybrid against ViT against ResNet at matched compute (paper Figure 5, Table 6): three sizes of each
family, accuracy against training compute in FLOPs (counted with torch.utils.flop_counter).

The ResNet family is the hybrid's own BiT ResNet (weight-standardized convs, GroupNorm) pooled and
classified directly: `depth=0`, i.e. no Transformer layer after the stem.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import metrics_table, scatter_compute, summary_rows
from benchmarks.suite import Run
from benchmarks.training import scale_settings

NAME = "hybrid"


def families(scale: str, quick: bool) -> dict[str, list[tuple[str, str, dict]]]:
    """family -> [(size label, zoo name, options)]"""
    if scale == "paper" and not quick:
        return {
            "ViT": [("B/32", "vit_b32", {}), ("B/16", "vit_b16", {}), ("L/16", "vit_l16", {})],
            "hybrid": [("R26+S/32", "vit_s32_r26_hybrid", {}), ("R50+B/16", "vit_b16_hybrid", {}), ("R50+L/16", "vit_l16_hybrid", {})],
            "ResNet": [(f"R{n}", "vit_b16_hybrid", {"resnet_layers": layers, "depth": 0, "pos_embed": "none", "pool": "gap"})
                       for n, layers in (("26", (2, 2, 2, 2)), ("50", (3, 4, 6, 3)), ("101", (3, 4, 23, 3)))],
        }
    widths = [(32, 2)] if quick else [(32, 2), (64, 4), (128, 4)]
    depth = 1 if quick else 4
    vit = [(f"D{d}", "vit_ti16", {"embed_dim": d, "num_heads": h, "mlp_dim": 2 * d, "depth": depth, "patch_size": 4}) for d, h in widths]
    hybrid = [(f"R+D{d}", "vit_ti16", {"embed_dim": d, "num_heads": h, "mlp_dim": 2 * d, "depth": depth, "stem": "resnet",
                                         "resnet_layers": (1,), "patch_size": 1}) for d, h in widths]
    stages = [(1,)] if quick else [(1,), (1, 1), (2, 2)]
    resnet = [(f"R{'-'.join(map(str, s))}", "vit_ti16", {"embed_dim": 64, "num_heads": 4, "depth": 0, "stem": "resnet",
                                                          "resnet_layers": s, "patch_size": 1, "pos_embed": "none", "pool": "gap"})
              for s in stages]
    return {"ViT": vit, "hybrid": hybrid, "ResNet": resnet}


def plan(scale: str, quick: bool, data=None, data_dir=None) -> list[Run]:
    model, train = scale_settings(scale, quick, data, data_dir, costly=True)
    if scale == "cpu" or quick:
        model["img_size"] = 32  # divisible by the ResNets' strides (4 and 8)
    seeds = range(1 if quick else 2)
    return [
        Run(NAME, f"{family} {size}", {"model": name, "options": {**model, **options}, "train": train}, seed,
            {"family": family, "size": size})
        for family, sizes in families(scale, quick).items() for size, name, options in sizes for seed in seeds
    ]


def report(records: list[dict], out: Path) -> str:
    rows = sorted(summary_rows(records), key=lambda r: (r["family"], r["flops"]))
    for row in rows:
        row["gflops"] = f"{row['flops'] / 1e12:.2f} TFLOP"
        row["params_k"] = f"{row['params'] / 1e3:.0f}k"
    table = metrics_table(rows, [("family", "family"), ("size", "size"), ("params_k", "params"), ("gflops", "training compute")])
    scatter_compute(rows, "family", out / "hybrid.png", "Accuracy vs training compute (Figure 5)")
    return table + "\n\n" + "\n".join(findings(rows))


def _interpolate(rows: list[dict], flops: float) -> float | None:
    """Accuracy of a family at `flops`, linear in log-compute between its points."""
    import math

    pts = sorted((r["flops"], r["test_acc"]) for r in rows)
    for (f0, a0), (f1, a1) in zip(pts, pts[1:]):
        if f0 <= flops <= f1:
            t = (math.log(flops) - math.log(f0)) / (math.log(f1) - math.log(f0)) if f1 > f0 else 0.0
            return a0 + t * (a1 - a0)
    return None


def findings(rows: list[dict]) -> list[str]:
    fam = {f: [r for r in rows if r["family"] == f] for f in ("ViT", "hybrid", "ResNet")}
    out = []
    if fam["ViT"] and fam["hybrid"]:
        small_h = min(fam["hybrid"], key=lambda r: r["flops"])
        vit_there = _interpolate(fam["ViT"], small_h["flops"])
        nearest = min(fam["ViT"], key=lambda r: abs(r["flops"] - small_h["flops"]))
        ref = vit_there if vit_there is not None else nearest["test_acc"]
        out.append(
            "- *Hybrids beat ViT at small compute* (paper: R50x1+B/16 85.58 vs B/16 84.15): "
            + ("**reproduced**" if small_h["test_acc"] > ref else "**not reproduced**")
            + f": smallest hybrid {small_h['test_acc']:.4f} at {small_h['flops']:.2e} FLOPs vs ViT {ref:.4f} at that compute."
        )
        big_h = max(fam["hybrid"], key=lambda r: r["flops"])
        big_v = max(fam["ViT"], key=lambda r: r["flops"])
        gap_small = small_h["test_acc"] - ref
        gap_big = big_h["test_acc"] - big_v["test_acc"]
        out.append(
            "- *The gap vanishes for larger models* (paper: 87.12 both at L/16): "
            + ("**reproduced**" if gap_big < gap_small else "**not reproduced**")
            + f": hybrid minus ViT {gap_small:+.4f} at the small end, {gap_big:+.4f} at the large end."
        )
    if fam["ViT"] and fam["ResNet"]:
        better = sum(1 for r in fam["ResNet"] if (_interpolate(fam["ViT"], r["flops"]) or -1) > r["test_acc"])
        comparable = sum(1 for r in fam["ResNet"] if _interpolate(fam["ViT"], r["flops"]) is not None)
        out.append(
            "- *ViT needs less compute than ResNets for the same accuracy* (paper: 2-4x): "
            + ("**reproduced**" if comparable and better == comparable else "**not reproduced**" if comparable else "**not testable**")
            + f": at {comparable} ResNet compute points inside the ViT range, ViT is more accurate at {better}."
        )
    return out
