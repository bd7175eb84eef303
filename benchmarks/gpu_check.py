"""python -m benchmarks gpu-check [--out DIR]: the first command on a machine with CUDA GPUs.

Each step has its own time limit, 9 minutes together on one GPU (`LIMITS`; every step took 6.1 minutes
together on an H200 on 2026-11-27, the rehearsal 142 s of them). It runs, and goes on after a step fails:

1. `environment`: torch and its CUDA, every GPU's name and compute capability, whether this build has
   kernels for it, native bf16, the driver (nvidia-smi);
2. `cuda_tests`: the tests that only a GPU can run (tests/test_devices.py, tests/test_distributed_devices.py,
   tests/test_decode_on_device.py);
3. `training`: 200 steps of ViT-S/16 on synthetic 224-px images, bf16 autocast (fp16 where bf16 is only
   emulated) and torch.compile, through `vitzoo train`: images/s over the run and, after the first
   logged interval (which holds the compilation), the median rate; and the loss going down;
4. `rehearsal`: the paper-scale code path shrunk (`--scale rehearsal`, benchmarks/scales.py) on the
   GPUs through the local elastic launcher, for the head, data and inspect ablations with one seed
   (15 runs, each a job over every visible GPU: `--gpus-per-run` their count);
5. `speed`: ViT-B/16 inference (batch 64) and a ViT-S/16 training step (batch 64) against timm and
   torchvision on the same weights, in the precision `vitzoo.inference.for_inference` picks, with every
   scaled_dot_product_attention kernel forced in turn;
6. `loader`: the training input pipeline's images/s at 128 and 224 px (the gpu and paper scales) on
   ImageNet-sized JPEGs it writes, decoded on the GPU (`--decode device`: 8 workers reading bytes) and
   in 8 workers (the path before), and the GPU's own decoding rate (benchmarks/gpu_steps.py);
7. `mfu`: a ViT-B/16 training step at batch 256, bf16 autocast, compiled, vitzoo against timm in one
   process on the same weights, with each one's model FLOP utilisation against the GPU's dense bf16
   peak (a GPU not in benchmarks/gpu_steps.py's table: said, no MFU).

It writes DIR/gpu_check.json (every figure, every step's status and output tail) and DIR/README.md
after every step (a check killed midway keeps the steps it finished), and exits 0 only if every step
passed. Without a CUDA GPU it says why and exits 2. It runs from a checkout with no install
(`PYTHONPATH=. python -m benchmarks gpu-check`), needing torch, torchvision, timm, pytest and
matplotlib; a tree copied without its .git records the commit that VITZOO_COMMIT names.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from vitzoo.io import write_text

CHECKOUT = Path(__file__).resolve().parents[1]
OUT = Path("runs") / "gpu-check"
REHEARSED = ("head", "data", "inspect")
# seconds each step may take at most (a first compile on a fresh machine is most of `training`)
LIMITS = {"environment": 10, "cuda_tests": 60, "training": 70, "rehearsal": 200, "speed": 30, "loader": 50, "mfu": 120}
LOADER_PHOTOS = 128  # ImageNet-sized JPEGs the loader step writes (drawn on the GPU: seconds)


def no_gpu_reason() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    if torch.cuda.is_available():
        return None
    from vitzoo.train.distributed import cuda_unavailable

    return cuda_unavailable() or "no CUDA GPU is visible to this torch (torch.cuda.is_available() is False)"


def child_env() -> dict[str, str]:
    """The environment of a step's child process: the checkout importable, nothing installed needed."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(CHECKOUT) + (os.pathsep + path if path else "")}


def run_child(argv: list[str], limit: float) -> dict[str, Any]:
    """A step's command, with its exit code and the tail of what it printed; over its limit it is killed."""
    try:
        done = subprocess.run([sys.executable, *argv], cwd=CHECKOUT, env=child_env(), capture_output=True, text=True,
                              timeout=limit)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        raise TimeoutError(f"over its limit of {limit:.0f} s: {' '.join(argv)}\n{out[-3000:]}") from None
    tail = (done.stdout + done.stderr)[-4000:]
    if done.returncode != 0:
        raise RuntimeError(f"exit code {done.returncode}: {' '.join(argv)}\n{tail}")
    return {"command": " ".join(argv), "output_tail": tail}


# ---------------------------------------------------------------------------- the steps
def environment(out: Path) -> dict[str, Any]:
    from vitzoo.precision import native_bf16
    from vitzoo.train.distributed import unsupported_gpu

    gpus = []
    for i in range(torch.cuda.device_count()):
        device = torch.device("cuda", i)
        gpus.append({"index": i, "name": torch.cuda.get_device_name(i),
                     "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                     "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                     "native_bf16": native_bf16(device), "unsupported": unsupported_gpu(i)})
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        smi = []
    problems = [g["unsupported"] for g in gpus if g["unsupported"]]
    if problems:
        raise RuntimeError("; ".join(problems))
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "arch_list": torch.cuda.get_arch_list(),
            "driver": smi[0] if smi else None, "gpus": gpus}


