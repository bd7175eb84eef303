"""The measurements that are not ablations: speed against timm and torchvision, gpu-check (its
CPU-testable parts), the Fashion-MNIST ten-minute benchmark."""

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
    """`--quick`: vitzoo and both peers on converted weights that give the peers' logits, images/s
    with a spread, the matmul ceiling, a training step's peak memory, a table and a figure."""
    from vitzoo.precision import fastest as rule

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
    for r in runs:  # a key per case, the machine in every record
        assert ENVIRONMENT <= set(r) and r["key"] == speed.case_key(r, True)
    (fastest,) = [r for r in runs if r["kind"] == "fastest"]
    assert set(fastest["speeds"]) == {"vitzoo float32", "vitzoo.fast()"} | {
        f"{lib} {dtype}" for lib in ("timm", "torchvision") for dtype in ("float32", "bf16")}
    assert fastest["choice"] == f"{rule('cpu')}; eager"  # the device's rule, eager
    readme = (out / "README.md").read_text()
    assert "Each at its fastest" in readme and "speed-up" in readme and "ceilings" in readme
    assert (out / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speed_report_only_regenerates_the_committed_tables_from_their_records(tmp_path):
    committed, out = suite.RESULTS / "speed", tmp_path / "speed"
    out.mkdir()
    for name in ("results.json", "under_load.json"):
        shutil.copy(committed / name, out / name)
    assert bench.main(["speed", "--report-only", "--quiet", "--out", str(tmp_path)]) == 0
    for name in ("README.md", "speed.png", "under_load.md"):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), name


def test_every_committed_speed_key_is_the_key_of_its_case():
    runs = json.loads((suite.RESULTS / "speed" / "results.json").read_text())["runs"]
    assert runs and all(r["key"] == speed.case_key(r, r.get("quick", False)) for r in runs)


@pytest.mark.parametrize("command", [["-m", "benchmarks.speed"], ["-m", "benchmarks", "gpu-check"]])
def test_help_prints_the_usage_without_measuring(command):
    done = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "usage:" in done.stdout and "--out" in done.stdout, done.stderr


def test_repetitions_rotate_and_count_each_call_s_page_faults():
    """No contestant always follows the same one (the C allocator's heap is shared); a call that
    touches fresh memory faults its pages in."""
    calls = []

    def contestant(name, pages=0):
        def run():
            calls.append(name)
            if pages:
                with mmap.mmap(-1, pages * mmap.PAGESIZE) as fresh:
                    for page in range(pages):
                        fresh[page * mmap.PAGESIZE] = 1
        return run

    names = ["a", "b", "c"]
    fns = {n: contestant(n, 4096 if n == "c" else 0) for n in names}
    speeds = speed.interleaved(fns, 6, 1, torch.device("cpu"))
    timed = calls[len(names):]  # after one warm-up call each
    assert [timed[i * 3] for i in range(6)] == ["a", "b", "c"] * 2
    for n in names:
        assert {timed[i - 1] for i in range(1, len(timed)) if timed[i] == n} == set(names) - {n}
    assert {n: s["reps"] for n, s in speeds.items()} == dict.fromkeys(names, 6)
    assert speeds["c"]["page_faults_per_call"] >= 4096 > 100 > speeds["a"]["page_faults_per_call"]


# ---------------------------------------------------------------- gpu-check
@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA GH200 480GB", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L40S", 362.0), ("NVIDIA L40", 181.0), ("NVIDIA L4", 121.0), ("NVIDIA A10", 125.0),
    ("NVIDIA GeForce RTX 4090", None), ("Tesla T4", None)])
def test_a_gpu_s_dense_bf16_peak_is_known_by_its_name_or_said_to_be_unknown(name, peak):
    assert gpu_check.peak_tflops(name) == peak


def test_gpu_check_runs_its_steps_within_nine_minutes_the_rehearsal_on_every_gpu(monkeypatch,
                                                                                tmp_path):
    assert set(gpu_check.LIMITS) == set(gpu_check.STEPS) and sum(gpu_check.LIMITS.values()) <= 540
    called = []

    def child(argv, limit):
        called.append(argv)
        raise RuntimeError("stopped: the command is what is checked")

    monkeypatch.setattr(gpu_check, "run_child", child)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    for step in (gpu_check.cuda_tests, gpu_check.rehearsal, gpu_check.mfu):
        with pytest.raises(RuntimeError, match="stopped"):
            step(tmp_path)
    assert "tests/test_decode_on_device.py" in called[0]
    assert called[1][called[1].index("--gpus-per-run") + 1] == "3"
    assert "training_mfu" in called[2][1]  # in a child: a compilation that hangs is killed


def test_the_mfu_step_times_vitzoo_and_timm_on_the_same_weights():
    """On the CPU (no peak known: no MFU) with two one-block ViTs, uncompiled: its code path."""
    tiny = speed.Case("vit_ti16", {"timm": speed.timm("vit_tiny_patch16_224", depth=1,
                                                      img_size=32)}, 32, dict(depth=1))
    result = gpu_check.training_mfu(torch.device("cpu"), tiny, batch=2, reps=1, compile=False)
    assert result["vitzoo"]["images_per_s"] > 0 and result["timm"]["images_per_s"] > 0
    assert result["vitzoo"]["mfu"] is None and result["gflops_per_image"] > 0


# ---------------------------------------------------------------- ten minutes of Fashion-MNIST
def test_ten_minute_benchmark_records_accuracy_settings_and_target(tmp_path):
    """At a budget of two seconds: the clock stops training, the test set is evaluated, and the
    record says what ran, where, and whether the target was met."""
    from benchmarks import fashion_mnist_10min as tenmin

    assert tenmin.main(["--minutes", "0.03", "--only", "vit", "--out", str(tmp_path), "--quiet",
                        "--set", "test_limit=512"]) == 0
    (record,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert record["name"] == "vit" and record["target"] == 0.90 and record["steps"] > 0
    assert 0.0 <= record["test_top1"] <= 1.0 and ENVIRONMENT <= set(record)
    assert record["train_seconds"] < 0.03 * 60 + 30  # the budget stops it (minutes without)
    assert record["settings"]["time_budget_min"] == 0.03 and record["model_config"]["patch_size"] == 7
    readme = (tmp_path / "README.md").read_text()
    assert "| vit |" in readme and ("missed (90%)" in readme or "met (90%)" in readme)


@pytest.mark.slow
def test_ten_minute_benchmark_trains_data_parallel_in_one_thread_processes(tmp_path):
    """`--processes 2` relaunches under torchrun: two ranks of one thread share the budget and the
    global batch, and rank 0 alone writes the records, which say how they ran."""
    command = [sys.executable, str(ROOT / "benchmarks" / "fashion_mnist_10min.py"), "--processes",
               "2", "--minutes", "0.03", "--out", str(tmp_path), "--quiet", "--set",
               "test_limit=512"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["name"] for r in records] == ["hybrid_r1", "vit_p4"]  # the table's order
    for record in records:
        assert (record["processes"], record["threads"]) == (2, 1) and record["steps"] > 0
    assert (tmp_path / "README.md").read_text().count("| 2 x 1 |") == 2
