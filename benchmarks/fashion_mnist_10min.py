"""How good in 10 minutes: Fashion-MNIST test accuracy after 10 minutes of CPU training, for a small
ViT and a small hybrid (ResNet root + ViT). A benchmark, not a test.

    python benchmarks/fashion_mnist_10min.py --processes 2        # both, 10 minutes each
    python benchmarks/fashion_mnist_10min.py --minutes 1 --only vit_p4 --set model.embed_dim=96

`--processes 2` trains data-parallel in two one-thread processes (torchrun, gloo): these small
models use a second thread poorly. The clock counts training steps only (the schedule is sized to
it); the final evaluation on the 10,000 test images is not. Writes OUT/results.json (a run of the
same name replaces the earlier one) and OUT/README.md.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.suite import ResultStore, environment, markdown_table  # noqa: E402
from vitzoo.argvalues import ArgumentParser  # noqa: E402
from vitzoo.io import write_text  # noqa: E402
from vitzoo.train import TrainConfig, fit  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "fashion_mnist_10min"
TARGETS = {"vit_p4": 0.90, "hybrid_r1": 0.91}  # the best of each kind (fashion_mnist_10min/)
COMMON = dict(data="fashion-mnist", recipe="paper-pretrain", batch_size=128, weight_decay=0.05,
              warmup=0.05, schedule="linear", clip_grad=1.0, hflip=True, label_smoothing=0.0,
              seed=0, eval_every=0, checkpoint_every=0, log_every=50, precision="gpu-half")
# the transformer of both: D 64, 6 layers, 49 tokens and the class token
SMALL = dict(img_size=28, embed_dim=64, depth=6, num_heads=4, mlp_dim=128)
CONFIGS = {  # the hybrid's ResNet root and unit keep stride 4: a 7x7 map, patches of size 1
    "vit_p4": dict(model="vit_ti16", lr=2e-3, model_options=dict(SMALL, patch_size=4)),
    "hybrid_r1": dict(model="vit_ti16", lr=3e-3, label_smoothing=0.1, model_options=dict(
        SMALL, stem="resnet", stem_options={"layers": (1,)}, patch_size=1)),
}
COLUMNS = ["run", "model", "params", "budget (min)", "test top-1", "target", "epochs", "images/s",
           "train s", "wall s", "processes x threads", "torch", "commit", "date"]


def with_overrides(config: dict, overrides: list[str]) -> dict:
    """`key=value` (a TrainConfig field) or `model.key=value`; values are Python literals."""
    config = dict(config, model_options=dict(config["model_options"]))
    for item in overrides:
        key, _, text = item.partition("=")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        (config["model_options"] if key.startswith("model.") else config)[
            key.removeprefix("model.")] = value
    return config


def markdown(runs: list[dict]) -> str:
    lines = ["# Fashion-MNIST in 10 minutes of CPU training", "",
             "Written by `benchmarks/fashion_mnist_10min.py`. Test accuracy on the 10,000 "
             "Fashion-MNIST test images", "after a fixed budget of training time (the final "
             "evaluation is not counted). Targets: ViT >= 90%,", "hybrid >= 91%. Run as `python "
             "benchmarks/fashion_mnist_10min.py --processes 2` (data-parallel in two",
             "one-thread processes; the `processes x threads` column says how each row ran).", ""]
    rows = [[r["name"], r["model_summary"], f"{r['params']:,}", f"{r['minutes']:g}",
             f"{r['test_top1']:.4f}",
             f"{'met' if r['test_top1'] >= r['target'] else 'missed'} ({r['target']:.0%})",
             f"{r['epochs']:.2f}", f"{r['images_per_s']:.0f}", f"{r['train_seconds']:.0f}",
             f"{r['wall_seconds']:.0f}", f"{r['processes']} x {r['threads']}", r["torch"],
             r["commit"], r["date"]] for r in runs]
    lines += [markdown_table(COLUMNS, rows), "", "## Settings", ""]
    for r in runs:
        settings = {"train": r["settings"], "model": r["model_config"]}
        lines += [f"### {r['name']}", "", "```json",
                  json.dumps(settings, indent=1, sort_keys=True), "```", ""]
    return "\n".join(lines) + "\n"


def summary_of(mc: dict) -> str:
    root = f"ResNet root {tuple(mc['stem_options']['layers'])} + " if mc["stem"] == "resnet" else ""
    return (f"{root}ViT D{mc['embed_dim']} L{mc['depth']} H{mc['num_heads']} MLP{mc['mlp_dim']} "
            f"P{mc['patch_size']} @ {mc['img_size'][0]}px")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="training budget per model")
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append",
                        help="run only this model (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting of every run: lr=2e-3, model.depth=4, ...")
    parser.add_argument("--processes", type=int, default=1,
                        help="data-parallel processes of one thread each (torchrun, gloo)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or mps (default cpu)")
    parser.add_argument("--data-dir", default=None, help="Fashion-MNIST (default: Debian's)")
    parser.add_argument("--out", type=Path, default=OUT, help="the results' folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no messages")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.processes > 1 and "RANK" not in os.environ:  # this script again, under torchrun
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={args.processes}", __file__, *argv],
                              env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode
    store = ResultStore(args.out)
    for name in args.only or CONFIGS:
        config = with_overrides({**COMMON, **CONFIGS[name]}, args.set)
        summary = fit(TrainConfig(**config, time_budget_min=args.minutes, device=args.device,
                                  data_dir=args.data_dir, quiet=args.quiet, tensorboard=False))
        if int(os.environ.get("RANK", "0")) != 0:
            continue
        mc = summary["model_config"]
        store.add({"key": name, "name": name, "minutes": args.minutes, "target": TARGETS[name],
                   **{k: summary[k] for k in ("test_top1", "test_top5", "test_loss", "epochs",
                                              "images_per_s", "train_seconds", "wall_seconds",
                                              "params")},
                   "steps": summary["step"], "model_summary": summary_of(mc), "model_config": mc,
                   "settings": {k: v for k, v in summary["train_config"].items()
                                if k not in ("out", "quiet", "tensorboard")},
                   "processes": summary["world_size"], "cpu_count": os.cpu_count(),
                   **environment(args.device)})
        write_text(args.out / "README.md", markdown(store.runs))
        print(f"{name}: test top-1 {summary['test_top1']:.4f} after "
              f"{summary['train_seconds']:.0f} s ({summary['epochs']:.2f} epochs, "
              f"{summary['images_per_s']:.0f} images/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
