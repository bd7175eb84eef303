"""`vitzoo shard FOLDER OUT`: an ImageFolder written as WebDataset tar shards."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Write an ImageFolder tree (FOLDER/train/<class>/<images>, FOLDER/val/<class>/<images> or test/)
as WebDataset tar shards in OUT: OUT/train-000000.tar, ..., OUT/val-000000.tar, ..., and
OUT/_info.json (the class names, and per split the shard files and their sample counts, in the
format timm's WebDataset reader reads). Each sample is the image file's own bytes (not
re-encoded; its extension in lower case, .JPEG as .jpg) and its class index (.cls), in the order
training lists the folder, so that `vitzoo train --data OUT` trains exactly as `--data FOLDER`
does, reading a few large files instead of one file per image (on Lustre, GPFS or BeeGFS every
file opened is a request to a metadata server).

A run that stops midway resumes when run again: the complete shards are kept. OUT must be new or
empty, or hold shards of the same folder; --overwrite writes into an OUT that holds other files
(vitzoo's earlier shards there are replaced, other files kept)."""

EXAMPLES = """\
examples:
  vitzoo shard /data/imagenet /data/imagenet-shards
  vitzoo train vit_b16 --data /data/imagenet-shards ...
  vitzoo train vit_b16 --data '/data/imagenet-shards/train-{000000..000139}.tar' ...
  vitzoo shard my_images/ my_shards/ --samples-per-shard 1000"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vitzoo.data.sharding import DEFAULT_SHARD_MB

    p = sub.add_parser("shard", help="write an image folder as WebDataset tar shards (for cluster "
                       "file systems)", description=DESCRIPTION, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="the ImageFolder tree to shard: FOLDER/train/<class>/<images>, "
                   "FOLDER/val/... (or test/)")
    p.add_argument("out", help="the folder to write the shards into (created if needed)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size-mb", type=float, default=DEFAULT_SHARD_MB, metavar="MB",
                      help="close a shard before it grows past MB megabytes (10^6 bytes; default "
                           f"{DEFAULT_SHARD_MB}, about 1 GB)")
    size.add_argument("--samples-per-shard", type=int, default=None, metavar="N",
                      help="N images per shard instead of a size (the last shard of each split "
                           "holds the rest)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an OUT holding other files, replacing vitzoo's earlier shards")
    p.add_argument("--threads", type=int, default=8,
                   help="image files read at once (default 8; more for a cluster file system)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vitzoo.data.sharding import write_shards

    info = write_shards(args.folder, args.out, shard_mb=args.shard_size_mb,
                        samples_per_shard=args.samples_per_shard, overwrite=args.overwrite,
                        threads=args.threads, progress=not args.quiet)
    splits = ", ".join(f"{name}: {split['num_samples']:,} images in {len(split['filenames'])} "
                       "shard(s)" for name, split in info["splits"].items())
    print(f"{args.out}: {len(info['classes'])} classes; {splits}. Train on them with --data "
          f"{args.out}")
    return 0
