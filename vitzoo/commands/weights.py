"""`vitzoo push DIR REPO_ID`, `vitzoo pull REPO_ID [DIR]`, `vitzoo convert SRC DST [--model]`:
pull and convert write only into a new or empty directory; the Hub commands use huggingface_hub's
settings (HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_OFFLINE)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from vitzoo.io import atomic_path, staged_directory
from vitzoo.train.checkpoint import check_new_directory
from vitzoo.weights.card import CHOICES
from vitzoo.weights.layout import CONFIG_NAME, HUB_PREFIX


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("push", help="upload a directory save_pretrained wrote to a Hub repo")
    p.add_argument("directory", help="the model's directory (save_pretrained, convert, pull DIR)")
    p.add_argument("repo_id", help="ORG/NAME (created when it does not exist)")
    p.add_argument("--revision", default=None, help="branch to commit to (default main)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--message", default="Upload vitzoo model", help="commit message")
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the login)")
    p.add_argument("--format", default="auto", choices=CHOICES,
                   help="the layout pushed: auto (default) timm's where timm builds the model, "
                        "else transformers', else vitzoo's; vitzoo loads each exactly")
    p.set_defaults(func=run_push)

    p = sub.add_parser("pull", help="download a model from the Hub into the Hugging Face cache "
                                    "(and DIR)")
    p.add_argument("repo_id", help=f"[{HUB_PREFIX}]ORG/NAME[@REVISION]")
    p.add_argument("directory", nargs="?", default=None,
                   help="also write the model here as a vitzoo directory")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default main)")
    p.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN or the login)")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("convert", help="read weights of any supported format, write a vitzoo "
                                       "directory")
    p.add_argument("source", help=f"file, directory or {HUB_PREFIX}ORG/NAME[@REVISION]")
    p.add_argument("destination", help="a new or empty directory")
    p.add_argument("--model", default=None, help="model to load into (default: inferred)")
    p.add_argument("--num-heads", type=int, default=None,
                   help="attention heads, when the weights cannot say")
    p.add_argument("--img-size", type=int, default=None,
                   help="resolution (position embeddings are resampled)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="a new zero-initialised head of this size")
    p.set_defaults(func=run_convert)


def run_push(args) -> int:
    from vitzoo.model import VisionTransformer
    from vitzoo.weights.publish import push_folder

    print(push_folder(args.directory, args.repo_id, model_class=VisionTransformer,
                      token=args.token, private=args.private, revision=args.revision,
                      commit_message=args.message, format=args.format))
    return 0


def run_pull(args) -> int:
    import vitzoo
    from vitzoo.weights.files import read_json
    from vitzoo.weights.hub import download
    from vitzoo.weights.native import is_saved

    source = args.repo_id if args.repo_id.startswith(HUB_PREFIX) else HUB_PREFIX + args.repo_id
    if args.directory:  # before anything is downloaded
        check_new_directory(Path(args.directory), "the directory", writer="pull writes only into")
    snapshot = download(source, revision=args.revision, token=args.token)
    model = vitzoo.from_pretrained(snapshot)  # the files must make a model: fail here, not later
    if not args.directory:
        print(snapshot)
        return 0
    if is_saved(read_json(snapshot / CONFIG_NAME) if (snapshot / CONFIG_NAME).exists() else None):
        # the repo's own files, model card included, all at once
        names = tuple(sorted((p.name for p in snapshot.iterdir() if p.is_file()),
                             key=lambda n: (n == CONFIG_NAME, n)))
        with staged_directory(Path(args.directory), names) as stage:
            for name in names:
                with atomic_path(stage / name) as tmp:
                    shutil.copyfile(snapshot / name, tmp)
    else:  # a foreign format: written as a vitzoo directory
        model.save_pretrained(args.directory)
    print(args.directory)
    return 0


def run_convert(args) -> int:
    import vitzoo

    check_new_directory(Path(args.destination), "the destination",
                        writer="convert writes only into")
    options = {k: v for k, v in (("num_heads", args.num_heads), ("img_size", args.img_size),
                                 ("num_classes", args.num_classes)) if v is not None}
    model = (vitzoo.create(args.model, pretrained=args.source, **options) if args.model
             else vitzoo.from_pretrained(args.source, **options))
    model.save_pretrained(args.destination)
    c = model.config
    print(f"{args.destination}: D={c.embed_dim} L={c.depth} heads={c.num_heads} "
          f"patch={c.patch_size} stem={c.stem} img_size={c.img_size} classes={c.num_classes}")
    return 0