def cuda_tests(out: Path) -> dict[str, Any]:
    result = run_child(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_devices.py",
                        "tests/test_distributed_devices.py", "tests/test_decode_on_device.py"], LIMITS["cuda_tests"])
    summary = next((line for line in reversed(result["output_tail"].splitlines()) if " passed" in line), "")
    return {**result, "summary": summary.strip("= ")}


def training(out: Path) -> dict[str, Any]:
    from vitzoo.precision import flag, gpu_half

    precision = flag(gpu_half(torch.device("cuda", 0)))
    run = out / "training"
    result = run_child(["-m", "vitzoo", "train", "vit_s16", "--data", "synthetic", "--steps", "200", "--batch-size", "64",
                        "--precision", precision, "--compile", "--device", "cuda", "--num-workers", "8", "--log-every", "20",
                        "--checkpoint-every", "0", "--out", str(run), "--quiet", "--no-tensorboard"], LIMITS["training"])
    summary = json.loads((run / "summary.json").read_text())
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    losses = [entry["loss"] for entry in logged]
    if summary["status"] != "finished" or not losses or not losses[-1] < losses[0]:
        raise RuntimeError(f"the run did not train: status {summary['status']}, losses {losses}")
    # the first logged interval holds the compilation; the rate after it is the GPU's
    compiled = sorted(entry["images_per_s"] for entry in logged[1:])
    return {"precision": precision, "steps": summary["step"], "images_per_s": round(summary["images_per_s"], 1),
            "images_per_s_compiled": round(compiled[len(compiled) // 2], 1) if compiled else None,
            "first_interval_seconds": round(logged[0]["train_seconds"], 1),
            "train_seconds": round(summary["train_seconds"], 1), "wall_seconds": round(summary["wall_seconds"], 1),
            "loss_first": losses[0], "loss_last": losses[-1], "command": result["command"]}


def rehearsal(out: Path) -> dict[str, Any]:
    folder = out / "rehearsal"
    result = run_child(["-m", "benchmarks", *REHEARSED, "--scale", "rehearsal", "--device", "cuda", "--seeds", "1",
                        "--gpus-per-run", str(torch.cuda.device_count()), "--out", str(folder), "--quiet"], LIMITS["rehearsal"])
    runs = [r for name in REHEARSED for r in json.loads((folder / name / "results.json").read_text())["runs"]]
    verdicts = {name: [f["verdict"] for f in json.loads((folder / name / "findings.json").read_text())["findings"]]
                for name in REHEARSED}
    return {"ablations": list(REHEARSED), "runs": len(runs), "processes_per_run": sorted({r["processes"] for r in runs}),
            "world_sizes": sorted({r["world_size"] for r in runs}), "verdicts": verdicts,
            "plan": result["output_tail"].split("\n\n")[0][-1500:]}


def speed(out: Path) -> dict[str, Any]:
    """Images/s of vitzoo and its peers on one GPU (median of interleaved repetitions)."""
    import contextlib

    from benchmarks.speed_timing import (Case, check_parity, converted, interleaved, sdpa_backends,
                                         timm_model, torchvision_model, train_step_fn)
    from vitzoo.inference import for_inference
    from vitzoo.precision import autocast, half_of

    device = torch.device("cuda", 0)
    dtype = half_of(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    case = Case("vit_b16", {"timm": timm_model("vit_base_patch16_224"), "torchvision": torchvision_model("vit_b_16")})
    peers = {lib: build().eval() for lib, build in case.peers.items()}
    model = converted(peers["timm"], case).eval()
    parity = {lib: check_parity(peer, converted(peer, case), torch.randn(1, 3, 224, 224)) for lib, peer in peers.items()}
    model.to(device)
    for peer in peers.values():
        peer.to(device)
    x = torch.randn(64, 3, 224, 224, device=device)

    def runner(m, kernel=contextlib.nullcontext, mixed=dtype) -> Callable[[], None]:
        def run():
            with torch.inference_mode(), autocast(device, mixed), kernel():
                m(x)
        return run

    import copy

    contestants = {"vitzoo": runner(model), "vitzoo.fast": runner(for_inference(copy.deepcopy(model), compile=False), mixed=None),
                   **{lib: runner(peer) for lib, peer in peers.items()},
                   **{f"vitzoo[{name}]": runner(model, kernel) for name, kernel in sdpa_backends(device).items()}}
    inference = interleaved(contestants, reps=10, images=64, device=device)
    del peers, model, contestants
    torch.cuda.empty_cache()
    import timm

    vit_s = timm.create_model("vit_small_patch16_224").to(device)
    ours = converted(vit_s.cpu(), Case("vit_s16", {})).to(device)
    vit_s.to(device)
    steps = {"vitzoo": train_step_fn(ours, 64, 224, dtype, device, fused=True),
             "timm": train_step_fn(vit_s, 64, 224, dtype, device)}
    training_speed = interleaved(steps, reps=5, images=64, device=device)
    rate = lambda d: {k: round(v["images_per_s"], 1) for k, v in d.items()}  # noqa: E731
    return {"device": torch.cuda.get_device_name(device), "dtype": str(dtype).replace("torch.", ""),
            "inference_vit_b16_batch64": rate(inference), "training_vit_s16_batch64": rate(training_speed),
            "max_abs_logit_diff": parity}


def loader(out: Path) -> dict[str, Any]:
    """The input pipeline's images/s on GPU 0, decoded there and in the workers (benchmarks/gpu_steps.py)."""
    from benchmarks.gpu_steps import loader_rates
    from benchmarks.loader_data import PhotoSpec, mean_file_bytes, photo_folder

    device = torch.device("cuda", 0)
    photos = photo_folder(out / "loader-photos", PhotoSpec(images=LOADER_PHOTOS), device=device)
    return {**loader_rates(photos, device), "mean_file_bytes": round(mean_file_bytes(photos)), "cpus": os.cpu_count()}


def mfu(out: Path) -> dict[str, Any]:
    """ViT-B/16 training at batch 256 compiled, vitzoo and timm, in a child process (a compilation that
    hangs is killed at the step's limit)."""
    written = out / "mfu.json"
    written.unlink(missing_ok=True)
    run_child(["-m", "benchmarks.gpu_steps", "mfu", str(written)], LIMITS["mfu"])
    return json.loads(written.read_text())


STEPS: dict[str, Callable[[Path], dict[str, Any]]] = {"environment": environment, "cuda_tests": cuda_tests,
                                                      "training": training, "rehearsal": rehearsal, "speed": speed,
                                                      "loader": loader, "mfu": mfu}


def report(results: dict[str, Any]) -> str:
    lines = ["# gpu-check", "", f"{results['date']}, {results['verdict']} in {results['minutes']:.1f} min "
             f"(`python -m benchmarks gpu-check`, commit {results['commit']}).", "", "| step | status | seconds | figures |",
             "|---|---|---|---|"]
    for name, step in results["steps"].items():
        figures = {k: v for k, v in step.items() if k not in ("status", "seconds", "error", "output_tail", "command", "plan")}
        text = json.dumps(figures)[:400].replace("|", "/")
        lines.append(f"| {name} | {step['status']} | {step['seconds']:.0f} | {text} |")
    for name, step in results["steps"].items():
        if step["status"] != "passed":
            lines += ["", f"## {name}: {step['status']}", "", "```", step.get("error", "")[-3000:], "```"]
    return "\n".join(lines) + "\n"


def write_results(out: Path, steps: dict[str, Any], start: float, finished: bool) -> bool:
    """DIR/gpu_check.json and DIR/README.md for the steps done so far; whether every step passed."""
    from benchmarks.machine import environment as recorded_environment

    passed = all(s["status"] == "passed" for s in steps.values())
    failed = ", ".join(n for n, s in steps.items() if s["status"] != "passed")
    verdict = ("all passed" if passed else "FAILED: " + failed) if finished else f"running (done: {', '.join(steps)})"
    env = recorded_environment("cuda")
    results = {"verdict": verdict, "minutes": (time.perf_counter() - start) / 60, "date": env["date"],
               "commit": env["commit"], "environment": env, "steps": steps}
    write_text(out / "gpu_check.json", json.dumps(results, indent=1, default=str) + "\n")
    write_text(out / "README.md", report(results))
    if finished:
        print(report(results))
    return passed


def build_parser() -> argparse.ArgumentParser:
    from vitzoo.argvalues import ArgumentParser

    parser = ArgumentParser(prog="python -m benchmarks gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the results go (default {OUT})")
    parser.add_argument("--only", action="append", choices=tuple(STEPS), help="run only this step (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    reason = no_gpu_reason()
    if reason is not None:
        print(f"gpu-check: no GPU to check: {reason}. Run it on a machine with a CUDA GPU.", file=sys.stderr)
        return 2
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    steps: dict[str, Any] = {}
    for name, step in STEPS.items():
        if args.only and name not in args.only:
            continue
        print(f"== {name}", flush=True)
        began = time.perf_counter()
        try:
            steps[name] = {"status": "passed", **step(args.out)}
        except Exception as exc:  # a failed step is reported, and the others still run
            steps[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"}
        steps[name]["seconds"] = round(time.perf_counter() - began, 1)
        print(f"   {steps[name]['status']} in {steps[name]['seconds']:.0f} s", flush=True)
        write_results(args.out, steps, start, finished=False)
    passed = write_results(args.out, steps, start, finished=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
