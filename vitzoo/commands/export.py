"""`vitzoo export MODEL OUT.onnx`: a model as an ONNX file (vitzoo.export_onnx), checked. MODEL is
what predict's --model takes: a tag, a model name (its default tag's weights; with --no-weights its
architecture, randomly initialised), a saved model's directory or file, or a Hub repo."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vitzoo.weights.layout import HUB_PREFIX


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a model as an ONNX file (dynamic batch), checked with "
                                      "onnxruntime")
    p.add_argument("model", metavar="MODEL", help="a tag MODEL.TAG[@REVISION], a model name (its "
                   "default tag's weights), a saved model's directory or file, or a Hub repo "
                   f"{HUB_PREFIX}ORG/NAME[@REVISION]")
    p.add_argument("output", metavar="OUT.onnx", help="the ONNX file to write (atomically)")
    p.add_argument("--no-weights", action="store_true",
                   help="a model name's architecture with random weights (no download)")
    p.add_argument("--img-size", type=int, default=None,
                   help="the resolution the graph takes (default the model's)")
    p.add_argument("--batch-size", type=int, default=2,
                   help="the batch of the traced example (any batch runs; default 2)")
    p.add_argument("--opset", type=int, default=None, help="the ONNX opset (default: torch's)")
    p.add_argument("--external-data", action="store_true",
                   help="the weights in OUT.onnx.data beside it (always above ONNX's 2 GiB)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the onnxruntime check against PyTorch's outputs")
    p.add_argument("--force", action="store_true", help="replace OUT.onnx if it exists")
    p.set_defaults(func=run_export)


def load(name: str, no_weights: bool, options: dict):
    """The model MODEL names, as the command line reads it."""
    import vitzoo

    weights = os.path.exists(name) or name.startswith(HUB_PREFIX)
    if no_weights and weights:
        raise ValueError(f"--no-weights builds a named model's architecture; {name!r} is weights "
                         "to load: drop --no-weights, or name a model (vitzoo list)")
    if no_weights:
        return vitzoo.create(name, **options)
    if weights:
        return vitzoo.from_pretrained(name, **options)
    return vitzoo.create(name, pretrained=True, **options)


def run_export(args) -> int:
    from vitzoo.export import check_destination, export_onnx

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    check_destination(Path(args.output), args.force)  # before any download or build
    options = {"img_size": args.img_size} if args.img_size is not None else {}
    model = load(args.model, args.no_weights, options)
    path = export_onnx(model, args.output, batch_size=args.batch_size, opset_version=args.opset,
                       check=not args.no_check, force=args.force,
                       external_data=args.external_data)
    checked = ("not checked" if args.no_check
               else "onnxruntime agrees with PyTorch within 1e-4 at batch 1 and 3")
    size = "x".join(map(str, (model.config.in_chans, *model.config.img_size)))
    print(f"{path}: {size} images, dynamic batch; {checked}")
    return 0
