"""`vitzoo eval RUN ...`: top-1 / top-5, few-shot linear and linear-probe accuracy of a saved model.

    vitzoo eval runs/a --data fashion-mnist --fewshot 1,5,10,25
    vitzoo eval weights/ --data /data/imagenet/val --linear-probe
    vitzoo eval runs/a --ema        # the moving average of a run trained with --model-ema
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.flags import parse_tuple
from vitzoo.options import check_number
from vitzoo.train.config import DEVICES, TrainConfig
from vitzoo.train.optim import EMA_WEIGHTS_NAME


def add_parser(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="top-1 / top-5, few-shot linear and linear-probe accuracy of a "
                                    "saved model")
    e.add_argument("model_dir", help="a run directory or any save_pretrained directory")
    e.add_argument("--data", default=None, help="dataset (default: the one the run was trained on)")
    e.add_argument("--data-dir", default=None, help="where the named dataset's files are (default "
                   "$VITZOO_CACHE/datasets)")
    e.add_argument("--download", action="store_true",
                   help="fetch a named dataset that is not there through "
                   "torchvision (MD5-verified)")
    e.add_argument("--fewshot", type=lambda t: parse_tuple(t, int, None), default=(),
                   metavar="K,K,...",
                   help="few-shot linear accuracy for these shots, e.g. 1,5,10,25")
    e.add_argument("--draws", type=int, default=5,
                   help="random draws of the k-shot sets to average")
    e.add_argument("--l2-reg", type=float, default=None,
                   help="few-shot ridge regulariser (default 2**10)")
    e.add_argument("--linear-probe", action="store_true",
                   help="also fit a logistic-regression probe")
    e.add_argument("--test-limit", type=int, default=None,
                   help="evaluate on the first N test images")
    e.add_argument("--batch-size", type=int, default=256, help="images per forward pass")
    e.add_argument("--num-workers", type=int, default=0, help="data loader worker processes")
    e.add_argument("--device", default="auto", choices=DEVICES,
                   help="where to evaluate (auto: a GPU when there is one)")
    e.add_argument("--seed", type=int, default=0,
                   help="random seed: the --test-limit subset, the few-shot draws, the probe")
    e.add_argument("--ema", action="store_true",
                   help=f"evaluate the run's moving average of the weights "
                   f"({EMA_WEIGHTS_NAME}, written by vitzoo train --model-ema) instead of its raw "
                   "weights")
    e.add_argument("--json", action="store_true", help="print JSON only")
    e.set_defaults(func=run_eval)


def _check_eval_numbers(args: argparse.Namespace) -> None:
    """eval's number options, checked as TrainConfig's are (a ConfigError before anything loads)."""
    checks = [("draws", args.draws, int, "> 0"), ("batch_size", args.batch_size, int, "> 0"),
              ("num_workers", args.num_workers, int, ">= 0"), ("seed", args.seed, int, ">= 0")]
    checks += [("fewshot", k, int, "> 0") for k in args.fewshot]
    checks += [("test_limit", args.test_limit, int, "> 0")] if args.test_limit is not None else []
    checks += [("l2_reg", args.l2_reg, float, ">= 0")] if args.l2_reg is not None else []
    for name, value, kind, rule in checks:
        check_number(name, value, kind, rule)


def read_weights(path: Path) -> dict:
    """A safetensors file's tensors; a damaged one is a CheckpointError naming it."""
    from safetensors.torch import load_file

    from vitzoo.weights.files import read_failed

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise read_failed(path, exc) from exc


def run_eval(args: argparse.Namespace) -> int:
    import torch

    import vitzoo
    from vitzoo import data as datasets
    from vitzoo import evaluate
    from vitzoo.train.distributed import pick_device

    _check_eval_numbers(args)
    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no saved model (config.json); a finished run "
                                "or a save_pretrained directory is needed")
    if args.ema and not (model_dir / EMA_WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"--ema: {model_dir} holds no moving average of the weights "
                                f"({EMA_WEIGHTS_NAME}); train with --model-ema to keep one, or "
                                "leave --ema out to evaluate the raw weights")
    data, data_dir = args.data, args.data_dir
    saved_run = model_dir / "train_config.json"
    if saved_run.exists():
        trained = TrainConfig.from_json(saved_run.read_text(encoding="utf-8"))
        data = data or trained.data
        data_dir = data_dir or (trained.data_dir if data == trained.data else None)
    if data is None:
        raise ConfigError("--data is needed: the model directory does not say which dataset it was "
                          "trained on")
    datasets.check_data(data, data_dir, download=args.download)
    model = vitzoo.from_pretrained(model_dir)
    if args.ema:  # the saved model's architecture, the average's weights
        model.load_state_dict(read_weights(model_dir / EMA_WEIGHTS_NAME), strict=True)
    model = model.to(pick_device(args.device)).eval()
    config = model.config
    torch.manual_seed(args.seed)
    transform = datasets.build_transform(config.img_size, None)
    load = dict(img_size=config.img_size, in_chans=config.in_chans, seed=args.seed)
    train_set = datasets.Transformed(datasets.load_split(data, "train", data_dir, **load),
                                     transform)
    test_raw = datasets.subset(datasets.load_split(data, "test", data_dir, **load), args.test_limit,
                               args.seed)
    test_set = datasets.Transformed(test_raw, transform)
    result: dict[str, Any] = {"model_dir": str(model_dir), "weights": "ema" if args.ema else "raw",
                              "data": data, "test_images": len(test_set)}
    top = evaluate.accuracy(model, test_set, batch_size=args.batch_size,
                            num_workers=args.num_workers)
    result.update({f"test_{k}": v for k, v in top.items()})
    if args.fewshot:
        l2 = args.l2_reg if args.l2_reg is not None else evaluate.FEWSHOT_L2_REG
        shots = evaluate.fewshot_linear_accuracy(model, train_set, test_set, args.fewshot,
                                                 draws=args.draws, seed=args.seed, l2_reg=l2,
                                                 batch_size=args.batch_size,
                                                 num_workers=args.num_workers, details=True)
        result["fewshot"] = {str(k): v for k, v in shots.items()}
        result["fewshot_l2_reg"] = l2
    if args.linear_probe:
        result["linear_probe"] = evaluate.linear_probe(model, train_set, test_set,
                                                       batch_size=args.batch_size,
                                                       num_workers=args.num_workers)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{model_dir}{' (EMA weights)' if args.ema else ''} on {data} ({len(test_set)} test "
          f"images): top-1 {result['test_top1']:.4f}, top-5 {result['test_top5']:.4f}, loss "
          f"{result['test_loss']:.4f}")
    for k, v in result.get("fewshot", {}).items():
        print(f"  {k:>3}-shot linear: {v['mean']:.4f} +- {v['std']:.4f} ({args.draws} draws)")
    if "linear_probe" in result:
        print(f"  linear probe: {result['linear_probe']['top1']:.4f}")
    sys.stdout.flush()
    return 0
