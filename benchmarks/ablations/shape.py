"""Transformer shape (Appendix D.2, Figure 8): depth, width, MLP width and patch size scaled from
a base model. The paper: depth helps most, width least; smaller patches help without adding
parameters. A dimension's gain is the slope of accuracy against log2(compute) through the base
and both its scalings; every patch size is compared with the base."""

from __future__ import annotations

import math

from benchmarks.figures import lines_per_family
from benchmarks.spec import Ablation, Cell, Finding, combine, difference

PAPER_BASE = dict(depth=8, embed_dim=1024, mlp_dim=2048, num_heads=16, patch_size=32)  # Figure 8's
SMALLER_PATCH = {28: 4, 128: 16, 224: 16, 32: 4}  # the finer patch tried per input size
LARGER_PATCH = {28: 14, 32: 16}  # Figure 8 tries none larger than its base's 32


def variations(base: dict, quick: bool) -> dict[str, list[dict]]:
    """dimension -> the options that scale it."""
    d, m, depth, heads = base["embed_dim"], base["mlp_dim"], base["depth"], base["num_heads"]
    size = base["img_size"] if isinstance(base["img_size"], int) else base["img_size"][0]
    patches = [p for p in (LARGER_PATCH.get(size), SMALLER_PATCH.get(size))
               if p and p != base["patch_size"]]
    if quick:  # one of each kind of change: the layer stack and the token count
        return {"depth": [{"depth": depth * 2}], "patch": [{"patch_size": patches[0]}]}
    return {"depth": [{"depth": max(1, depth // 2)}, {"depth": depth * 2}],
            "width": [{"embed_dim": d // 2, "num_heads": max(1, heads // 2)},
                      {"embed_dim": d * 2, "num_heads": heads * 2}],
            "mlp": [{"mlp_dim": m // 2}, {"mlp_dim": m * 2}],
            "patch": [{"patch_size": p} for p in patches]}


def cells(scale) -> list[Cell]:
    base = {**scale.model, **PAPER_BASE} if scale.cells == "paper" else dict(scale.model)
    out = [Cell("base", {"dimension": "base", "value": "-"}, base)]
    for dimension, options_list in variations(base, scale.name == "quick").items():
        for options in options_list:
            value = next(iter(options.values()))
            out.append(Cell(f"{dimension} {value}", {"dimension": dimension, "value": value},
                            {**base, **options}))
    return out


def gain_per_doubling(t, dimension: str) -> dict[str, float] | None:
    """The least-squares slope of accuracy against x = log2(compute / the base's) through the base
    and this dimension's scalings: weights (x_i - mean x) / sum (x_i - mean x)^2."""
    base = t.by_label.get("base")
    rows = [r for r in t.where(dimension=dimension)
            if base and "flops" in r and abs(r["flops"] / base["flops"] - 1) > 0.05]
    if not rows:
        return None
    points = [(math.log2(r["flops"] / base["flops"]), r["label"]) for r in rows] + [(0.0, "base")]
    centre = sum(x for x, _ in points) / len(points)
    spread = sum((x - centre) ** 2 for x, _ in points)
    return combine(*(((x - centre) / spread, {label: 1.0}) for x, label in points))


def compare_gains(pairs: list[tuple[str, str]]):
    def contrasts(t):
        gains = {d: gain_per_doubling(t, d) for d in ("depth", "width", "mlp")}
        return [(f"gain per doubling (slope through every scaling): {a} - {b}",
                 combine((1.0, gains[a]), (-1.0, gains[b])))
                for a, b in pairs if gains[a] and gains[b]]
    return contrasts


def smaller_patch(t):
    """Every patch size tried against the base, the finer (more tokens) minus the coarser."""
    base = t.by_label.get("base")
    out = []
    for r in t.where(dimension="patch") if base else []:
        finer, coarser = ((r["label"], "base") if r["flops"] > base["flops"]
                          else ("base", r["label"]))
        out.append((f"{finer} - {coarser}", difference(finer, coarser)))
    return out


def figure(rows, records, out) -> list[str]:
    base = next(r for r in rows if r["dimension"] == "base")
    lines = [dict(r, family=r["dimension"], relative=r["flops"] / base["flops"])
             for r in rows if r["dimension"] != "base"]
    lines += [dict(base, family=d, relative=1.0) for d in {r["family"] for r in lines}]
    return lines_per_family(lines, out / "shape.png",
                            "Scaling one dimension of the base (Figure 8)", x_key="relative",
                            x_label="training compute relative to the base")


SPEC = Ablation(
    name="shape",
    title="Transformer shape (Appendix D.2, Figure 8)",
    cells=cells,
    findings=(
        Finding("Depth helps most", "Figure 8: the largest gain per compute",
                compare_gains([("depth", "width"), ("depth", "mlp")])),
        Finding("Width helps least", "Figure 8: the smallest gain per compute",
                compare_gains([("mlp", "width"), ("depth", "width")])),
        Finding("Smaller patches help, without adding parameters", "Figure 8", smaller_patch),
    ),
    columns=(("dimension", "scaled"), ("value", "to"), ("params_k", "params"),
             ("compute", "training compute")),
    figure=figure,
)
