"""`vitzoo push DIR REPO_ID`, `vitzoo pull REPO_ID [DIR]`, `vitzoo convert SRC DST [--model NAME]`.

pull and convert write only into a new or empty directory, as `vitzoo train --out` does.

The Hub commands use huggingface_hub's settings: HF_ENDPOINT, HF_TOKEN, HF_HOME, HF_HUB_OFFLINE.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from vitzoo.checkpoints.layouts import CHOICES
from vitzoo.checkpoints.native import is_saved, read_json_object
from vitzoo.errors import CheckpointError
from vitzoo.io import atomic_path, staged_directory
from vitzoo.train.checkpoint import check_new_directory
from vitzoo.weights.layout import CONFIG_NAME, HUB_PREFIX


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("push", help="upload a directory written by save_pretrained to a Hugging "
                                    "Face Hub repo")
    p.add_argument("directory", help="the model's directory, as save_pretrained (or vitzoo "
                                     "convert, pull DIR) writes it")
    p.add_argument("repo_id", help="ORG/NAME (created when it does not exist)")
    p.add_argument("--revision", default=None,
                   help="branch to commit to (created when missing; default main)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--message", default="Upload vitzoo model", help="commit message")
    p.add_argument("--token", default=None,
                   help="Hub token (default: HF_TOKEN or the stored login)")
    p.add_argument("--format", default="auto", choices=CHOICES,
                   help="the layout pushed: auto (default) writes timm's where timm builds the "
                        "model (timm.create_model('hf-hub:REPO', pretrained=True) loads it), else "
                        "transformers', else vitzoo's; transformers: one "
                        "ViTForImageClassification.from_pretrained loads; vitzoo: vitzoo's own. "
                        "vitzoo loads each exactly")
    p.set_defaults(func=run_push)

    p = sub.add_parser("pull", help="download a model from the Hub into the Hugging Face cache "
                                    "(and DIR)")
    p.add_argument("repo_id", help=f"ORG/NAME[@REVISION] or {HUB_PREFIX}ORG/NAME[@REVISION]")
    p.add_argument("directory", nargs="?", default=None,
                   help="also write the model here as a vitzoo directory")
    p.add_argument("--revision", default=None,
                   help="branch, tag or commit (default main; or ORG/NAME@REVISION)")
    p.add_argument("--token", default=None,
                   help="Hub token (default: HF_TOKEN or the stored login)")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("convert", help="read weights in any supported format, write a vitzoo "
                                       "directory")
    p.add_argument("source", help=f"file, directory or {HUB_PREFIX}ORG/NAME[@REVISION]")
    p.add_argument("destination",
                   help="a new or empty directory to write the vitzoo directory into")
    p.add_argument("--model", default=None,
                   help="named model to load into (default: inferred from the weights)")
    p.add_argument("--num-heads", type=int, default=None,
                   help="attention heads, when the weights cannot say")
    p.add_argument("--img-size", type=int, default=None,
                   help="resolution (position embeddings are resampled)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="a new zero-initialised head of this size")
    p.set_defaults(func=run_convert)


def run_push(args) -> int:
    from vitzoo.model import VisionTransformer
    from vitzoo.checkpoints.publish import push_folder

    url = push_folder(args.directory, args.repo_id, model_class=VisionTransformer, token=args.token,
                      private=args.private, revision=args.revision, commit_message=args.message,
                      format=args.format)
    print(url)
    return 0


def _copy_files(snapshot: Path, destination: Path) -> None:
    """The snapshot's files into `destination`, all at once (vitzoo.io.staged_directory)."""
    names = tuple(sorted((p.name for p in snapshot.iterdir() if p.is_file()),
                         key=lambda n: (n == CONFIG_NAME, n)))
    with staged_directory(destination, names) as stage:
        for name in names:
            with atomic_path(stage / name) as tmp:  # fsynced, as save_pretrained's files are
                shutil.copyfile(snapshot / name, tmp)


def run_pull(args) -> int:
    from vitzoo.weights.hub import download
    from vitzoo.pretrained import load_pretrained

    source = args.repo_id if args.repo_id.startswith(HUB_PREFIX) else HUB_PREFIX + args.repo_id
    if args.directory:  # before anything is downloaded
        check_new_directory(Path(args.directory), "the directory", writer="pull writes only into")
    snapshot = download(source, revision=args.revision, token=args.token)
    model = load_pretrained(None, snapshot, {})  # the files must make a model: fail here, not later
    if args.directory:
        destination = Path(args.directory)
        if _is_vitzoo(snapshot):  # the repo's own files, model card included
            _copy_files(snapshot, destination)
        else:  # a foreign format: written as a vitzoo directory
            model.save_pretrained(destination)
        print(destination)
    else:
        print(snapshot)
    return 0


def _is_vitzoo(directory: Path) -> bool:
    try:
        return is_saved(read_json_object(directory / CONFIG_NAME))
    except CheckpointError:
        return False


def run_convert(args) -> int:
    import vitzoo

    check_new_directory(Path(args.destination), "the destination",
                        writer="convert writes only into", source=args.source,
                        source_name="the source being converted")
    options = {k: v for k, v in (("num_heads", args.num_heads), ("img_size", args.img_size),
                                 ("num_classes", args.num_classes)) if v is not None}
    if args.model:
        model = vitzoo.create(args.model, pretrained=args.source, **options)
    else:
        model = vitzoo.from_pretrained(args.source, **options)
    model.save_pretrained(args.destination)
    config = model.config
    print(f"{args.destination}: D={config.embed_dim} L={config.depth} heads={config.num_heads} "
          f"patch={config.patch_size} stem={config.stem} img_size={config.img_size} "
          f"classes={config.num_classes}")
    return 0
