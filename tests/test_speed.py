"""Speed against timm and torchvision, gpu-check, and the Fashion-MNIST ten-minute benchmark."""

import json
import mmap
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as bench
from benchmarks import gpu_check, speed, suite

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = {"device", "torch", "commit", "cpu", "cpu_flags", "threads", "date"}


# ---------------------------------------------------------------- speed
@pytest.mark.slow
def test_speed_measures_every_contestant_on_the_same_weights(tmp_path):
    """`--quick`: both peers, vitzoo on their weights (their logits), images/s with a spread."""
    out = speed.main(quick=True, out=tmp_path / "speed")
    runs = json.loads((out / "results.json").read_text())["runs"]
    inference = [r for r in runs if r["kind"] == "inference"]
    assert {r["dtype"] for r in inference} == {"float32", "bf16"}
    for r in inference:  # in bf16 also vitzoo.fast, its weights cast once
        fast = {"vitzoo.fast"} if r["dtype"] == "bf16" else set()
        assert set(r["speeds"]) == {"vitzoo", "timm", "torchvision"} | fast
        assert all(s["min"] <= s["images_per_s"] <= s["max"] for s in r["speeds"].values())
        assert r["matmul_gflops_per_s"] > 0 and max(r["max_abs_logit_diff"].values()) < 1e-4
    for r in (r for r in runs if r["kind"] == "training"):
        assert set(r["peak_memory_gb"]) == set(r["speeds"]) == {"vitzoo", "timm", "torchvision"}
        assert all(gb > 0 for gb in r["peak_memory_gb"].values())
    assert all(ENVIRONMENT <= set(r) and r["key"] == speed.case_key(r, True) for r in runs)
    readme = (out / "README.md").read_text()  # every table
    assert "faster eager peer" in readme and "Training step" in readme and "ceilings" in readme
    assert (out / "speed.png").read_bytes()[:4] == b"\x89PNG"


def test_the_committed_records_keep_their_keys_and_regenerate_their_tables(tmp_path):
    """README.md and speed.png from results.json; under_load.md is a record nothing rewrites."""
    committed, out = suite.RESULTS / "speed", tmp_path / "speed"
    runs = json.loads((committed / "results.json").read_text())["runs"]
    assert runs and all(r["key"] == speed.case_key(r, r.get("quick", False)) for r in runs)
    out.mkdir()
    shutil.copy(committed / "results.json", out / "results.json")
    assert bench.main(["speed", "--report-only", "--quiet", "--out", str(tmp_path)]) == 0
    for name in ("README.md", "speed.png"):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), name
    assert not (out / "under_load.md").exists()


@pytest.mark.parametrize("command", [["speed"], ["gpu-check"]])
def test_help_prints_the_usage_without_measuring(command):
    done = subprocess.run([sys.executable, "-m", "benchmarks", *command, "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "usage:" in done.stdout and "--out" in done.stdout, done.stderr


def test_repetitions_rotate_and_count_each_call_s_page_faults():
    """No contestant always follows the same one: the C allocator's heap is shared."""
    calls, names = [], ["a", "b", "c"]

    def run(name):
        calls.append(name)
        if name == "c":  # 4096 fresh pages, each touched once
            with mmap.mmap(-1, 4096 * mmap.PAGESIZE) as fresh:
                fresh[::mmap.PAGESIZE] = b"\1" * 4096

    speeds = speed.interleaved({n: lambda n=n: run(n) for n in names}, 6, 1, torch.device("cpu"))
    timed = calls[len(names):]  # after one warm-up call each
    assert [timed[i * 3] for i in range(6)] == ["a", "b", "c"] * 2
    for n in names:
        assert {timed[i - 1] for i in range(1, len(timed)) if timed[i] == n} == set(names) - {n}
    assert speeds["c"]["page_faults_per_call"] >= 4096 > 100 > speeds["a"]["page_faults_per_call"]


def test_the_speed_benchmark_times_the_half_precision_the_device_computes(monkeypatch):
    assert list(speed.precisions(torch.device("cpu"))) == ["float32", "bf16"]
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: False)  # a T4 or a V100
    assert list(speed.precisions(torch.device("cuda", 0))) == ["float32", "fp16"]
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: True)  # an A100, an H100
    assert list(speed.precisions(torch.device("cuda", 0))) == ["float32", "bf16"]


# ---------------------------------------------------------------- gpu-check
def test_gpu_check_says_so_and_fails_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: gpu-check would run")
    assert bench.main(["gpu-check"]) == 2 and "no GPU to check" in capsys.readouterr().err


