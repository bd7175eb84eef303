"""`vitzoo list [PATTERN] [--pretrained]` and `vitzoo info NAME`."""

from __future__ import annotations

import argparse
import json

import vitzoo


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
        return _list_pretrained(args.pattern, args.markdown)
    names = vitzoo.list_models(args.pattern)
    if not names:
        raise ValueError(f"no model matches {args.pattern!r}; `vitzoo list` shows them all")
    print("\n".join(names))
    if args.pattern == "*":
        for kind, components in vitzoo.list_components().items():
            print(f"# {kind}: {', '.join(components)}")
        print(f"# weight formats: {', '.join(vitzoo.list_weight_formats())}")
    return 0


def _list_pretrained(pattern: str, markdown: bool = False) -> int:
    from vitzoo.catalog import markdown_table, registered

    names = vitzoo.list_pretrained(pattern)
    if not names:
        raise ValueError(f"no pretrained tag matches {pattern!r}; `vitzoo list --pretrained` shows "
                         "them all")
    if markdown:
        print(markdown_table(pattern), end="")
        return 0
    width = max(map(len, names))
    tags = registered()  # checked once, not once per tag
    for name in names:
        tag = tags[name]
        accuracy = ("" if tag.accuracy is None
                    else f"  top-1 {tag.accuracy:.2f} ({tag.accuracy_source})")
        print(f"{name:{width}}  {'*' if tag.default else ' '} hf-hub:{tag.hub_id} ({tag.format}, "
              f"{tag.img_size} px, {tag.num_classes or 'no'} classes){accuracy}")
    print("# * the model's default: vitzoo.create(MODEL, pretrained=True)")
    return 0


def model_info(name: str, img_size: int | None = None) -> dict:
    """Parameters and forward FLOPs (counted by torch.utils.flop_counter, one image)."""
    options = {"img_size": img_size} if img_size is not None else {}  # the config refuses a 0
    model = vitzoo.create(name, device="meta", **options)
    grid = model.grid
    return {
        "name": name,
        "params": vitzoo.count_params(model),
        "gflops": vitzoo.count_flops(model.config) / 1e9,
        "grid": list(grid),
        "seq_len": grid[0] * grid[1] + model.num_prefix_tokens,
        "config": model.config.to_dict(),
    }


def run_info(args) -> int:
    info = model_info(args.name, args.img_size)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['name']}: {info['params']:,} parameters, {info['gflops']:.2f} GFLOPs per image, "
          f"grid {info['grid'][0]}x{info['grid'][1]}, sequence length {info['seq_len']}")
    for key, value in info["config"].items():
        print(f"  {key:20s} {value}")
    return 0
