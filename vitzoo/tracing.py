"""Whether the model is being traced into a graph rather than run: torch.fx's symbolic tracing (torchvision's
`create_feature_extractor`) hands the model Proxies, on which Python-side checks of a shape or a device
cannot be answered, and torch.export (the ONNX exporter's first step) wants one graph for every batch size.
"""

from __future__ import annotations

import torch
from torch.fx._symbolic_trace import is_fx_symbolic_tracing


def fx_tracing() -> bool:
    """Whether torch.fx's symbolic tracer is running the model (its inputs are Proxies, not tensors)."""
    return is_fx_symbolic_tracing()  # (is_fx_tracing is true under torch.export too)


def exporting() -> bool:
    """Whether torch.export (or the ONNX exporter through it) is tracing the model."""
    return torch.compiler.is_exporting()


def traced() -> bool:
    """Either: the model must take one path whatever the input's batch size or device."""
    return fx_tracing() or exporting()


__all__ = ["exporting", "fx_tracing", "traced"]