def test_gpu_check_reports_every_step_and_keeps_those_finished_when_stopped(monkeypatch, tmp_path):
    def broken(out):
        raise RuntimeError("the kernel is missing")

    def stopped(out):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "STEPS", {"first": lambda out: {"x": 1.5}, "second": broken})
    assert gpu_check.main(["--out", str(tmp_path / "a")]) == 1
    written = json.loads((tmp_path / "a" / "gpu_check.json").read_text())
    assert written["verdict"] == "FAILED: second" and written["steps"]["first"]["x"] == 1.5
    assert "the kernel is missing" in written["steps"]["second"]["error"]
    assert "| second | failed |" in (tmp_path / "a" / "README.md").read_text()
    monkeypatch.setattr(gpu_check, "STEPS", {"first": lambda out: {"x": 1.5}, "second": stopped})
    with pytest.raises(KeyboardInterrupt):  # killed at the device's time limit
        gpu_check.main(["--out", str(tmp_path / "b")])
    written = json.loads((tmp_path / "b" / "gpu_check.json").read_text())
    assert written["verdict"].startswith("running")
    assert written["steps"]["first"]["status"] == "passed"


def test_a_gpu_s_dense_bf16_peak_is_known_by_its_name_or_unknown():
    peaks = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA H200": 989.0,
             "NVIDIA GH200 480GB": 989.0, "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA L40S": 362.0,
             "NVIDIA L40": 181.0, "NVIDIA L4": 121.0, "NVIDIA GeForce RTX 4090": None}
    assert {name: gpu_check.peak_tflops(name) for name in peaks} == peaks


def test_gpu_check_s_steps_fit_nine_minutes_the_rehearsal_on_every_gpu(monkeypatch, tmp_path):
    assert set(gpu_check.LIMITS) == set(gpu_check.STEPS) and sum(gpu_check.LIMITS.values()) <= 540
    monkeypatch.setattr(gpu_check, "run_child", lambda argv, limit: sys.exit(argv))  # stop there
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    called = []
    for step in (gpu_check.cuda_tests, gpu_check.rehearsal, gpu_check.mfu):
        with pytest.raises(SystemExit) as stopped:
            step(tmp_path)
        called.append(stopped.value.code)
    assert "tests/test_decode_on_device.py" in called[0]
    assert called[1][called[1].index("--gpus-per-run") + 1] == "3"
    assert "training_mfu" in called[2][1]  # in a child: a compilation that hangs is killed


def test_the_mfu_step_times_vitzoo_and_timm_on_the_same_weights():
    """On the CPU (no peak known: no MFU), two one-block ViTs uncompiled: its code path."""
    timm = speed.timm("vit_tiny_patch16_224", depth=1, img_size=32)
    tiny = speed.Case("vit_ti16", {"timm": timm}, 32, dict(depth=1))
    result = gpu_check.training_mfu(torch.device("cpu"), tiny, batch=2, reps=1, compile=False)
    assert result["vitzoo"]["images_per_s"] > 0 and result["timm"]["images_per_s"] > 0
    assert result["vitzoo"]["mfu"] is None and result["gflops_per_image"] > 0


# ---------------------------------------------------------------- ten minutes of Fashion-MNIST
def test_ten_minute_benchmark_records_accuracy_settings_and_target(tmp_path):
    """At a budget of two seconds: what ran, where, and whether the target was met."""
    from benchmarks import fashion_mnist_10min as tenmin

    assert tenmin.main(["--minutes", "0.03", "--only", "vit_p4", "--out", str(tmp_path),
                        "--quiet", "--set", "test_limit=512"]) == 0
    (record,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert record["name"] == "vit_p4" and record["target"] == 0.90 and record["steps"] > 0
    assert 0.0 <= record["test_top1"] <= 1.0 and ENVIRONMENT <= set(record)
    assert record["train_seconds"] < 0.03 * 60 + 30  # the budget stops it (minutes without)
    readme = (tmp_path / "README.md").read_text()
    assert "| vit_p4 |" in readme and "(90%) |" in readme  # met or missed


@pytest.mark.slow
def test_ten_minute_benchmark_trains_data_parallel_in_one_thread_processes(tmp_path):
    """`--processes 2`: two ranks of one thread under torchrun; rank 0 alone writes the records."""
    command = [sys.executable, str(ROOT / "benchmarks" / "fashion_mnist_10min.py"), "--processes",
               "2", "--minutes", "0.03", "--out", str(tmp_path), "--quiet", "--set",
               "test_limit=512"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["name"] for r in records] == ["vit_p4", "hybrid_r1"]  # both, by default
    for record in records:
        assert (record["processes"], record["threads"]) == (2, 1) and record["steps"] > 0
    assert (tmp_path / "README.md").read_text().count("| 2 x 1 |") == 2
