"""`vitzoo train MODEL ...`: every TrainConfig field a flag, every ViTConfig field a model flag and
every component's own option a flag named by its part (`--stem resnet --stem.layers 3,4,6`), all
made from the dataclasses' fields (`vitzoo.flags`). Only the flags given are set: `--resume RUN`
changes only those of the run's train_config.json.

    vitzoo train vit_ti16 --data fashion-mnist --img-size 28 --patch-size 7 --out runs/a
    torchrun --nproc_per_node 8 -m vitzoo train vit_b16 --data DIR --recipe paper-pretrain
    vitzoo train vit_b16 --pretrained runs/a --recipe paper-finetune --img-size 384 ...
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
from pathlib import Path

from vitzoo.config import PART_OPTIONS, ViTConfig, merge_options
from vitzoo.errors import ConfigError
from vitzoo.flags import add_dataclass_flags
from vitzoo.registry import COMPONENT_KINDS, get_registry
from vitzoo.train.config import TrainConfig

NOT_FLAGS = {"model", "model_options", "resume", "out"}  # positional, or their own flags
MODEL, PART = "model__", "part__"  # the destinations of model flags and part__KIND__OPTION


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train or fine-tune a model (torchrun for several processes)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                   help="model name or pretrained tag (vitzoo list); default vit_ti16, or the "
                        "tag --pretrained names")
    p.add_argument("--out", default=argparse.SUPPRESS, help="run directory (default runs/MODEL)")
    p.add_argument("--resume", nargs="?", const=True, default=argparse.SUPPRESS, metavar="RUN",
                   help="continue the run RUN (or --out) from its last checkpoint")
    add_dataclass_flags(p.add_argument_group("training options"), TrainConfig, exclude=NOT_FLAGS)
    add_dataclass_flags(p.add_argument_group("model options (default: the named model's, vitzoo "
                                             "info MODEL)"), ViTConfig, dest_prefix=MODEL,
                        exclude=set(PART_OPTIONS.values()), show_defaults=False)
    registry = get_registry()
    for kind in COMPONENT_KINDS:  # one flag serves every component with an option of that name
        taken: set[str] = set()
        for name in registry.names(kind):
            declared = getattr(registry.get(kind, name), "Options", None)
            if declared is None:
                continue
            flag = "--" + kind.replace("_", "-")
            group = p.add_argument_group(f"{kind} {name!r} options (with {flag} {name})")
            dests = add_dataclass_flags(group, declared, exclude=taken, show_defaults=False,
                                        dest_prefix=f"{PART}{kind}__", flag_prefix=flag + ".")
            taken |= {dest.rsplit("__", 1)[1] for dest in dests}
    p.set_defaults(func=run_train)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = vars(args)
    options = {k[len(MODEL):]: v for k, v in given.items() if k.startswith(MODEL)}
    for dest, value in given.items():
        if dest.startswith(PART):
            kind, option = dest[len(PART):].split("__", 1)
            options.setdefault(PART_OPTIONS[kind], {})[option] = value
    train = {k: given[k] for k in set(TrainConfig.field_names()) - NOT_FLAGS if k in given}
    if resume := given.get("resume"):
        run = Path(resume if isinstance(resume, str) else given.get("out", "."))
        saved = TrainConfig.from_json((run / "train_config.json").read_text(encoding="utf-8"))
        if given.get("model", saved.model) != saved.model:
            raise ConfigError(f"--resume {run}: the run trains {saved.model}, not {given['model']}")
        # stop_at belongs to one invocation: a resumed run goes on to the end unless told again
        return dataclasses.replace(saved, **{"stop_at": None, **train}, out=str(run), resume=True,
                                   model_options=merge_options(saved.model_options, options))
    from vitzoo.registry import list_pretrained

    tag = str(train.get("pretrained") or "").split("@")[0]  # no model: the tag's (fine-tuning)
    model = given.get("model", tag if tag in list_pretrained() else "vit_ti16")
    return TrainConfig(model=model, model_options=options, out=given.get("out", f"runs/{model}"),
                       **train)


def run_train(args: argparse.Namespace) -> int:
    from vitzoo.train import fit

    summary = fit(config_from_args(args))
    if summary["status"] == "interrupted":  # the exit status says which signal
        return 128 + int(getattr(signal, summary["signal"]))
    return 0
