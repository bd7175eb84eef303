"""The `vitzoo` command: each subcommand is a module of `vitzoo/commands` whose `add_parser(sub)`
registers its arguments and sets `func(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import sys

from vitzoo.argvalues import ArgumentParser
from vitzoo.version import __version__

DESCRIPTION = (
    'The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021), '
    "in PyTorch.\nInspect the models, classify images with the released weights, train or "
    "fine-tune on your own images,\nmove weights between formats and the Hugging Face Hub, and "
    "run the paper's ablations.")

EXAMPLES = """\
examples:
  vitzoo list --pretrained
  vitzoo predict cat.jpg --model vit_b16.orig_in21k_ft_in1k
  vitzoo train --pretrained vit_s16.augreg_in21k_ft_in1k --data my_images/ --recipe paper-finetune \
--steps 500 --out runs/ft
  vitzoo shard /data/imagenet /data/imagenet-shards    # then --data /data/imagenet-shards
  vitzoo pull alice/vit-b16-cifar10 weights/

`vitzoo COMMAND --help` lists a command's options."""

# the modules of vitzoo/commands, in the order a user meets them
COMMANDS = ("listing", "predict", "train", "evaluate", "shard", "weights", "export", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="vitzoo", description=DESCRIPTION, epilog=EXAMPLES,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"vitzoo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of these:")
    for name in COMMANDS:
        importlib.import_module(f"vitzoo.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError) as exc:  # a user's error: one line, no traceback
        print(f"vitzoo {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
