"""The paper's ablations, every one registered in this one place: its spec says the rest (cells,
findings, figures); the framework that plans, runs and judges them is the rest of `benchmarks/`.

An ablation goes by one name, its spec's `name`: typed on the command line (`python -m benchmarks
inspect`), the folder of its results (`benchmarks/results/inspect/`) and part of every run's key. A
module is named after what it measures, beginning with that name where the name alone would collide:
`data` is `data_size.py` (not to be read as `vitzoo.data`), `inspect` is `inspect_vit.py` (the paper's
"Inspecting Vision Transformer"; it draws on `vitzoo.analysis`, and the standard library's `inspect`
stays unshadowed).
"""

from __future__ import annotations

from benchmarks.ablations import cost, data_size, head, hybrid, inspect_vit, pos_embed, shape, transfer
from benchmarks.spec import Ablation

ABLATIONS: dict[str, Ablation] = {spec.name: spec for spec in (
    pos_embed.SPEC, head.SPEC, hybrid.SPEC, shape.SPEC, data_size.SPEC, cost.SPEC, inspect_vit.SPEC, transfer.SPEC,
)}
