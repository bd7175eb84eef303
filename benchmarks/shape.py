"""Transformer shape (paper Appendix D.2, Figure 8): scale depth, width, MLP width and patch size from
a base model; accuracy against compute relative to the base."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import metrics_table, scatter_compute, summary_rows
from benchmarks.suite import Run
from benchmarks.training import scale_settings

NAME = "shape"
# Figure 8's base: 8 layers, D 1024, MLP 2048, patch 32; CPU base: the CPU scale's model
PAPER_BASE = dict(depth=8, embed_dim=1024, mlp_dim=2048, num_heads=16, patch_size=32)


def variations(base: dict, quick: bool) -> dict[str, list[dict]]:
    """dimension -> options that scale it (the base itself is its own row)."""
    d, m, p, depth = base["embed_dim"], base["mlp_dim"], base["patch_size"], base["depth"]
    factors = (2,) if quick else (0.5, 2)
    patches = [q for q in {28: [7, 2], 224: [16, 64], 32: [8, 2]}.get(base["img_size"], [p * 2]) if q != p]
    if quick:
        patches = patches[:1]
    if quick:  # one dimension of each kind of change: the layer stack and the token count
        return {"depth": [{"depth": depth * 2}], "patch": [{"patch_size": q} for q in patches]}
    return {
        "depth": [{"depth": max(1, int(depth * f))} for f in factors],
        "width": [{"embed_dim": int(d * f), "num_heads": max(1, base["num_heads"] * int(d * f) // d)} for f in factors],
        "mlp": [{"mlp_dim": int(m * f)} for f in factors],
        "patch": [{"patch_size": q} for q in patches],
    }


def plan(scale: str, quick: bool, data=None, data_dir=None) -> list[Run]:
    model, train = scale_settings(scale, quick, data, data_dir, costly=True)
    if scale == "paper" and not quick:
        model.update(PAPER_BASE)
    seeds = range(1 if quick else 2)
    runs = [Run(NAME, "base", {"model": "vit_ti16", "options": model, "train": train}, s, {"dimension": "base", "value": "-"})
            for s in seeds]
    for dimension, options_list in variations(model, quick).items():
        for options in options_list:
            value = next(iter(options.values()))
            runs += [Run(NAME, f"{dimension} {value}", {"model": "vit_ti16", "options": {**model, **options}, "train": train}, s,
                         {"dimension": dimension, "value": value}) for s in seeds]
    return runs


def report(records: list[dict], out: Path) -> str:
    rows = summary_rows(records)
    base = next(r for r in rows if r["dimension"] == "base")
    base["patch_size"] = next(r for r in records if r["label"] == "base")["config"]["options"]["patch_size"]
    for row in rows:
        row["relative_compute"] = row["flops"] / base["flops"]
        row["compute"] = f"{row['relative_compute']:.2f}x"
    table = metrics_table(rows, [("dimension", "scaled"), ("value", "to"), ("compute", "compute vs base")])
    lines = [dict(r, family=r["dimension"]) for r in rows if r["dimension"] != "base"]
    for dim in {r["family"] for r in lines}:
        lines.append(dict(base, family=dim))
    scatter_compute(lines, "family", out / "shape.png", "Scaling one dimension of the base (Figure 8)", x_key="relative_compute")
    return table + "\n\n" + "\n".join(findings(rows, base))


def findings(rows: list[dict], base: dict) -> list[str]:
    def gain(dimension: str) -> float | None:
        """Accuracy gained per doubling of compute when scaling up this dimension."""
        import math

        up = [r for r in rows if r["dimension"] == dimension and r["relative_compute"] > 1.05]
        if not up:
            return None
        best = max(up, key=lambda r: r["relative_compute"])
        return (best["test_acc"] - base["test_acc"]) / math.log2(best["relative_compute"])

    gains = {d: gain(d) for d in ("depth", "width", "mlp")}
    known = {d: g for d, g in gains.items() if g is not None}
    out = []
    if len(known) == 3:
        order = sorted(known, key=known.get, reverse=True)
        out.append(
            "- *Depth helps most, width least* (paper): "
            + ("**reproduced**" if order[0] == "depth" and order[-1] == "width" else "**not reproduced**")
            + " at this scale; accuracy gained per doubling of compute: "
            + ", ".join(f"{d} {known[d]:+.4f}" for d in order) + "."
        )
    smaller = [r for r in rows if r["dimension"] == "patch" and isinstance(r["value"], int) and r["value"] < base.get("patch_size", 1e9)]
    if smaller:
        r = min(smaller, key=lambda r: r["value"])
        out.append(
            "- *Smaller patches help, without adding parameters* (paper): "
            + ("**reproduced**" if r["test_acc"] > base["test_acc"] else "**not reproduced**")
            + f": patch {r['value']} reaches {r['test_acc']:.4f} vs base {base['test_acc']:.4f}, "
            f"with {r['params'] - base['params']:+d} parameters (the patch projection and position embeddings)."
        )
    return out
