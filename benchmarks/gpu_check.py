"""python -m benchmarks gpu-check [--out DIR] [--only STEP]: the first command on a CUDA machine.

Its steps, each within its limit (`LIMITS`, 9 minutes together), run on after one fails: the
environment (torch, CUDA, every GPU, the driver); the tests only a GPU runs; 200 steps of ViT-S/16
compiled in the GPU's half precision through `vitzoo train`; the rehearsal of three ablations over
every GPU; speed against timm and torchvision (benchmarks/speed.py); the input pipeline decoded on
the GPU and in workers; ViT-B/16 training's model FLOP utilisation. It writes DIR/gpu_check.json
and DIR/README.md after every step and exits 0 only if every step passed; without a CUDA GPU it
says why and exits 2. It runs from a checkout with no install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

import vitzoo
from benchmarks import speed
from benchmarks.suite import environment as recorded_environment
from vitzoo.argvalues import ArgumentParser
from vitzoo.io import write_text
from vitzoo.precision import half_of, native_bf16

CHECKOUT = Path(__file__).resolve().parents[1]
OUT = Path("runs") / "gpu-check"
REHEARSED = ("head", "data", "inspect")
# seconds each step may take (a first compile on a fresh machine is most of `training`)
LIMITS = {"environment": 10, "cuda_tests": 60, "training": 70, "rehearsal": 200, "speed": 40,
          "loader": 50, "mfu": 110}
# dense bf16 tensor-core peaks (TFLOP/s, NVIDIA's datasheets) by a pattern of the GPU's name
PEAK_BF16_TFLOPS = [(r"H100.*PCIe", 756.0), (r"H100.*NVL", 835.0), (r"H100", 989.0),
                    (r"H200.*NVL", 835.0), (r"H200", 989.0), (r"B200", 2250.0), (r"A100", 312.0),
                    (r"L40S", 362.0), (r"L40\b", 181.0), (r"\bL4\b", 121.0), (r"\bA10\b", 125.0),
                    (r"\bA40\b", 150.0)]
MFU_CASE = speed.Case("vit_b16", {"timm": speed.timm("vit_base_patch16_224")})


def peak_tflops(device_name: str) -> float | None:
    return next((peak for pattern, peak in PEAK_BF16_TFLOPS
                 if re.search(pattern, device_name, re.IGNORECASE)), None)


def no_gpu_reason() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    build = " (a CPU build of torch)" if torch.version.cuda is None else ""
    return None if torch.cuda.is_available() else "torch sees no CUDA GPU" + build


def run_child(argv: list[str], limit: float) -> dict[str, Any]:
    """A step's command in this checkout, killed over its limit; the tail of what it printed."""
    path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, *argv], cwd=CHECKOUT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": path}, timeout=limit)
    except subprocess.TimeoutExpired as exc:  # where it hung: the end of what it printed
        printed = exc.stdout.decode(errors="replace") if exc.stdout else ""
        raise TimeoutError(f"{exc}\n{printed[-3000:]}") from None
    tail = (done.stdout + done.stderr)[-4000:]
    if done.returncode != 0:
        raise RuntimeError(f"exit code {done.returncode}: {' '.join(argv)}\n{tail}")
    return {"command": " ".join(argv), "output_tail": tail}


# ---------------------------------------------------------------- the steps
def environment(out: Path) -> dict[str, Any]:
    """Every GPU, the driver and CUDA (the machine's record holds torch and the first GPU)."""
    gpus = [{"name": torch.cuda.get_device_name(i),
             "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
             "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
             "native_bf16": native_bf16(torch.device("cuda", i))}
            for i in range(torch.cuda.device_count())]
    smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    driver = subprocess.run(smi, capture_output=True, text=True).stdout.split() if (
        shutil.which("nvidia-smi")) else []
    return {"cuda": torch.version.cuda, "driver": (driver or [None])[0], "gpus": gpus}


def cuda_tests(out: Path) -> dict[str, Any]:
    result = run_child(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_devices.py",
                        "tests/test_distributed_devices.py", "tests/test_decode_on_device.py"],
                       LIMITS["cuda_tests"])
    passed = [line for line in result["output_tail"].splitlines() if " passed" in line]
    return {**result, "summary": passed[-1].strip("= ") if passed else ""}


