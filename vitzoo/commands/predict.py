"""`vitzoo predict IMAGE... --model MODEL[.TAG][@REVISION] | DIR | hf-hub:ORG/NAME [--top K]
[--json]`: classify images preprocessed as the weights expect, naming classes as they do."""

from __future__ import annotations

import argparse
import json
import os

import torch

from vitzoo.argvalues import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="classify images with pretrained weights: the top-k labels "
                                       "and probabilities")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="8-bit image files (any format Pillow reads)")
    p.add_argument("--model", required=True,
                   help="a pretrained tag MODEL.TAG[@REVISION] (`vitzoo list --pretrained`), a "
                        "model for its default tag, a saved model's directory, or a Hub repo "
                        "hf-hub:ORG/NAME[@REVISION]")
    p.add_argument("--top", default=5, type=positive_int, metavar="K",
                   help="how many classes to show per image")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_predict)


def read_image(path: str):
    """An image file as an RGB PIL image; a ValueError naming it otherwise (one of more than 8
    bits too: convert("RGB") would clip it)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            if image.mode in ("I", "F") or image.mode.startswith("I;16"):
                raise ValueError(f"its pixels are of mode {image.mode}: save it as an 8-bit image")
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"cannot read image {path!r}: {exc}") from None


def predict(model, labels: list[str], images: list[str], top: int) -> list[dict]:
    from vitzoo import transforms_for

    transform = transforms_for(model)
    batch = torch.stack([transform(read_image(path)) for path in images])  # all read first
    with torch.no_grad():
        probabilities = model.eval()(batch).softmax(dim=-1)
    values, indices = probabilities.topk(min(top, len(labels)), dim=-1)
    return [{"image": path, "top": [{"index": int(i), "label": labels[int(i)],
                                     "probability": float(p)} for p, i in zip(vs, ix)]}
            for path, vs, ix in zip(images, values, indices)]


def run_predict(args) -> int:
    import vitzoo

    for path in args.images:  # a wrong path fails before any download
        read_image(path)
    if os.path.isdir(args.model) or args.model.startswith("hf-hub:"):  # a saved or pushed model
        model = vitzoo.from_pretrained(args.model)
    else:
        model = vitzoo.create(args.model, pretrained=True)
    name, classes = getattr(model.pretrained_tag, "name", args.model), model.config.num_classes
    if not model.labels:  # no class names, or no classifier
        head = f"a head of {classes} classes without names" if classes else "no classifier"
        raise ValueError(f"{name} has {head}: predict with a tag whose head names its classes "
                         "(an in1k tag of `vitzoo list --pretrained`)")
    results = predict(model, model.labels, args.images, args.top)
    if args.json:
        print(json.dumps({"model": name, "predictions": results}, indent=2))
        return 0
    for result in results:
        print(f"{result['image']}:")
        for item in result["top"]:
            print(f"  {item['probability']:7.2%}  {item['label']} ({item['index']})")
    return 0
