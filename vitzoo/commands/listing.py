"""`vitzoo list [PATTERN] [--pretrained [--markdown]]` and `vitzoo info NAME`."""

from __future__ import annotations

import argparse
import json

import vitzoo
from vitzoo.registry import pretrained_tags


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the named models (fnmatch PATTERN), the components and "
                                    "the weight formats")
    p.add_argument("pattern", nargs="?", default="*",
                   help="shell-style pattern of the names to list, e.g. 'vit_b*' (default: all)")
    p.add_argument("--pretrained", action="store_true",
                   help="list the pretrained tags (MODEL.TAG) instead: their Hub repo, resolution "
                        "and accuracy")
    p.add_argument("--markdown", action="store_true",
                   help="with --pretrained: as a Markdown table (the one in docs/pretrained.md)")
    p.set_defaults(func=run_list)
    p = sub.add_parser("info",
                       help="config, parameter count, GFLOPs and sequence length of a model")
    p.add_argument("name", help="a model name or pretrained tag (vitzoo list)")
    p.add_argument("--img-size", type=int, default=None, help="resolution (default: the model's)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_info)


def run_list(args) -> int:
    if args.markdown and not args.pretrained:
        raise ValueError("--markdown lists the pretrained tags: add --pretrained")
    if args.pretrained:
        tags = [pretrained_tags()[name] for name in vitzoo.list_pretrained(args.pattern)]
        print(markdown_table(tags) if args.markdown else tag_lines(tags), end="")
        return 0
    print("\n".join(vitzoo.list_models(args.pattern)))
    if args.pattern == "*":
        for kind, components in vitzoo.list_components().items():
            print(f"# {kind}: {', '.join(components)}")
        print(f"# weight formats: {', '.join(vitzoo.list_weight_formats())}")
    return 0


def accuracy(tag) -> str:
    return f"{tag.accuracy:.2f} ({tag.accuracy_source})" if tag.accuracy is not None else "-"


def tag_lines(tags: list) -> str:
    width = max((len(tag.name) for tag in tags), default=0)
    lines = [f"{t.name:{width}}  {'*' if t.default else ' '} hf-hub:{t.hub_id} ({t.format}, "
             f"{t.img_size} px, {t.num_classes or 'no'} classes)  top-1 {accuracy(t)}"
             for t in tags]
    return "\n".join([*lines, "# * the model's default: vitzoo.create(MODEL, pretrained=True)\n"])


def markdown_table(tags: list) -> str:
    """The tags as docs/pretrained.md's table."""
    rows = [f"| {t.model} | `{t.tag}`{' (default)' * t.default} | [{t.hub_id}](https://"
            f"huggingface.co/{t.hub_id}) | {t.format} | {t.img_size} | "
            f"{t.num_classes or 'none (features)'} | {accuracy(t)} |" for t in tags]
    return "\n".join(["| model | tag | Hub repo | format | resolution | classes | ImageNet top-1 "
                      "(source) |", "|---|---|---|---|---|---|---|", *rows]) + "\n"


def run_info(args) -> int:
    options = {"img_size": args.img_size} if args.img_size is not None else {}
    model = vitzoo.create(args.name, device="meta", **options)
    grid = model.grid
    info = {"name": args.name, "params": vitzoo.count_params(model),
            "gflops": vitzoo.count_flops(model.config) / 1e9, "grid": list(grid),
            "seq_len": grid[0] * grid[1] + model.num_prefix_tokens,
            "config": model.config.to_dict()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['name']}: {info['params']:,} parameters, {info['gflops']:.2f} GFLOPs per image, "
          f"grid {grid[0]}x{grid[1]}, sequence length {info['seq_len']}")
    for key, value in info["config"].items():
        print(f"  {key:20s} {value}")
    return 0
