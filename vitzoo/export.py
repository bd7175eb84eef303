"""ONNX: a model as one ONNX file by torch's dynamo exporter, the batch dynamic, the image size the
model's, checked against PyTorch with onnxruntime before it is put in place. Every built-in part
exports (docs/export.md); a model that fails to export or disagrees is an ExportError naming its
parts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from vitzoo.errors import ExportError
from vitzoo.features import FeatureExtractor
from vitzoo.io import atomic_path, naming
from vitzoo.model import Attention, VisionTransformer

ATOL = 1e-4  # what the check allows between onnxruntime's outputs and PyTorch's
PROTOBUF_LIMIT = 2 * 1024**3  # an ONNX file holds at most 2 GiB: larger weights go beside it
INSTALL = "pip install 'vitzoo[onnx]' (onnx, onnxscript, onnxruntime)"


def check_destination(path: Path, force: bool) -> None:
    """Refuse a directory, or an existing file without `force`."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"{path} is a directory; name the .onnx file to "
                                "write", str(path))
    if path.exists() and not force:
        raise FileExistsError(errno.EEXIST, f"{path} exists; choose another path or pass "
                              "force=True (--force) to replace it", str(path))


class Exported:
    """What export_onnx traces and checks: the model, its ViT, its outputs' names."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.vit = model, model.model if isinstance(model, FeatureExtractor) else model
        if not isinstance(self.vit, VisionTransformer):
            raise ExportError("export_onnx exports a vitzoo model or its features_only extractor, "
                              f"got {type(model).__name__}")
        c = self.vit.config
        self.parts = (f"stem={c.stem!r}, pos_embed={c.pos_embed!r} ({c.pos_embed_mode}), "
                      f"pool={c.pool!r}, head={c.head!r}")
        # "logits", or "features_N" per block N of a features_only model
        self.outputs = ([f"features_{i}" for i in model.out_indices]
                        if isinstance(model, FeatureExtractor) else ["logits"])

    def example(self, batch: int) -> torch.Tensor:
        weight = next(self.vit.parameters())
        return torch.randn(batch, self.vit.config.in_chans, *self.vit.config.img_size,
                           device=weight.device, dtype=weight.dtype)

    def trace(self, batch_size: int, opset_version: int | None):
        try:
            import onnxscript  # noqa: F401  (its own ImportError would name torch's internals)
        except ImportError:
            raise ExportError(f"ONNX export needs onnxscript and onnx: {INSTALL}") from None
        attention = [m for m in self.vit.modules() if isinstance(m, Attention)]
        kernels = [m.written_out for m in attention]
        for m in attention:  # torch.export mis-decomposes SDPA with a bias: written out there
            m.written_out = m.relative is not None
        batch = torch.export.Dim("batch", min=1, max=4096)
        try:
            return torch.onnx.export(self.model, (self.example(batch_size),), None, dynamo=True,
                                     verbose=False, input_names=["images"],
                                     output_names=self.outputs, dynamic_shapes=({0: batch},),
                                     opset_version=opset_version)
        except Exception as exc:  # the exporter's errors run to pages: their first line
            first = next((line for line in str(exc).splitlines() if line.strip()), repr(exc))
            raise ExportError(f"torch.onnx.export failed on this model ({self.parts}): "
                              f"{first[:500]}; docs/export.md lists those that export") from exc
        finally:
            for m, kernel in zip(attention, kernels):
                m.written_out = kernel

    def check(self, onnx_path: Path, batch_sizes=(1, 3)) -> float:
        """Run the file in onnxruntime on random images of each batch size; the largest difference
        from PyTorch's outputs, an ExportError above ATOL."""
        try:
            import onnxruntime
        except ImportError:
            raise ExportError(f"checking the export needs onnxruntime: {INSTALL}; or skip the "
                              "check (check=False, --no-check)") from None
        session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        worst = 0.0
        for batch in batch_sizes:
            x = self.example(batch)
            with torch.no_grad():
                expected = self.model(x)
            expected = [expected] if isinstance(expected, torch.Tensor) else expected
            got = session.run(None, {"images": x.cpu().numpy()})
            for name, ours, theirs in zip(self.outputs, expected, got):
                if tuple(theirs.shape) != tuple(ours.shape):
                    raise ExportError(f"the ONNX model's {name} has shape {theirs.shape} for a "
                                      f"batch of {batch}, PyTorch's {tuple(ours.shape)} "
                                      f"({self.parts})")
                worst = max(worst, (torch.from_numpy(theirs) - ours.cpu()).abs().max().item())
        if not worst <= ATOL:
            raise ExportError(f"onnxruntime's outputs differ from PyTorch's by {worst:.3g} (more "
                              f"than {ATOL:g}) on this model ({self.parts}); nothing written")
        return worst


@contextlib.contextmanager
def staged(path: Path):
    """A folder beside `path` to export into; on success its files are put in place atomically,
    the .onnx file last, after the weights file ("NAME.data") it refers to."""
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield stage
        for file in sorted(stage.iterdir(), key=lambda p: p.name == path.name):
            with atomic_path(path.parent / file.name) as tmp:
                os.replace(file, tmp)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def export_onnx(model: nn.Module, path: str | os.PathLike, *, batch_size: int = 2,
                opset_version: int | None = None, check: bool = True, force: bool = False,
                external_data: bool | None = None) -> Path:
    """Write `model` (a vitzoo model, or its features_only extractor) to the ONNX file `path`: the
    input "images" (batch, in_chans, *img_size), the batch dynamic (1 to 4096), outputs "logits"
    or "features_N"; traced in eval mode on a random batch of `batch_size`. `check`: within 1e-4
    of PyTorch's outputs in onnxruntime at batches 1 and 3 before the file is put in place.
    `force` replaces a file; `external_data`: the weights in NAME.data beside it (None: above
    ONNX's 2 GiB limit only). Returns the path."""
    exported, path = Exported(model), Path(path)
    check_destination(path, force)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    dtype = next(exported.vit.parameters()).dtype
    if check and dtype != torch.float32:
        raise ExportError(f"onnxruntime checks float32 models, this one is {dtype}: export "
                          "model.float(), or pass check=False (--no-check)")
    if external_data is None:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        external_data = size > PROTOBUF_LIMIT * 0.9
    was_training = model.training
    model.eval()
    try:
        with staged(path) as stage:  # first: an unwritable path fails before the slow tracing
            exported.trace(batch_size, opset_version).save(stage / path.name,
                                                           external_data=external_data)
            if check:
                exported.check(stage / path.name)
    finally:
        model.train(was_training)
    return path
