"""`vitzoo predict IMAGE... --model MODEL[.TAG][@REVISION] | DIR | hf-hub:ORG/NAME [--top K]
[--json]`: classify images preprocessed as the weights expect, naming classes as they do."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch

MAX_TOP = 20


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="classify images with pretrained weights: the top-k labels "
                                       "and probabilities")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files (any format Pillow reads; 16-bit and float ones by their "
                        "range)")
    p.add_argument("--model", required=True,
                   help="a pretrained tag MODEL.TAG[@REVISION] (`vitzoo list --pretrained`), a "
                        "model for its default tag, a saved model's directory, or a Hub repo "
                        "hf-hub:ORG/NAME[@REVISION]")
    p.add_argument("--top", type=int, default=5,
                   help=f"how many classes to show per image (1-{MAX_TOP}, default 5)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_predict)


def read_image(path: str):
    """An image file as an RGB PIL image, or one of more than 8 bits as a float tensor (3, H, W)
    in [0, 1] by the range of its type (convert("RGB") would clip it); a ValueError otherwise."""
    from PIL import Image

    if not os.path.isfile(path):
        raise ValueError(f"cannot read image {path!r}: " + (
            "it is a directory, not an image file" if os.path.isdir(path) else "no such file"))
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode not in ("I", "F") and not image.mode.startswith("I;16"):
                return image.convert("RGB")
            values = np.asarray(image)
            bits = 16 if image.mode.startswith("I;16") else (
                getattr(image, "tag_v2", {}).get(258) or (None,))[0]  # TIFF's bits per sample
            signed = (getattr(image, "tag_v2", {}).get(339) or (1,))[0] == 2  # sample format
    except Image.DecompressionBombError as exc:
        raise ValueError(f"cannot read image {path!r}: it is larger than Pillow reads by default "
                         f"({exc}); resize it, or raise PIL.Image.MAX_IMAGE_PIXELS") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read image {path!r}: it is not an image Pillow can read, or it "
                         f"is damaged ({type(exc).__name__}: {exc})") from None
    wrong = "save it as an 8- or 16-bit PNG"
    if image.mode == "F" and not (np.isfinite(values).all() and 0 <= values.min()
                                  and values.max() <= 1):
        wrong = "its pixels are floats outside [0, 1] (0 black, 1 white): rescale them"
    elif image.mode != "F" and (bits is None or values.min() < 0):
        wrong = f"its integers have no range (bits per sample) or are negative: {wrong}"
    else:
        top = 1 if image.mode == "F" else 2 ** (bits - signed) - 1
        scaled = (values.astype(np.float64) / top).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(scaled))[None].expand(3, -1, -1).clone()
    raise ValueError(f"cannot read image {path!r} correctly: {wrong}")


def check_labelled(labels: list[str] | None, num_classes: int, name: str) -> list[str]:
    """The class names; a ValueError saying why there are none and which tags have them."""
    from vitzoo.registry import pretrained_tags

    if labels is not None and num_classes:
        return labels
    labelled = sorted(n for n, tag in pretrained_tags().items() if tag.labels is not None)
    head = ("no classifier (features only)" if num_classes == 0
            else f"a head of {num_classes} classes without names")
    raise ValueError(f"{name} has {head}, so its predictions cannot be named; predict with a tag "
                     f"whose head has them: {', '.join(labelled)}")


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
    from vitzoo.registry import lookup, weight_formats
    from vitzoo.weights import WeightFormat

    if not 1 <= args.top <= MAX_TOP:
        raise ValueError(f"--top must be between 1 and {MAX_TOP}, got {args.top}")
    for path in args.images:  # a wrong path fails before any download
        read_image(path)
    if os.path.isdir(args.model) or args.model.startswith("hf-hub:"):  # a saved or pushed model
        name, model = args.model, vitzoo.from_pretrained(args.model)
    else:
        tag = lookup(args.model, pretrained=True)[1]
        # known before the download: the tag's class names, or a format whose files give them
        fmt = weight_formats()[tag.format]
        named = tag.labels is not None or type(fmt).labels is not WeightFormat.labels
        if tag.num_classes == 0 or not named:
            check_labelled(None, tag.num_classes, tag.name)
        name, model = tag.name, vitzoo.create(args.model, pretrained=True)
    labels = check_labelled(model.labels, model.config.num_classes, name)
    results = predict(model, labels, args.images, args.top)
    if args.json:
        print(json.dumps({"model": name, "predictions": results}, indent=2))
        return 0
    for result in results:
        print(f"{result['image']}:")
        for item in result["top"]:
            print(f"  {item['probability']:7.2%}  {item['label']} ({item['index']})")
    return 0
