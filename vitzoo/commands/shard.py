"""`vitzoo shard FOLDER OUT`: an ImageFolder written as WebDataset tar shards."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Write an ImageFolder tree (FOLDER/train/<class>/<images>, FOLDER/val/... or test/) as WebDataset
tar shards: OUT/train-000000.tar, ..., OUT/val-000000.tar, ..., and OUT/_info.json (the classes,
and per split the shard files and their sample counts, as timm's WebDataset reader reads them).
Each sample is the image file's own bytes and its class index (.cls), in the order training lists
the folder: `vitzoo train --data OUT` trains exactly as `--data FOLDER` does, from a few large
files. A stopped run resumes when run again, keeping the complete shards."""

EXAMPLES = """\
examples:
  vitzoo shard /data/imagenet /data/imagenet-shards
  vitzoo train vit_b16 --data /data/imagenet-shards ...
  vitzoo train vit_b16 --data '/data/imagenet-shards/train-{000000..000139}.tar' ..."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vitzoo.data.sharding import DEFAULT_SHARD_MB

    p = sub.add_parser("shard", help="write an image folder as WebDataset tar shards",
                       description=DESCRIPTION, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="the ImageFolder tree: FOLDER/train/<class>/<images>, FOLDER/val")
    p.add_argument("out", help="the folder to write the shards into (created if needed)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size-mb", type=float, default=DEFAULT_SHARD_MB, metavar="MB",
                      help=f"close a shard before it grows past MB megabytes (default "
                           f"{DEFAULT_SHARD_MB})")
    size.add_argument("--samples-per-shard", type=int, metavar="N", help="N images per shard")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an OUT holding other files, replacing earlier shards")
    p.add_argument("--threads", type=int, default=8, help="image files read at once (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitzoo.data.sharding import write_shards

    info = write_shards(args.folder, args.out, shard_mb=args.shard_size_mb,
                        samples_per_shard=args.samples_per_shard, overwrite=args.overwrite,
                        threads=args.threads, progress=not args.quiet)
    splits = ", ".join(f"{name}: {split['num_samples']:,} images in {len(split['filenames'])} "
                       "shard(s)" for name, split in info["splits"].items())
    print(f"{args.out}: {len(info['classes'])} classes; {splits}. Train with --data {args.out}")
    return 0
