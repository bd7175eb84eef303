"""ONNX: a model written as one ONNX file through torch's exporter, the batch dimension dynamic, and
checked against PyTorch with onnxruntime before it is put in place.

The exporter is torch.onnx.export(..., dynamo=True): torch.export traces the model into one graph
(vitzoo's forward takes one path for any batch while it traces: `vitzoo.tracing`), which onnxscript
translates. The image size is the model's img_size, fixed in the graph. Every built-in part exports
(docs/export.md lists what was checked, with which versions); a model that fails to export or
disagrees with PyTorch is an ExportError naming its parts.
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
from vitzoo.model import VisionTransformer

ATOL = 1e-4  # what the check allows between onnxruntime's outputs and PyTorch's
PROTOBUF_LIMIT = 2 * 1024**3  # an ONNX file holds at most 2 GiB: larger weights go beside it
INPUT_NAME = "images"
INSTALL = "pip install 'vitzoo[onnx]' (onnx, onnxscript, onnxruntime)"


def _parts(model: nn.Module) -> VisionTransformer:
    vit = model.model if isinstance(model, FeatureExtractor) else model
    if not isinstance(vit, VisionTransformer):
        raise ExportError("export_onnx exports a vitzoo model (vitzoo.create, "
                          "vitzoo.from_pretrained) or its features_only extractor, got "
                          f"{type(model).__name__}")
    return vit


def _describe(vit: VisionTransformer) -> str:
    c = vit.config
    return (f"stem={c.stem!r}, pos_embed={c.pos_embed!r} ({c.pos_embed_mode}), "
            f"pool={c.pool!r}, head={c.head!r}")


def output_names(model: nn.Module) -> list[str]:
    """The ONNX graph's outputs: "logits", or "features_N" per block N of a features_only model."""
    if isinstance(model, FeatureExtractor):
        return [f"features_{i}" for i in model.out_indices]
    return ["logits"]


def _example(vit: VisionTransformer, batch: int) -> torch.Tensor:
    weight = next(vit.parameters())
    return torch.randn(batch, vit.config.in_chans, *vit.config.img_size, device=weight.device,
                       dtype=weight.dtype)


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def check_destination(path: Path, force: bool) -> None:
    """Refuse a path export_onnx does not write: a directory, or an existing file (no `force`)."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR,
                                f"{path} is a directory; name the .onnx file to write", str(path))
    if path.exists() and not force:
        raise FileExistsError(errno.EEXIST,
                              f"{path} exists; choose another path or pass force=True (--force) to "
                              "replace it", str(path))


def _trace(model: nn.Module, vit: VisionTransformer, batch_size: int, opset_version: int | None):
    try:
        # the dynamo exporter's translator; its own ImportError would name torch's internals
        import onnxscript  # noqa: F401
    except ImportError:
        raise ExportError(f"ONNX export needs onnxscript and onnx: {INSTALL}") from None
    batch = torch.export.Dim("batch", min=1, max=4096)
    try:
        return torch.onnx.export(model, (_example(vit, batch_size),), None, dynamo=True,
                                 verbose=False, dynamic_shapes=({0: batch},),
                                 input_names=[INPUT_NAME], output_names=output_names(model),
                                 opset_version=opset_version)
    except Exception as exc:  # the exporter's errors run to pages: its summary, and what exports
        summary = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ExportError(f"torch.onnx.export failed on this model ({_describe(vit)}): "
                          f"{summary[:500]}; docs/export.md lists the models that export") from exc


def check_with_onnxruntime(model: nn.Module, onnx_path: str | os.PathLike, batch_sizes=(1, 3),
                           atol: float = ATOL) -> float:
    """Run the ONNX file with onnxruntime on random images of each batch size and compare every
    output with the PyTorch model's; returns the largest difference, an ExportError above `atol`."""
    try:
        import onnxruntime
    except ImportError:
        raise ExportError(f"checking the export needs onnxruntime: {INSTALL}; or skip the check "
                          "(check=False, --no-check)") from None
    vit = _parts(model)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in batch_sizes:
        x = _example(vit, batch)
        with torch.no_grad():
            expected = _outputs(model(x))
        got = session.run(None, {INPUT_NAME: x.cpu().numpy()})
        for name, ours, theirs in zip(output_names(model), expected, got):
            if tuple(theirs.shape) != tuple(ours.shape):
                raise ExportError(f"the ONNX model's {name} has shape {tuple(theirs.shape)} for a "
                                  f"batch of {batch}, PyTorch's {tuple(ours.shape)} "
                                  f"({_describe(vit)})")
            worst = max(worst, (torch.from_numpy(theirs) - ours.cpu()).abs().max().item())
    if not worst <= atol:
        raise ExportError(f"onnxruntime's outputs differ from PyTorch's by {worst:.3g} (more than "
                          f"{atol:g}) on this model ({_describe(vit)}); the file was not written")
    return worst


@contextlib.contextmanager
def _staged(path: Path):
    """A folder beside `path` to write the export into; what it holds on success is put in place,
    each file atomically (`vitzoo.io.atomic_path`) and the .onnx file last, so that its external
    weights file ("NAME.data") is in place before the file that refers to it."""
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
    """Write `model` (a vitzoo model, or a `features_only` extractor) to the ONNX file `path` with
    torch's dynamo exporter: one input "images" (batch, in_chans, *img_size), the batch dynamic (1
    to 4096), the image size fixed at the model's img_size; outputs as `output_names` says. Traced
    in eval mode on a random batch of `batch_size`, in the model's dtype and device. `check`:
    onnxruntime runs the file on batches of 1 and 3, whose outputs must be within 1e-4 of PyTorch's,
    before the file is put in place (atomically, `vitzoo.io`). An existing file is replaced only
    with `force`. `external_data`: the weights in a file NAME.data beside it; None does so only
    above ONNX's 2 GiB limit. Returns the path."""
    vit = _parts(model)
    path = Path(path)
    check_destination(path, force)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError("batch_size must be a positive int (the traced example's batch), got "
                         f"{batch_size!r}")
    weight = next(vit.parameters())
    if check and weight.dtype != torch.float32:
        raise ExportError("onnxruntime checks float32 models; this one's weights are "
                          f"{weight.dtype}: export model.float(), or pass check=False (--no-check)")
    if external_data is None:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        external_data = size > PROTOBUF_LIMIT * 0.9
    was_training = model.training
    model.eval()
    try:
        with _staged(path) as stage:  # first: an unwritable path fails before the slow tracing
            program = _trace(model, vit, batch_size, opset_version)
            program.save(stage / path.name, external_data=external_data)
            if check:
                check_with_onnxruntime(model, stage / path.name)
    finally:
        model.train(was_training)
    return path


__all__ = ["ATOL", "check_destination", "check_with_onnxruntime", "export_onnx", "output_names"]
