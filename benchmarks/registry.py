"""Every ablation, registered in this one place: its spec says the rest (cells, findings, figures)."""

from __future__ import annotations

from benchmarks import cost, data, head, hybrid, inspection, pos_embed, shape
from benchmarks.spec import Ablation

ABLATIONS: dict[str, Ablation] = {spec.name: spec for spec in (
    pos_embed.SPEC, head.SPEC, hybrid.SPEC, shape.SPEC, data.SPEC, cost.SPEC, inspection.SPEC,
)}
