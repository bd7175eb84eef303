"""`vitzoo train MODEL ...` and `vitzoo eval RUN ...`.

Every TrainConfig field is a flag (`--batch-size`, `--time-budget-min`, ...), and every ViTConfig field
is a model option flag (`--img-size`, `--patch-size`, `--pos-embed`, `--drop-path`, ...) passed to
`vitzoo.create`; both are generated from the dataclasses' fields. Only the flags given on the command
line are set, so `--resume RUN` takes the saved train_config.json and changes only those.

    vitzoo train vit_ti16 --data fashion-mnist --recipe small --hflip --img-size 28 --patch-size 7 --embed-dim 64 --depth 4 --num-heads 4 --mlp-dim 128 --epochs 1 --out runs/a
    torchrun --nproc_per_node 8 -m vitzoo train vit_b16 --data /data/imagenet --recipe paper-pretrain ...
    vitzoo train vit_b16 --pretrained runs/a --recipe paper-finetune --img-size 384 ...
    vitzoo train vit_ti16 --data cifar10 --download ...   # fetched through torchvision, MD5-checked (docs/datasets.md)
    vitzoo train --pretrained vit_s16.augreg_in21k_ft_in1k --data DIR --recipe paper-finetune --out runs/ft
    vitzoo train --resume runs/a
    vitzoo eval runs/a --data fashion-mnist --fewshot 1,5,10,25
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.options import check_number
from vitzoo.train.config import (
    DECODES,
    DEVICES,
    OPTIMIZERS,
    PRECISIONS,
    RECIPES,
    SCHEDULES,
    TrainConfig,
)

CHOICES = {"recipe": tuple(RECIPES), "optimizer": OPTIMIZERS, "schedule": SCHEDULES, "device": DEVICES,
           "precision": PRECISIONS, "decode": DECODES}
NOT_FLAGS = {"model", "model_options", "resume", "out"}  # positional / handled by hand


# ---------------------------------------------------------------------------- dataclass fields -> flags
def _parse_tuple(text: str, item: type, length: int | None) -> tuple:
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()] if text.strip().lower() not in ("", "none", "()") else []
    values = tuple(item(p) for p in parts)
    if length is not None and len(values) == 1:
        values = values * length  # --img-size 28 means (28, 28)
    if length is not None and len(values) != length:
        raise argparse.ArgumentTypeError(f"expected {length} comma-separated values, got {text!r}")
    return values


def _converter(annotation: Any):
    """A function str -> value for a field's type: int, float, str, bool, X | None, tuple[...]."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = _converter(next(a for a in args if a is not type(None)))

        def optional(text: str):
            return None if text.lower() == "none" else inner(text)

        return optional
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return lambda text: _parse_tuple(text, args[0], None)
        return lambda text: _parse_tuple(text, args[0], len(args))
    if annotation is bool:
        return bool
    if annotation in (int, float, str):
        return annotation
    raise TypeError(f"no command-line form for {annotation!r}")


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def add_dataclass_flags(parser, cls, exclude=(), dest_prefix: str = "") -> list[str]:
    """One flag per field of `cls` (default: not set). Returns the destinations."""
    hints = typing.get_type_hints(cls)
    dests = []
    defaults = cls() if cls is ViTConfig else None
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        annotation = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        dest = dest_prefix + f.name
        default = getattr(defaults, f.name) if defaults is not None else (
            f.default if f.default is not dataclasses.MISSING else f.default_factory())
        help_text = f.metadata.get("help", "") + f" [{_type_name(annotation)}, default {default!r}]"
        help_text = help_text.replace("%", "%%")  # argparse reads % as a format code ("3% faster" crashed --help)
        if annotation is bool or annotation == (bool | None):
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=dest, type=_converter(annotation), default=argparse.SUPPRESS,
                                choices=CHOICES.get(f.name) if dest_prefix == "" else None, metavar=None if f.name in CHOICES else "V",
                                help=help_text)
        dests.append(dest)
    return dests


