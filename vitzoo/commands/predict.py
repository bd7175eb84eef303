"""`vitzoo predict IMAGE... --model MODEL[.TAG][@REVISION] [--top K] [--json]`: classify images with
released weights, preprocessed as those weights expect (`vitzoo.transforms_for`)."""

from __future__ import annotations

import argparse
import json
import os

import torch

MAX_TOP = 20


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="classify images with pretrained weights: the top-k labels and probabilities")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any format Pillow reads: PNG, JPEG, ...)")
    p.add_argument("--model", required=True,
                   help="a pretrained tag MODEL.TAG[@REVISION] (`vitzoo list --pretrained`), or a model for its default tag")
    p.add_argument("--top", type=int, default=5, help=f"how many classes to show per image (1-{MAX_TOP}, default 5)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_predict)


def read_image(path: str):
    """An image file as an RGB PIL image; a ValueError naming the file otherwise."""
    from PIL import Image

    if not os.path.isfile(path):
        raise ValueError(f"cannot read image {path!r}: no such file")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"cannot read image {path!r}: it is not an image Pillow can read, or it is damaged "
                         f"({type(exc).__name__})") from None


def check_labelled(labels: list[str] | None, num_classes: int, name: str) -> list[str]:
    """The class names; a ValueError saying why there are none and which tags have them."""
    from vitzoo.catalog import registered

    if labels is not None and num_classes:
        return labels
    labelled = sorted(n for n, tag in registered().items() if tag.labels is not None)
    head = "no classifier (features only)" if num_classes == 0 else f"a head of {num_classes} classes without names"
    raise ValueError(f"{name} has {head}, so its predictions cannot be named; predict with a tag whose head "
                     f"has labels: {', '.join(labelled)}")


def predict(model, labels: list[str], images: list[str], top: int) -> list[dict]:
    from vitzoo.transforms import transforms_for

    transform = transforms_for(model)
    batch = torch.stack([transform(read_image(path)) for path in images])  # every file is read before any runs
    with torch.no_grad():
        probabilities = model.eval()(batch).softmax(dim=-1)
    values, indices = probabilities.topk(min(top, len(labels)), dim=-1)
    return [{"image": path, "top": [{"index": int(i), "label": labels[int(i)], "probability": float(p)}
                                    for p, i in zip(vs, ix)]}
            for path, vs, ix in zip(images, values, indices)]


def run_predict(args) -> int:
    import vitzoo

    if not 1 <= args.top <= MAX_TOP:
        raise ValueError(f"--top must be between 1 and {MAX_TOP}, got {args.top}")
    from vitzoo.catalog import lookup

    # a wrong path, or weights without a classifier, fail before any download
    for path in args.images:
        read_image(path)
    _, tag, _ = lookup(args.model, pretrained=True)
    if tag.num_classes == 0:
        check_labelled(None, 0, tag.name)
    model = vitzoo.create(args.model, pretrained=True)
    labels = check_labelled(model.labels, model.config.num_classes, tag.name)
    results = predict(model, labels, args.images, args.top)
    if args.json:
        print(json.dumps({"model": tag.name, "predictions": results}, indent=2))
        return 0
    for result in results:
        print(f"{result['image']}:")
        for item in result["top"]:
            print(f"  {item['probability']:7.2%}  {item['label']} ({item['index']})")
    return 0
