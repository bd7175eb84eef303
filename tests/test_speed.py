"""The measurements that are not ablations: speed against timm and torchvision, the Fashion-MNIST
ten-minute benchmark."""

import json
import mmap
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as bench
from benchmarks import suite

RECORD_FIELDS = {"config", "seed", "metrics", "wall_s", "device", "torch", "commit", "cpu", "threads", "date", "key", "numerics"}


@pytest.mark.slow
def test_speed_benchmark_measures_every_contestant_on_the_same_weights(tmp_path):
    """`speed --quick`: vitzoo and both peers, converted weights giving the peers' logits, images/s with
    a spread, the matrix-product ceiling at the model's shapes, peak memory of a training step, the
    CPU's flags, a table and a figure."""
    from benchmarks import speed
    from vitzoo.precision import fastest as rule

    out = speed.main(quick=True, out=tmp_path / "speed")
    data = json.loads((out / "results.json").read_text())
    inference = [r for r in data["runs"] if r["kind"] == "inference"]
    training = [r for r in data["runs"] if r["kind"] == "training"]
    assert {r["dtype"] for r in inference} == {"float32", "bf16"} and training
    for r in inference:  # in bf16 also vitzoo.fast, its weights cast once
        assert set(r["speeds"]) == {"vitzoo", "timm", "torchvision"} | ({"vitzoo.fast"} if r["dtype"] == "bf16" else set())
        assert all(s["min"] <= s["images_per_s"] <= s["max"] for s in r["speeds"].values())
        assert r["matmul_gflops_per_s"] > 0 and r["gflops_per_image"] > 0
        assert max(r["max_abs_logit_diff"].values()) < 1e-4  # the same model, not merely the same shapes
    for r in training:
        assert all(gb > 0 for gb in r["peak_memory_gb"].values()) and r["matmul_gflops_per_s"] > 0
        assert set(r["peak_resident_gb"]) == set(r["peak_memory_gb"]) == set(r["speeds"])
        assert set(r["compiler_memory_gb"]) == {n for n in r["speeds"] if "compile" in n}  # none in --quick
        assert all(s["page_faults_per_call"] >= 0 for s in r["speeds"].values())
    for r in data["runs"]:  # the ablations' store: a key per case, the environment in every record
        assert RECORD_FIELDS - {"seed", "config", "metrics", "wall_s", "numerics"} <= set(r), set(r)  # a timing: no training numbers
        assert isinstance(r["cpu_flags"], list)  # the instruction sets, which decide how CPUs compare
        assert r["key"] == f"{r['kind']} {r['model']} {r['dtype']} batch {r['batch']} quick"
    (fastest,) = [r for r in data["runs"] if r["kind"] == "fastest"]  # each at its own fastest precision
    assert set(fastest["speeds"]) == {"vitzoo float32", "vitzoo.fast()"} | {
        f"{lib} {dtype}" for lib in ("timm", "torchvision") for dtype in ("float32", "bf16")}
    assert all(fastest["peer_best"][lib].startswith(lib + " ") for lib in ("timm", "torchvision"))
    assert fastest["choice"] == f"{rule('cpu')}; eager"  # the device's rule, eager
    readme = (out / "README.md").read_text()
    assert f"Each at its fastest: `{fastest['call']}` with no argument" in readme  # the call measured
    assert "Each at its fastest" in readme and "over vitzoo float32" in readme
    assert "faster peer" in readme and "speed-up" in readme and "Matrix-product ceilings" in readme
    assert "![speed](speed.png)" in readme and (out / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speed_help_prints_the_usage_without_measuring():
    done = subprocess.run([sys.executable, "-m", "benchmarks.speed", "--help"], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and "--only inference|training|fastest" in done.stdout, done.stderr


def test_speed_report_only_regenerates_the_committed_tables_from_their_records(tmp_path):
    """`python -m benchmarks speed --report-only` measures nothing: the README, its figure and
    under_load.md of the committed records come out byte for byte as committed."""
    committed, out = suite.RESULTS / "speed", tmp_path / "speed"
    out.mkdir()
    for name in ("results.json", "under_load.json"):
        shutil.copy(committed / name, out / name)
    assert bench.main(["speed", "--report-only", "--quiet", "--out", str(tmp_path)]) == 0
    for name in ("README.md", "speed.png", "under_load.md"):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), name


def test_speed_repetitions_rotate_so_that_no_contestant_always_follows_the_same_one():
    """The C allocator's heap is shared by the contestants: the order of each repetition is rotated by
    one, and every call's page faults are counted (a call that allocates fresh memory faults it in)."""
    from benchmarks import speed_timing as timing

    calls = []

    def contestant(name, pages=0):
        def run():
            calls.append(name)
            if pages:  # fresh anonymous memory, each page touched once
                with mmap.mmap(-1, pages * mmap.PAGESIZE) as fresh:
                    for page in range(pages):
                        fresh[page * mmap.PAGESIZE] = 1
        return run

    names = ["a", "b", "c"]
    speeds = timing.interleaved({n: contestant(n, 4096 if n == "c" else 0) for n in names}, 6, 1, torch.device("cpu"))
    timed = calls[len(names):]  # after one warm-up call each
    predecessors = {n: {timed[i - 1] for i in range(1, len(timed)) if timed[i] == n} for n in names}
    assert all(predecessors[n] == set(names) - {n} for n in names), predecessors
    assert [timed[i * 3] for i in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert {n: s["reps"] for n, s in speeds.items()} == dict.fromkeys(names, 6)
    assert speeds["c"]["page_faults_per_call"] >= 4096 > 100 > speeds["a"]["page_faults_per_call"]


@pytest.mark.slow
def test_memory_probe_of_a_compiled_step_counts_the_compiler_apart():
    """The compiled contestant's probe (a fresh process) compiles in a warm-up pass before measuring: the
    compiler's memory is reported beside the training step's, not inside it."""
    from benchmarks import speed_timing as timing

    probe = timing.peak_memory_gb(0, timing.STORED_PROBABILITIES, 2, "bf16", True, torch.device("cpu"))
    assert probe["peak_gb"] > 0 and probe["resident_gb"] > 0 and probe["compiler_gb"] > 0.01, probe
    assert timing.peak_memory_gb(0, "vitzoo", 2, "float32", True, torch.device("cpu"))["compiler_gb"] == 0


def test_ten_minute_benchmark_records_accuracy_settings_and_target(tmp_path):
    """The Fashion-MNIST time-budget benchmark, at a budget of two seconds: the clock stops training, the
    test set is evaluated, and the record says what ran, where, and whether the target was met."""
    from benchmarks import fashion_mnist_10min as tenmin

    assert tenmin.main(["--minutes", "0.03", "--only", "vit", "--out", str(tmp_path), "--quiet",
                        "--set", "test_limit=512"]) == 0
    (record,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert record["name"] == "vit" and record["target"] == 0.90
    assert 0.0 <= record["test_top1"] <= 1.0 and record["steps"] > 0
    assert record["train_seconds"] <= 0.03 * 60 + 5  # the budget is the training clock
    assert record["settings"]["time_budget_min"] == 0.03 and record["model_config"]["patch_size"] == 7
    readme = (tmp_path / "README.md").read_text()
    assert "| vit |" in readme and ("missed (90%)" in readme or "met (90%)" in readme)


@pytest.mark.slow
def test_ten_minute_benchmark_trains_data_parallel_in_one_thread_processes(tmp_path):
    """`--processes 2` relaunches under torchrun: two ranks of one thread share the budget and the global
    batch, both models train one after the other in the same processes (one process group for both),
    and rank 0 alone writes the records, which say how they ran."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fashion_mnist_10min.py"
    command = [sys.executable, str(script), "--processes", "2", "--minutes", "0.03", "--out", str(tmp_path), "--quiet",
               "--set", "test_limit=512"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["name"] for r in records] == ["hybrid_r1", "vit_p4"]  # the default runs, in the table's order
    for record in records:
        assert (record["processes"], record["threads"]) == (2, 1) and record["steps"] > 0
        assert record["settings"]["batch_size"] == 128
    assert (tmp_path / "README.md").read_text().count("| 2 x 1 |") == 2


def test_the_operator_profile_sets_each_operator_of_vitzoo_beside_the_peer_s():
    """`python -m benchmarks.speed profile`: own CPU time and calls per forward, per operator, both models."""
    import vitzoo
    from benchmarks.speed_timing import operator_ms, table

    model = vitzoo.create("vit_ti16", embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8).eval()
    ops = operator_ms(model, torch.randn(2, 3, 32, 32), torch.bfloat16, calls=2)
    assert ops["aten::addmm"][1] >= 2 * 2  # q/k/v and output projection, two MLP layers, per block (the last
    assert all(ms >= 0 for ms, _ in ops.values())  # block's for the class token alone) and the head
    text = table({"aten::addmm": (3.0, 9), "aten::gelu": (0.5, 2)}, {"aten::addmm": (4.0, 9), "aten::bmm": (1.0, 4)}, "timm", 2)
    assert "| `aten::addmm` | 4.0 | 9 | 3.0 | 9 |" in text and "| `aten::bmm` | 1.0 | 4 | 0.0 | 0 |" in text
    assert "**5.0**" in text and "**3.5** (0.70x)" in text and "gelu" not in text.split("all operators")[0]
    # operators of equal time stand in name order, so that a table is the same in every process
    tied = table({"aten::gelu": (1.0, 2)}, {"aten::bmm": (1.0, 4)}, "timm", 2)
    assert tied.index("aten::bmm") < tied.index("aten::gelu")



def test_every_committed_speed_key_is_still_the_key_of_its_case():
    from benchmarks import speed

    records = json.loads((suite.RESULTS / "speed" / "results.json").read_text())["runs"]
    assert records and all(r["key"] == speed.case_key(r, r.get("quick", False)) for r in records)