MODEL_PREFIX = "model__"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train or fine-tune a model (torchrun for several processes)",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                   help="model name or pretrained tag (vitzoo list); default vit_ti16, or the tag --pretrained names")
    p.add_argument("--out", default=argparse.SUPPRESS, help="run directory (default runs/<model>)")
    p.add_argument("--resume", nargs="?", const=True, default=argparse.SUPPRESS, metavar="RUN",
                   help="continue the run RUN (or --out) from its last checkpoint, with its saved settings")
    add_dataclass_flags(p.add_argument_group("training options"), TrainConfig, exclude=NOT_FLAGS)
    add_dataclass_flags(p.add_argument_group("model options (ViTConfig fields, passed to vitzoo.create)"), ViTConfig,
                        dest_prefix=MODEL_PREFIX)
    p.set_defaults(func=run_train)

    e = sub.add_parser("eval", help="top-1 / top-5, few-shot linear and linear-probe accuracy of a saved model")
    e.add_argument("model_dir", help="a run directory or any save_pretrained directory")
    e.add_argument("--data", default=None, help="dataset (default: the one the run was trained on)")
    e.add_argument("--data-dir", default=None, help="where the named dataset's files are (default "
                   "$VITZOO_CACHE/datasets)")
    e.add_argument("--download", action="store_true", help="fetch a named dataset that is not there through "
                   "torchvision (MD5-verified)")
    e.add_argument("--fewshot", type=lambda t: _parse_tuple(t, int, None), default=(), metavar="K,K,...",
                   help="few-shot linear accuracy for these shots, e.g. 1,5,10,25")
    e.add_argument("--draws", type=int, default=5, help="random draws of the k-shot sets to average")
    e.add_argument("--l2-reg", type=float, default=None, help="few-shot ridge regulariser (default 2**10)")
    e.add_argument("--linear-probe", action="store_true", help="also fit a logistic-regression probe")
    e.add_argument("--test-limit", type=int, default=None, help="evaluate on the first N test images")
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--num-workers", type=int, default=0)
    e.add_argument("--device", default="auto", choices=DEVICES)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--json", action="store_true", help="print JSON only")
    e.set_defaults(func=run_eval)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = vars(args)
    model_options = {k[len(MODEL_PREFIX):]: v for k, v in given.items() if k.startswith(MODEL_PREFIX)}
    train = {k: v for k, v in given.items() if k in {f.name for f in dataclasses.fields(TrainConfig)} - NOT_FLAGS}
    resume = given.get("resume")
    if resume:
        run = Path(resume if isinstance(resume, str) else given.get("out", ""))
        if not str(run) or not (run / "train_config.json").exists():
            raise FileNotFoundError(f"--resume: no run to continue at {run!s:.200} (no train_config.json)")
        saved = TrainConfig.from_json((run / "train_config.json").read_text(encoding="utf-8"))
        options = {**saved.model_options, **model_options}
        if "model" in given and given["model"] != saved.model:
            raise ConfigError(f"--resume {run}: the run trains {saved.model}, not {given['model']}")
        # stop_at belongs to one invocation: a resumed run goes on to the end unless told otherwise
        return dataclasses.replace(saved, **{"stop_at": None, **train}, model_options=options, out=str(run), resume=True)
    # no model named: the one --pretrained holds when it is a tag (MODEL.TAG: fine-tuning in one command)
    pretrained = str(train.get("pretrained") or "")
    default = pretrained.split("@")[0] if pretrained.split("@")[0] in vitzoo_tags() else "vit_ti16"
    model = given.get("model", default)
    return TrainConfig(model=model, model_options=model_options, out=given.get("out", f"runs/{model}"), **train)


def vitzoo_tags() -> list[str]:
    from vitzoo.catalog import list_pretrained

    return list_pretrained()


