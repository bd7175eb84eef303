"""The MLP's nonlinearity (eq. (3)'s MLP "contains two layers with a GELU non-linearity"), by the
names `ViTConfig.act` takes; converters map other libraries' names onto its keys."""

from __future__ import annotations

import torch.nn.functional as F


def gelu(x):
    """Exact (erf) GELU: PyTorch's, timm's, torchvision's, transformers'."""
    return F.gelu(x)


def gelu_tanh(x):
    """GELU's tanh approximation: the official Flax code's nn.gelu."""
    return F.gelu(x, approximate="tanh")


# module-level functions, not lambdas: a model holding one pickles (torch.save(model))
ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh}
