"""`vitzoo train MODEL ...`.

Every TrainConfig field is a flag (`--batch-size`, ...), every ViTConfig field a model option
flag (`--img-size`, `--pos-embed`, ...) and every component's own options a flag named by its part
(`--stem resnet --stem.layers 3,4,6`), all generated from the dataclasses' fields (`vitzoo.flags`).
Only the flags given are set: `--resume RUN` changes only those of the saved train_config.json.

    vitzoo train vit_ti16 --data fashion-mnist --img-size 28 --patch-size 7 --out runs/a
    torchrun --nproc_per_node 8 -m vitzoo train vit_b16 --data DIR --recipe paper-pretrain
    vitzoo train vit_b16 --pretrained runs/a --recipe paper-finetune --img-size 384 ...
    vitzoo train vit_s16 --stem convstem --stem.extra-layers 1 ...   # a plugin's stem and option
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from vitzoo.config import PART_OPTIONS, ViTConfig, merge_options
from vitzoo.errors import ConfigError
from vitzoo.flags import add_dataclass_flags
from vitzoo.registry import COMPONENT_KINDS, get_registry, options_class
from vitzoo.train.config import (
    DECODES,
    DEVICES,
    OPTIMIZERS,
    PRECISIONS,
    RECIPES,
    SCHEDULES,
    TrainConfig,
)

CHOICES = {"recipe": tuple(RECIPES), "optimizer": OPTIMIZERS, "schedule": SCHEDULES,
           "device": DEVICES, "precision": PRECISIONS, "decode": DECODES}
NOT_FLAGS = {"model", "model_options", "resume", "out"}  # positional / handled by hand


MODEL_PREFIX = "model__"
PART_PREFIX = "part__"  # part__stem__layers: stem_options["layers"]


def add_part_flags(parser: argparse.ArgumentParser) -> None:
    """A group of flags per registered component with options of its own: `--PART.OPTION` (the
    part's name, a dot, the option's name with dashes), stored as PART_PREFIX + part + "__" +
    option. One flag serves every component of a part with an option of that name (first's type)."""
    registry = get_registry()
    for kind in COMPONENT_KINDS:
        taken: set[str] = set()
        for name in registry.names(kind):
            declared = options_class(registry.get(kind, name), kind, name)
            if declared is None:
                continue
            fields = [f for f in declared.field_names() if f not in taken]
            taken.update(fields)
            group = parser.add_argument_group(f"{kind} {name!r} options (with "
                                              f"--{kind.replace('_', '-')} {name}; "
                                              f"{PART_OPTIONS[kind]} of vitzoo.create)")
            add_dataclass_flags(group, declared, exclude=set(declared.field_names()) - set(fields),
                                dest_prefix=f"{PART_PREFIX}{kind}__",
                                flag_prefix=f"--{kind.replace('_', '-')}.",
                                defaults=declared() if _constructible(declared) else None)


def _constructible(declared) -> bool:
    try:
        declared()
    except ConfigError:  # an option without a usable default (the MLP head's width)
        return False
    return True


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train or fine-tune a model (torchrun for several processes)",
                       description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                   help="model name or pretrained tag (vitzoo list); default vit_ti16, or the tag "
                        "--pretrained names")
    p.add_argument("--out", default=argparse.SUPPRESS, help="run directory (default runs/<model>)")
    p.add_argument("--resume", nargs="?", const=True, default=argparse.SUPPRESS, metavar="RUN",
                   help="continue the run RUN (or --out) from its last checkpoint, with its saved "
                        "settings")
    add_dataclass_flags(p.add_argument_group("training options"), TrainConfig, exclude=NOT_FLAGS,
                        choices=CHOICES)
    add_dataclass_flags(p.add_argument_group("model options (ViTConfig fields, passed to "
                                             "vitzoo.create; default: the named model's: vitzoo "
                                             "info MODEL)"), ViTConfig,
                        exclude=set(PART_OPTIONS.values()), dest_prefix=MODEL_PREFIX,
                        show_defaults=False)
    add_part_flags(p)
    p.set_defaults(func=run_train)



def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = vars(args)
    model_options = {k[len(MODEL_PREFIX):]: v for k, v in given.items()
                     if k.startswith(MODEL_PREFIX)}
    for dest, value in given.items():
        if dest.startswith(PART_PREFIX):
            kind, option = dest[len(PART_PREFIX):].split("__", 1)
            model_options.setdefault(PART_OPTIONS[kind], {})[option] = value
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - NOT_FLAGS
    train = {k: v for k, v in given.items() if k in fields}
    resume = given.get("resume")
    if resume:
        run = Path(resume if isinstance(resume, str) else given.get("out", ""))
        if not str(run) or not (run / "train_config.json").exists():
            raise FileNotFoundError(f"--resume: no run to continue at {run!s:.200} (no "
                                    "train_config.json)")
        saved = TrainConfig.from_json((run / "train_config.json").read_text(encoding="utf-8"))
        options = merge_options(saved.model_options, model_options)
        if "model" in given and given["model"] != saved.model:
            raise ConfigError(f"--resume {run}: the run trains {saved.model}, not {given['model']}")
        # stop_at belongs to one invocation: a resumed run goes on to the end unless told otherwise
        return dataclasses.replace(saved, **{"stop_at": None, **train}, model_options=options,
                                   out=str(run), resume=True)
    # no model named: the one --pretrained holds when it is a tag (fine-tuning in one command)
    pretrained = str(train.get("pretrained") or "")
    default = pretrained.split("@")[0] if pretrained.split("@")[0] in vitzoo_tags() else "vit_ti16"
    model = given.get("model", default)
    return TrainConfig(model=model, model_options=model_options,
                       out=given.get("out", f"runs/{model}"), **train)


def vitzoo_tags() -> list[str]:
    from vitzoo.registry import list_pretrained

    return list_pretrained()


def run_train(args: argparse.Namespace) -> int:
    from vitzoo.train import fit

    summary = fit(config_from_args(args))
    if summary["status"] == "interrupted":
        import signal

        return 128 + int(getattr(signal, summary["signal"]))
    return 0
