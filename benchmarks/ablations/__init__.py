"""The paper's ablations, one spec each, registered by the name typed on the command line (`data`
is data_size.py, `inspect` is inspect_vit.py): the name of its results folder and part of every
run's key."""

from __future__ import annotations

from benchmarks.ablations import (cost, data_size, head, hybrid, inspect_vit, pos_embed, shape,
                                  transfer)

ABLATIONS = {spec.name: spec for spec in (pos_embed.SPEC, head.SPEC, hybrid.SPEC, shape.SPEC,
                                          data_size.SPEC, cost.SPEC, inspect_vit.SPEC,
                                          transfer.SPEC)}
