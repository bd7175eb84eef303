"""The ablation suite: every ablation runs in --quick form and writes its results, table and figures;
a second invocation measures nothing again."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as bench
from benchmarks import suite

FIGURES = {
    "pos_embed": ["pos_embed.png"],
    "head": ["head.png"],
    "hybrid": ["hybrid.png"],
    "shape": ["shape.png"],
    "cost": ["cost.png"],
    "inspect": ["attention_distance.png", "pos_embed_similarity.png", "patch_filters.png", "attention_rollout.png"],
}
RECORD_FIELDS = {"config", "seed", "metrics", "wall_s", "device", "torch", "commit", "key"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    assert bench.main(["all", "--quick", "--quiet", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("ablation", list(FIGURES))
def test_each_ablation_writes_results_table_and_figures(results, ablation):
    folder = results / ablation
    runs = json.loads((folder / "results.json").read_text())["runs"]
    assert runs and all(RECORD_FIELDS <= set(r) for r in runs)
    for name in FIGURES[ablation]:
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# ") and "| " in readme and "--scale cpu" in readme


@pytest.mark.parametrize("ablation", ["pos_embed", "head", "hybrid", "shape"])
def test_training_ablations_record_accuracy_fewshot_and_compute(results, ablation):
    runs = json.loads((results / ablation / "results.json").read_text())["runs"]
    for r in runs:
        assert 0.0 <= r["metrics"]["test_acc"] <= 1.0 and 0.0 <= r["metrics"]["fewshot_5"] <= 1.0
        assert r["flops"] > 0 and r["config"]["options"] and r["config"]["train"]["data"] == "fashion-mnist"
    readme = (results / ablation / "README.md").read_text()
    assert "reproduced" in readme  # every finding is stated as reproduced or not reproduced


def test_the_position_embedding_table_stands_beside_the_papers_numbers(results):
    readme = (results / "pos_embed" / "README.md").read_text()
    assert "paper (5-shot, ImageNet)" in readme and "0.6421" in readme and "0.6138" in readme


def test_a_second_run_reuses_every_result(results, monkeypatch):
    before = {a: (results / a / "results.json").read_text() for a in FIGURES}

    def refuse(*args, **kwargs):
        raise AssertionError("a run with an existing result was measured again")

    monkeypatch.setattr("benchmarks.training.measure", refuse)
    monkeypatch.setattr("benchmarks.inspection.measure", refuse)
    monkeypatch.setattr("benchmarks.cost.measure", refuse)
    assert bench.main(["all", "--quick", "--quiet", "--out", str(results)]) == 0
    assert {a: (results / a / "results.json").read_text() for a in FIGURES} == before


def test_run_keys_depend_on_config_and_seed_not_on_labels():
    a = suite.Run("x", "label a", {"lr": 1}, 0)
    assert a.key == suite.Run("x", "another label", {"lr": 1}, 0).key
    assert a.key != suite.Run("x", "label a", {"lr": 2}, 0).key != suite.Run("x", "label a", {"lr": 1}, 1).key


def test_unknown_ablation_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["posembed"])
    assert "unknown ablation 'posembed'" in capsys.readouterr().err


def test_speed_benchmark_measures_every_contestant_on_the_same_weights(tmp_path):
    """`speed --quick`: vitzoo and both peers, converted weights giving the peers' logits, images/s with
    a spread, the matrix-product ceiling, peak memory of a training step, a table and a figure."""
    from benchmarks import speed

    out = speed.main(quick=True, out=tmp_path / "speed")
    data = json.loads((out / "results.json").read_text())
    inference = [r for r in data["runs"] if r["kind"] == "inference"]
    training = [r for r in data["runs"] if r["kind"] == "training"]
    assert {r["dtype"] for r in inference} == {"float32", "bf16"} and training
    for r in inference:
        assert set(r["speeds"]) == {"vitzoo", "timm", "torchvision"}
        assert all(s["min"] <= s["images_per_s"] <= s["max"] for s in r["speeds"].values())
        assert r["matmul_gflops_per_s"] > 0 and r["gflops_per_image"] > 0
        assert max(r["max_abs_logit_diff"].values()) < 1e-4  # the same model, not merely the same shapes
    for r in training:
        assert all(gb > 0 for gb in r["peak_memory_gb"].values())
    readme = (out / "README.md").read_text()
    assert "faster peer" in readme and "speed-up" in readme
    assert (out / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
