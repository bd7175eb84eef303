"""ONNX: a model as one ONNX file by torch's dynamo exporter, the batch dynamic, the image size the
model's, checked against PyTorch with onnxruntime before it is put in place (docs/export.md).
"""

from __future__ import annotations

import errno
import os
import tempfile
from importlib.util import find_spec
from pathlib import Path

import torch
from torch import nn

from vitzoo.features import FeatureExtractor
from vitzoo.io import atomic_path
from vitzoo.model import Attention, VisionTransformer

ATOL = 1e-4  # what the check allows between onnxruntime's outputs and PyTorch's


def check_destination(path: Path, force: bool) -> None:
    """Refuse an existing file without `force`."""
    if path.exists() and not force:
        raise FileExistsError(errno.EEXIST, f"{path} exists; choose another path or pass "
                              "force=True (--force) to replace it", str(path))


def random_images(vit: VisionTransformer, batch: int) -> torch.Tensor:
    weight = next(vit.parameters())
    return torch.randn(batch, vit.config.in_chans, *vit.config.img_size, device=weight.device,
                       dtype=weight.dtype)


def trace(model: nn.Module, vit: VisionTransformer, batch_size: int, opset_version: int | None):
    outputs = ([f"features_{i}" for i in model.out_indices]  # per block N of a features_only model
               if isinstance(model, FeatureExtractor) else ["logits"])
    attention = [m for m in vit.modules() if isinstance(m, Attention)]
    kernels = [m.written_out for m in attention]
    for m in attention:  # torch.export mis-decomposes SDPA with a bias: written out there
        m.written_out = m.relative is not None
    try:
        return torch.onnx.export(model, (random_images(vit, batch_size),), None, dynamo=True,
                                 verbose=False, input_names=["images"], output_names=outputs,
                                 dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
                                 opset_version=opset_version)
    finally:
        for m, kernel in zip(attention, kernels):
            m.written_out = kernel


def compare(model: nn.Module, vit: VisionTransformer, onnx_path: Path) -> None:
    """Run the file in onnxruntime at batches 1 and 3: within ATOL of PyTorch's outputs."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = random_images(vit, batch)
        with torch.no_grad():
            expected = model(x)
        expected = [expected] if isinstance(expected, torch.Tensor) else expected
        for ours, theirs in zip(expected, session.run(None, {"images": x.cpu().numpy()})):
            worst = (torch.from_numpy(theirs) - ours.cpu()).abs().max().item()
            if not worst <= ATOL:
                raise RuntimeError(f"onnxruntime's outputs differ from PyTorch's by {worst:.3g} "
                                   f"(more than {ATOL:g}); nothing written")


def export_onnx(model: nn.Module, path: str | os.PathLike, *, batch_size: int = 2,
                opset_version: int | None = None, check: bool = True, force: bool = False,
                external_data: bool = False) -> Path:
    """Write `model` (a vitzoo model, or its features_only extractor) to the ONNX file `path`: the
    input "images" (batch, in_chans, *img_size), the batch dynamic (1 to 4096), outputs "logits"
    or "features_N"; traced in eval mode on a random batch of `batch_size`. `check`: onnxruntime
    agrees with PyTorch (ATOL) before the file is put in place. `force` replaces a file;
    `external_data`: the weights in NAME.data beside it (torch's exporter does so above 2 GiB)."""
    path, vit = Path(path), model.model if isinstance(model, FeatureExtractor) else model
    if not isinstance(vit, VisionTransformer):
        raise TypeError(f"export_onnx exports a vitzoo model, got {type(model).__name__}")
    if check and next(vit.parameters()).dtype != torch.float32:
        raise ValueError("onnxruntime checks float32 models: export model.float(), or pass "
                         "check=False (--no-check)")
    missing = [m for m in ("onnxscript", "onnxruntime")[:1 + check] if not find_spec(m)]
    if missing:
        raise RuntimeError(f"ONNX export needs {' and '.join(missing)}: pip install 'vitzoo[onnx]'")
    check_destination(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)  # an unwritable path fails before tracing
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as stage:
        staged, was_training = Path(stage) / path.name, model.training
        try:
            model.eval()
            trace(model, vit, batch_size, opset_version).save(
                staged, external_data=external_data)
            if check:
                compare(model, vit, staged)
        finally:
            model.train(was_training)
        # the weights ("NAME.data") first, then the .onnx file that refers to them
        for file in sorted(Path(stage).iterdir(), key=lambda p: p == staged):
            with atomic_path(path.parent / file.name) as tmp:
                os.replace(file, tmp)
    return path
