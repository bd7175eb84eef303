"""`vitzoo predict IMAGE... --model MODEL[.TAG][@REVISION] | DIR | hf-hub:ORG/NAME [--top K]
[--json]`: classify images with released weights, a trained or saved model, or a Hub repo's,
preprocessed as those weights expect (`vitzoo.transforms_for`), classes named as the weights do."""

from __future__ import annotations

import argparse
import json
import os

import torch

MAX_TOP = 20


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="classify images with pretrained weights: the top-k labels "
                                       "and probabilities")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files (any format Pillow reads: PNG, JPEG, ...; 16-bit and float "
                        "images by their range)")
    p.add_argument("--model", required=True,
                   help="a pretrained tag MODEL.TAG[@REVISION] (`vitzoo list --pretrained`), a "
                        "model for its default tag, a trained or saved model's directory, or a Hub "
                        "repo hf-hub:ORG/NAME[@REVISION]")
    p.add_argument("--top", type=int, default=5,
                   help=f"how many classes to show per image (1-{MAX_TOP}, default 5)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_predict)


# TIFF tags that say what an integer image's numbers are: bits per sample, and signed (2) or not (1)
_BITS_PER_SAMPLE, _SAMPLE_FORMAT = 258, 339


def read_image(path: str):
    """An image file as an RGB PIL image (8 bits per channel), or, for one of more bits, a float
    tensor (3, H, W) in [0, 1] scaled by the range of its type; a ValueError naming the file and the
    problem for one that cannot be read, or not read correctly."""
    from PIL import Image

    if os.path.isdir(path):
        raise ValueError(f"cannot read image {path!r}: it is a directory, not an image file; name "
                         f"its images (e.g. {os.path.join(path, '*.jpg')}; the shell expands the "
                         "pattern)")
    if not os.path.isfile(path):
        raise ValueError(f"cannot read image {path!r}: no such file")
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode in ("I", "F") or image.mode.startswith("I;16"):
                return _unit_range(image, path)
            return image.convert("RGB")
    except Image.DecompressionBombError as exc:
        raise ValueError(f"cannot read image {path!r}: it is larger than Pillow reads by default, "
                         f"as a guard against decompression bombs ({exc}); resize it, or raise "
                         "PIL.Image.MAX_IMAGE_PIXELS if you trust it") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read image {path!r}: it is not an image Pillow can read, or it "
                         f"is damaged ({type(exc).__name__}: {exc})") from None


def _unit_range(image, path: str) -> torch.Tensor:
    """A one-channel image of more than 8 bits (16-bit PNG, 32-bit integer or float TIFF) as a float
    tensor (3, H, W) in [0, 1]: integers divided by the largest value of their type, floats taken as
    they are when they lie in [0, 1]. Pillow's convert("RGB") would clip them to 255 instead."""
    import numpy as np

    values = np.asarray(image)
    if image.mode == "F":
        low, high = float(np.min(values)), float(np.max(values))
        if not (np.isfinite(values).all() and 0.0 <= low and high <= 1.0):
            raise ValueError(f"cannot read image {path!r} correctly: its pixels are floats in "
                             f"[{low:g}, {high:g}], and a float image is read as [0, 1] (0 black, "
                             "1 white); rescale it to [0, 1], or save it as an 8- or 16-bit image")
        scaled = values.astype(np.float32)
    else:
        tags = getattr(image, "tag_v2", {})
        bits = (tags.get(_BITS_PER_SAMPLE) or (None,))[0] if image.mode == "I" else 16
        signed = (tags.get(_SAMPLE_FORMAT) or (1,))[0] == 2
        if bits is None:
            raise ValueError(f"cannot read image {path!r} correctly: it holds {image.mode!r} "
                             "integers and does not say their range (bits per sample); save it as "
                             "an 8- or 16-bit PNG")
        if values.min() < 0:
            raise ValueError(f"cannot read image {path!r} correctly: it holds negative pixel "
                             f"values (down to {values.min()}); save it as an 8- or 16-bit PNG")
        top = 2 ** (bits - 1) - 1 if signed else 2 ** bits - 1
        scaled = (values.astype(np.float64) / top).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(scaled))[None].expand(3, -1, -1).clone()


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
        # known before the download: the tag's class names, or a format whose files name them
        fmt = weight_formats().get(tag.format)
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
