"""Whether torch.fx is tracing the model (torchvision's `create_feature_extractor`): its inputs
are then Proxies, on which a Python-side check of a shape or a device cannot be answered.
"""

from __future__ import annotations

from torch.fx._symbolic_trace import is_fx_symbolic_tracing


def fx_tracing() -> bool:
    """Whether torch.fx's symbolic tracer is running the model (not torch.export, whose inputs have
    shapes)."""
    return is_fx_symbolic_tracing()
