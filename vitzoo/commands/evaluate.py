"""`vitzoo eval RUN ...`: top-1 / top-5, few-shot linear and linear-probe accuracy of a saved model.

    vitzoo eval runs/a --data fashion-mnist --fewshot 1,5,10,25
    vitzoo eval weights/ --data /data/imagenet/val --linear-probe
    vitzoo eval runs/a --ema        # the moving average of a run trained with --model-ema
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from vitzoo.errors import ConfigError
from vitzoo.flags import add_dataclass_flags
from vitzoo.options import Options, option
from vitzoo.train.config import DEVICES
from vitzoo.train.optim import EMA_WEIGHTS_NAME


@dataclass
class EvalOptions(Options):
    """The options of `vitzoo eval`, checked as TrainConfig's are, before anything loads."""

    KIND = "evaluation"

    data: str | None = option(None, help="the dataset (default: the run's)")
    data_dir: str | None = option(None, help="where the named dataset's files are")
    download: bool = option(False, help="fetch a named dataset that is missing (MD5-checked)")
    fewshot: tuple[int, ...] = option((), help="few-shot linear accuracy of these shots, e.g. "
                                      "1,5,10,25", range="> 0")
    draws: int = option(5, help="random draws of the k-shot sets to average", range="> 0")
    l2_reg: float = option(2.0**10, help="the few-shot ridge regulariser", range=">= 0")
    linear_probe: bool = option(False, help="also fit a logistic-regression probe")
    test_limit: int | None = option(None, help="evaluate on the first N test images", range="> 0")
    batch_size: int = option(256, help="images per forward pass", range="> 0")
    num_workers: int = option(0, help="data loader worker processes", range=">= 0")
    device: str = option("auto", help="where to evaluate", choices=DEVICES)
    seed: int = option(0, help="the --test-limit subset, the few-shot draws", range=">= 0")
    ema: bool = option(False, help=f"evaluate the run's moving average ({EMA_WEIGHTS_NAME})")
    json: bool = option(False, help="print JSON only")


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="top-1 / top-5, few-shot linear and linear-probe accuracy of a "
                                    "saved model", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("model_dir", help="a run directory or any save_pretrained directory")
    add_dataclass_flags(e, EvalOptions)
    e.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from safetensors.torch import load_file

    import vitzoo
    from vitzoo import data as datasets
    from vitzoo import evaluate
    from vitzoo.train.config import TrainConfig
    from vitzoo.train.distributed import pick_device
    from vitzoo.weights.files import read_failed

    given = vars(args)
    opts = EvalOptions(**{k: given[k] for k in EvalOptions.field_names() if k in given})
    model_dir = Path(args.model_dir)
    data, data_dir = opts.data, opts.data_dir
    if (model_dir / "train_config.json").exists():
        trained = TrainConfig.from_json((model_dir / "train_config.json").read_text("utf-8"))
        data = data or trained.data
        data_dir = data_dir or (trained.data_dir if data == trained.data else None)
    if data is None:
        raise ConfigError("--data is needed: the model directory does not say its dataset")
    datasets.check_data(data, data_dir, download=opts.download)
    model = vitzoo.from_pretrained(model_dir)
    if opts.ema:  # the saved model's architecture, the average's weights
        try:
            model.load_state_dict(load_file(model_dir / EMA_WEIGHTS_NAME))
        except Exception as exc:  # safetensors raises its own types
            raise read_failed(model_dir / EMA_WEIGHTS_NAME, exc) from exc
    model = model.to(pick_device(opts.device)).eval()
    transform = datasets.build_transform(model.config.img_size, None)
    load = dict(img_size=model.config.img_size, in_chans=model.config.in_chans, seed=opts.seed)
    train_raw, test_raw = (datasets.load_split(data, split, data_dir, **load)
                           for split in ("train", "test"))
    train_set = datasets.Transformed(train_raw, transform)
    test_set = datasets.Transformed(datasets.subset(test_raw, opts.test_limit, opts.seed),
                                    transform)
    sizes = dict(batch_size=opts.batch_size, num_workers=opts.num_workers)
    result = {"model_dir": str(model_dir), "weights": "ema" if opts.ema else "raw", "data": data,
              "test_images": len(test_set)}
    result.update({f"test_{k}": v for k, v in evaluate.accuracy(model, test_set, **sizes).items()})
    if opts.fewshot:
        shots = evaluate.fewshot_linear_accuracy(model, train_set, test_set, opts.fewshot,
                                                 draws=opts.draws, seed=opts.seed,
                                                 l2_reg=opts.l2_reg, details=True, **sizes)
        result.update(fewshot={str(k): v for k, v in shots.items()}, fewshot_l2_reg=opts.l2_reg)
    if opts.linear_probe:
        result["linear_probe"] = evaluate.linear_probe(model, train_set, test_set, **sizes)
    if opts.json:
        print(json.dumps(result, indent=2), flush=True)
        return 0
    print(f"{model_dir}{' (EMA weights)' if opts.ema else ''} on {data} ({len(test_set)} test "
          f"images): top-1 {result['test_top1']:.4f}, top-5 {result['test_top5']:.4f}, loss "
          f"{result['test_loss']:.4f}")
    for k, v in result.get("fewshot", {}).items():
        print(f"  {k:>3}-shot linear: {v['mean']:.4f} +- {v['std']:.4f} ({opts.draws} draws)")
    if "linear_probe" in result:
        print(f"  linear probe: {result['linear_probe']['top1']:.4f}")
    return 0