def training(out: Path) -> dict[str, Any]:
    """200 steps of ViT-S/16 through `vitzoo train`, compiled, in its default precision on a GPU:
    the GPU's half precision."""
    run = out / "training"
    result = run_child(["-m", "vitzoo", "train", "vit_s16", "--data", "synthetic", "--steps", "200",
                        "--batch-size", "64", "--compile", "--device", "cuda", "--num-workers",
                        "8", "--log-every", "20", "--checkpoint-every", "0", "--out", str(run),
                        "--quiet", "--no-tensorboard"], LIMITS["training"])
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    losses = [entry["loss"] for entry in logged]
    if not losses or not losses[-1] < losses[0]:
        raise RuntimeError(f"the run did not train: losses {losses}")
    # the first logged interval holds the compilation; the rate after it is the GPU's
    compiled = sorted(entry["images_per_s"] for entry in logged[1:]) or [0.0]
    return {"images_per_s_compiled": compiled[len(compiled) // 2], "loss_first": losses[0],
            "loss_last": losses[-1], "command": result["command"]}


def rehearsal(out: Path) -> dict[str, Any]:
    folder = out / "rehearsal"
    run_child(["-m", "benchmarks", *REHEARSED, "--scale", "rehearsal", "--device", "cuda",
               "--seeds", "1", "--gpus-per-run", str(torch.cuda.device_count()), "--out",
               str(folder), "--quiet"], LIMITS["rehearsal"])
    read = lambda name, file: json.loads((folder / name / file).read_text())  # noqa: E731
    runs = [r for name in REHEARSED for r in read(name, "results.json")["runs"]]
    return {"runs": len(runs), "world_sizes": sorted({r["world_size"] for r in runs}),
            "verdicts": {name: [f["verdict"] for f in read(name, "findings.json")["findings"]]
                         for name in REHEARSED}}


def speed_step(out: Path) -> dict[str, Any]:
    """ViT-B/16 inference and a ViT-S/16 training step, batch 64, in the GPU's half precision."""
    device = torch.device("cuda", 0)
    half = {name: dtype for name, dtype in speed.precisions(device).items() if dtype}
    (inference,) = speed.inference(speed.VIT_B16, [64], 10, device, half)
    (step,) = speed.training(speed.VIT_S16, 64, 5, device, half)
    rates = {f"{key}_batch64": {k: round(v["images_per_s"], 1) for k, v in row["speeds"].items()}
             for key, row in (("inference_vit_b16", inference), ("training_vit_s16", step))}
    return {"dtype": inference["dtype"], **rates, "peak_memory_gb": step["peak_memory_gb"],
            "max_abs_logit_diff": inference["max_abs_logit_diff"]}


def loader(out: Path) -> dict[str, Any]:
    """The input pipeline's images/s on GPU 0, decoded there and in 8 workers."""
    from benchmarks.loader import PhotoSpec, device_rates, photo_folder

    device = torch.device("cuda", 0)
    photos = photo_folder(out / "loader-photos", PhotoSpec(images=128), device=device)
    return {**device_rates(photos, device), "cpus": os.cpu_count()}


def training_mfu(device: torch.device, case: speed.Case = MFU_CASE, batch: int = 256,
                 reps: int = 10, compile: bool = True) -> dict[str, Any]:
    """A training step of vitzoo and timm on the same weights, interleaved, in the device's half
    precision with AdamW fused: images/s, TFLOP/s (the paper's FLOPs) and the share of the GPU's
    dense bf16 peak (none for a GPU not in `PEAK_BF16_TFLOPS`)."""
    model, peers, _ = speed.models(case, device)
    flops = float(vitzoo.count_flops(model.config, backward=True))
    steps = {name: speed.train_step(torch.compile(m) if compile else m, batch, case.img_size,
                                    half_of(device), device, fused=True)
             for name, m in {"vitzoo": model, **peers}.items()}
    peak = peak_tflops(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    result: dict[str, Any] = {"batch": batch, "gflops_per_image": round(flops / 1e9, 2),
                              "peak_bf16_tflops": peak}
    for name, timed in speed.interleaved(steps, reps, batch, device).items():
        tflops = timed["images_per_s"] * flops / 1e12
        result[name] = {"images_per_s": round(timed["images_per_s"], 1), "tflops": round(tflops, 1),
                        "mfu": None if peak is None else round(tflops / peak, 4)}
    return result


def mfu(out: Path) -> dict[str, Any]:
    """ViT-B/16 at batch 256, compiled, in a child process: a compilation that hangs is killed."""
    written = out / "mfu.json"
    written.unlink(missing_ok=True)
    run_child(["-c", "import sys, json, torch; from benchmarks.gpu_check import training_mfu; "
               "open(sys.argv[1], 'w').write(json.dumps(training_mfu(torch.device('cuda', 0))))",
               str(written)], LIMITS["mfu"])
    return json.loads(written.read_text())


STEPS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "environment": environment, "cuda_tests": cuda_tests, "training": training,
    "rehearsal": rehearsal, "speed": speed_step, "loader": loader, "mfu": mfu}


# ---------------------------------------------------------------- the record
def report(results: dict[str, Any]) -> str:
    lines = ["# gpu-check", "", f"{results['date']}, {results['verdict']} in "
             f"{results['minutes']:.1f} min (`python -m benchmarks gpu-check`, commit "
             f"{results['commit']}).", "", "| step | status | seconds | figures |",
             "|---|---|---|---|"]
    hidden = ("status", "seconds", "error", "output_tail", "command")
    for name, step in results["steps"].items():
        figures = json.dumps({k: v for k, v in step.items() if k not in hidden})[:400]
        lines.append(f"| {name} | {step['status']} | {step['seconds']:.0f} | "
                     f"{figures.replace('|', '/')} |")
    for name, step in results["steps"].items():
        if step["status"] != "passed":
            lines += ["", f"## {name}: {step['status']}", "", "```", step["error"][-3000:], "```"]
    return "\n".join(lines) + "\n"


def write_results(out: Path, steps: dict[str, Any], start: float, finished: bool) -> bool:
    """DIR/gpu_check.json and DIR/README.md of the steps so far; whether every step passed."""
    failed = ", ".join(n for n, s in steps.items() if s["status"] != "passed")
    verdict = (f"FAILED: {failed}" if failed else "all passed") if finished else (
        f"running (done: {', '.join(steps)})")
    env = recorded_environment("cuda")
    results = {"verdict": verdict, "minutes": (time.perf_counter() - start) / 60,
               "date": env["date"], "commit": env["commit"], "environment": env, "steps": steps}
    write_text(out / "gpu_check.json", json.dumps(results, indent=1, default=str) + "\n")
    write_text(out / "README.md", report(results))
    if finished:
        print(report(results))
    return not failed


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks gpu-check",
                            description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the results (default {OUT})")
    parser.add_argument("--only", action="append", choices=tuple(STEPS),
                        help="run only this step (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (reason := no_gpu_reason()) is not None:
        print(f"gpu-check: no GPU to check: {reason}. Run it on a machine with a CUDA GPU.",
              file=sys.stderr)
        return 2
    out, start, steps = args.out.resolve(), time.perf_counter(), {}
    out.mkdir(parents=True, exist_ok=True)
    for name in [n for n in STEPS if not args.only or n in args.only]:
        print(f"== {name}", flush=True)
        began = time.perf_counter()
        try:
            steps[name] = {"status": "passed", **STEPS[name](out)}
        except Exception as exc:  # a failed step is reported, and the others still run
            steps[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}\n"
                                                        f"{traceback.format_exc()[-2000:]}"}
        steps[name]["seconds"] = round(time.perf_counter() - began, 1)
        print(f"   {steps[name]['status']} in {steps[name]['seconds']:.0f} s", flush=True)
        write_results(out, steps, start, finished=False)
    return 0 if write_results(out, steps, start, finished=True) else 1
