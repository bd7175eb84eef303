"""What the speed benchmark measures: the cases (vitzoo and its peers, timm and torchvision, holding the
same weights, read through vitzoo's converters and checked on their logits), the precisions, the names
of the compiled contestants, and the training step every contestant takes."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import vitzoo
from vitzoo import precision
from vitzoo.precision import autocast

# the compiled training step of a model that stores its attention probabilities (bf16 on the CPU)
STORED_PROBABILITIES = "vitzoo+compile+stored_probabilities"


def compiled_training_step(contestant: str) -> bool:
    """Whether a training contestant is vitzoo's compiled step (with AdamW's fused kernel, as `vitzoo
    train --compile` has it), with or without stored attention probabilities."""
    return contestant.startswith("vitzoo+compile")


# the records' names of the precisions (float32 by its long name, as the first records had it)
DTYPES = {"float32": None, **{flag: dtype for flag, dtype in precision.FIXED.items() if dtype is not None}}


def precisions(device: torch.device) -> dict[str, torch.dtype | None]:
    """The precisions measured on `device`: float32, and the device's half precision by
    `vitzoo.precision.half_of` (bf16; fp16 on a GPU that only emulates bf16, such as a T4 or a V100)."""
    half = precision.half_of(device)
    return {name: dtype for name, dtype in DTYPES.items() if dtype is None or dtype == half}


@dataclass
class Case:
    vitzoo_name: str
    peers: dict[str, Callable[[], torch.nn.Module]]  # library -> builder of the peer model
    img_size: int = 224
    options: dict | None = None  # vitzoo options (quick runs use small models)


def timm_model(name: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        import timm

        return timm.create_model(name, **kwargs)

    return build


def torchvision_model(name: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        import torchvision

        return getattr(torchvision.models, name)(**kwargs)

    return build


def cases(quick: bool) -> dict[str, list[Case]]:
    if quick:  # small stand-ins with the same structure, so that the test of this script is fast
        small = dict(embed_dim=192, depth=2, num_heads=3)
        vit = Case("vit_ti16", {"timm": timm_model("vit_tiny_patch16_224", depth=2, img_size=64),
                                "torchvision": torchvision_model("VisionTransformer", image_size=64, patch_size=16, num_layers=2,
                                                                 num_heads=3, hidden_dim=192, mlp_dim=768)}, 64, small)
        return {"inference": [vit], "training": [vit]}
    vit_b16 = Case("vit_b16", {"timm": timm_model("vit_base_patch16_224"), "torchvision": torchvision_model("vit_b_16")})
    # (timm's default weights tag for this hybrid has no classifier: ask for ImageNet's 1000 classes)
    hybrid = Case("vit_b16_hybrid", {"timm": timm_model("vit_base_r50_s16_224", num_classes=1000)})
    vit_s16 = Case("vit_s16", {"timm": timm_model("vit_small_patch16_224")})
    return {"inference": [vit_b16, hybrid], "training": [vit_s16, hybrid]}


def converted(peer: torch.nn.Module, case: Case) -> torch.nn.Module:
    """vitzoo holding the peer's weights, read through vitzoo's own converters."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peer.pth"
        torch.save(peer.state_dict(), path)
        return vitzoo.create(case.vitzoo_name, pretrained=path, img_size=case.img_size, **(case.options or {}))



def check_parity(peer, model, x) -> float:
    with torch.inference_mode():
        return (peer.eval()(x) - model.eval()(x)).abs().max().item()


def train_step_fn(model: torch.nn.Module, batch: int, img_size: int, dtype: torch.dtype | None, device: torch.device,
                  fused: bool = False):
    """One training step of `model`; `fused`: AdamW's fused kernel (one pass over every parameter), as
    `vitzoo train` uses it, for the fast path; the eager contestants all take PyTorch's default."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {}))
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)

    def step():
        with autocast(device, dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step