def run_train(args: argparse.Namespace) -> int:
    from vitzoo.train import fit

    summary = fit(config_from_args(args))
    if summary["status"] == "interrupted":
        import signal

        return 128 + int(getattr(signal, summary["signal"]))
    return 0


def _check_eval_numbers(args: argparse.Namespace) -> None:
    """eval's number options, checked as TrainConfig's are (a ConfigError before anything loads)."""
    checks = [("draws", args.draws, int, "> 0"), ("batch_size", args.batch_size, int, "> 0"),
              ("num_workers", args.num_workers, int, ">= 0"), ("seed", args.seed, int, ">= 0")]
    checks += [("fewshot", k, int, "> 0") for k in args.fewshot]
    checks += [("test_limit", args.test_limit, int, "> 0")] if args.test_limit is not None else []
    checks += [("l2_reg", args.l2_reg, float, ">= 0")] if args.l2_reg is not None else []
    for name, value, kind, rule in checks:
        check_number(name, value, kind, rule)


def run_eval(args: argparse.Namespace) -> int:
    import torch

    import vitzoo
    from vitzoo import data as datasets
    from vitzoo import evaluate
    from vitzoo.train.distributed import pick_device

    _check_eval_numbers(args)
    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no saved model (config.json); a finished run or a "
                                "save_pretrained directory is needed")
    data, data_dir = args.data, args.data_dir
    saved_run = model_dir / "train_config.json"
    if saved_run.exists():
        trained = TrainConfig.from_json(saved_run.read_text(encoding="utf-8"))
        data = data or trained.data
        data_dir = data_dir or (trained.data_dir if data == trained.data else None)
    if data is None:
        raise ConfigError("--data is needed: the model directory does not say which dataset it was trained on")
    datasets.check_data(data, data_dir, download=args.download)
    model = vitzoo.from_pretrained(model_dir).to(pick_device(args.device)).eval()
    config = model.config
    torch.manual_seed(args.seed)
    transform = datasets.build_transform(config.img_size, None)
    load = dict(img_size=config.img_size, in_chans=config.in_chans, seed=args.seed)
    train_set = datasets.Transformed(datasets.load_split(data, "train", data_dir, **load), transform)
    test_raw = datasets.subset(datasets.load_split(data, "test", data_dir, **load), args.test_limit, args.seed)
    test_set = datasets.Transformed(test_raw, transform)
    result: dict[str, Any] = {"model_dir": str(model_dir), "data": data, "test_images": len(test_set)}
    result.update({f"test_{k}": v for k, v in evaluate.accuracy(model, test_set, batch_size=args.batch_size,
                                                                 num_workers=args.num_workers).items()})
    if args.fewshot:
        l2 = args.l2_reg if args.l2_reg is not None else evaluate.FEWSHOT_L2_REG
        shots = evaluate.fewshot_linear_accuracy(model, train_set, test_set, args.fewshot, draws=args.draws,
                                                 seed=args.seed, l2_reg=l2, batch_size=args.batch_size,
                                                 num_workers=args.num_workers, details=True)
        result["fewshot"] = {str(k): v for k, v in shots.items()}
        result["fewshot_l2_reg"] = l2
    if args.linear_probe:
        result["linear_probe"] = evaluate.linear_probe(model, train_set, test_set, batch_size=args.batch_size,
                                                       num_workers=args.num_workers)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{model_dir} on {data} ({len(test_set)} test images): top-1 {result['test_top1']:.4f}, "
          f"top-5 {result['test_top5']:.4f}, loss {result['test_loss']:.4f}")
    for k, v in result.get("fewshot", {}).items():
        print(f"  {k:>3}-shot linear: {v['mean']:.4f} +- {v['std']:.4f} ({args.draws} draws)")
    if "linear_probe" in result:
        print(f"  linear probe: {result['linear_probe']['top1']:.4f}")
    sys.stdout.flush()
    return 0
