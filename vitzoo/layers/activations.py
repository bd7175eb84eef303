"""The MLP's nonlinearity: the one table of activations vitzoo knows (eq. (3)'s MLP "contains two
layers with a GELU non-linearity"), by the names `ViTConfig.act` takes (`vitzoo.config.ACTIVATIONS`).
The encoder takes its function from it; converters map other libraries' names onto its keys."""

from __future__ import annotations

import torch.nn.functional as F

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact (erf): PyTorch, timm, torchvision, transformers
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # the official Flax code's nn.gelu
}
