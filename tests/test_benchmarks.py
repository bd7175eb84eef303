"""The ablation suite: every ablation runs at --scale quick and writes its results, table,
figures and verdicts; a second invocation measures nothing again; --report-only reports what is
there; the committed results are complete, meet their floors, and keep the keys today's code
computes."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as bench
from benchmarks import suite
from benchmarks.ablations import ABLATIONS
from benchmarks.scales import SCALES

RECORD_FIELDS = {"config", "seed", "metrics", "wall_s", "device", "torch", "commit", "cpu",
                 "threads", "date", "key", "numerics"}
VERDICT = re.compile(r"^- \*(?P<claim>.+?)\* \(paper: .+?\): \*\*(?P<verdict>[a-z ]+)\*\*")
SAYS = {"pos_embed": "paper (5-shot, ImageNet) |", "data": "training images",
        "transfer": "downstream fine-tuned"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """`python -m benchmarks all --scale quick`, every run in this process."""
    out = tmp_path_factory.mktemp("results")
    assert bench.main(["all", "--scale", "quick", "--quiet", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_each_ablation_writes_its_results_table_figures_and_verdicts(results, ablation):
    spec, folder = ABLATIONS[ablation], results / ablation
    runs = json.loads((folder / "results.json").read_text())["runs"]
    assert len(runs) == len(spec.runs(SCALES["quick"]))
    assert all(RECORD_FIELDS <= set(r) for r in runs)
    assert {r["numerics"] for r in runs} == {suite.NUMERICS_VERSION}
    assert runs[0]["cpu"] not in ("", "x86_64", "aarch64")  # the CPU's model, not its architecture
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# ") and "--scale quick" in readme
    assert SAYS.get(ablation, "|") in readme
    assert f"numerics version {suite.NUMERICS_VERSION}." in readme and "Mixed" not in readme
    figures = re.findall(r"!\[[^\]]+\]\(([\w.]+\.png)\)", readme)  # shown, not only named
    assert figures and all((folder / f).read_bytes()[:4] == b"\x89PNG" for f in figures)
    recorded = json.loads((folder / "findings.json").read_text())
    assert len(recorded["findings"]) == len(spec.findings)
    assert recorded["rule"] in readme or not spec.findings
    stated = [m["verdict"] for line in readme.splitlines() if (m := VERDICT.match(line))]
    assert stated == [f["verdict"] for f in recorded["findings"] if f["verdict"] != "not compared"]
    assert set(stated) <= {"not testable"}  # one seed a cell: no standard error
    if spec.trains:
        for r in runs:
            assert 0 <= r["metrics"]["test_acc"] <= 1 and 0 <= r["metrics"]["fewshot_5"] <= 1
            assert r["flops"] > 0 and r["config"]["train"]["data"] == "fashion-mnist"


@pytest.mark.slow
def test_the_data_and_transfer_ablations_record_what_their_findings_judge(results):
    for r in json.loads((results / "data" / "results.json").read_text())["runs"]:
        train = r["config"]["train"]  # subsets for one number of steps, stopped on validation
        assert train["val_size"] > 0 and train["keep_best"]
        assert train["train_limit"] == r["group"]["images"]
        assert 1 <= r["metrics"]["best_step"] <= train["steps"]
        assert 0 <= r["metrics"]["val_acc"] <= 1
    for r in json.loads((results / "transfer" / "results.json").read_text())["runs"]:
        metrics = r["metrics"]
        assert 0 <= metrics["transfer_fewshot_5"] <= 1 and 0 <= metrics["transfer_finetune"] <= 1
        assert r["flops"] > r["upstream_flops"] > 0  # the fine-tuning counted in


@pytest.mark.slow
def test_a_second_invocation_measures_nothing_again(results):
    before = {a: (results / a / "results.json").read_text() for a in ABLATIONS}
    assert bench.main(["all", "--scale", "quick", "--quiet", "--out", str(results)]) == 0
    assert {a: (results / a / "results.json").read_text() for a in ABLATIONS} == before


def _record(run, acc: float, **more) -> dict:
    return {"key": run.key, "ablation": run.ablation, "label": run.label, "group": run.group,
            "config": run.config, "seed": run.seed, "metrics": {"test_acc": acc, "fewshot_5": acc},
            "flops": 1.0, "params": 1, "date": "2026-12-01 00:00 UTC", **more}


def test_report_only_reports_every_numerics_version_and_says_loudly_that_they_mix(tmp_path):
    runs = ABLATIONS["pos_embed"].runs(SCALES["main"])
    records = [_record(r, 0.85 + 0.01 * i, **({"numerics": 1} if i % 2 else {}))
               for i, r in enumerate(runs)]
    (tmp_path / "pos_embed").mkdir()
    (tmp_path / "pos_embed" / "results.json").write_text(json.dumps({"runs": records}))
    assert bench.main(["pos_embed", "--scale", "main", "--report-only", "--quiet",
                       "--out", str(tmp_path)]) == 0
    readme = (tmp_path / "pos_embed" / "README.md").read_text()
    assert "**Mixed code versions: numerics versions 0, 1." in readme
    assert "numerics version 0, 1. " in readme
    assert json.loads((tmp_path / "pos_embed" / "findings.json").read_text())["numerics"] == [0, 1]
    assert not (tmp_path / "pos_embed" / "runs").exists()  # nothing trained


def test_table_8s_verdicts_follow_the_measurements_and_name_the_cells_not_run(tmp_path):
    from benchmarks.spec import report

    spec = ABLATIONS["pos_embed"]
    cells = {r.label: r for r in spec.runs(SCALES["cpu"])}

    def verdicts(values: dict) -> list[str]:
        records = [_record(cells[label], v) | {"seed": i} for label, vs in values.items()
                   for i, v in enumerate(vs)]
        return [v["verdict"] for v in report(spec, records, tmp_path)[1]
                if v["metric"] == "test_acc"]

    learned = {"none / input": [0.80, 0.81, 0.79], "learned_1d / input": [0.86, 0.87, 0.86]}
    assert verdicts({**learned, "learned_2d / input": [0.861, 0.871, 0.862]}) == \
        ["reproduced", "reproduced"]
    assert verdicts({"none / input": [0.86, 0.87, 0.86], "learned_1d / input": [0.86, 0.86, 0.87],
                     "learned_2d / input": [0.80, 0.81, 0.79]}) == ["contradicted", "contradicted"]
    assert verdicts(learned) == ["reproduced", "not compared"]  # the main job's two cells


def test_the_summary_names_the_numerics_versions_of_the_findings(tmp_path):
    from benchmarks import summary
    from benchmarks.verdict import RULE

    finding = {"claim": "c", "verdict": "inconclusive", "metric": "test_acc", "evidence": [
        {"compared": "a - b", "d": 0.002, "se": 0.001, "df": 4.0, "low": -0.001, "high": 0.005}]}
    for name, numerics in (("pos_embed", {"numerics": [1]}), ("head", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "findings.json").write_text(
            json.dumps({"rule": RULE, **numerics, "scale": "cpu", "findings": [finding]}))
    table = summary.findings_table(tmp_path, "")
    assert "version 0: head; version 1: pos_embed" in table


def test_every_ablation_builds_distinct_runs_with_the_seeds_its_findings_need():
    assert set(ABLATIONS) == {"pos_embed", "head", "hybrid", "shape", "data", "cost", "inspect",
                              "transfer"}
    for spec in ABLATIONS.values():
        for scale, seeds in (("quick", 1), ("main", 2), ("cpu", 3)):
            runs = spec.runs(SCALES[scale])
            assert runs and len({r.key for r in runs}) == len(runs), (spec.name, scale)
            if spec.findings:
                assert min(sum(r.label == run.label for r in runs) for run in runs) >= seeds


# ---------------------------------------------------------------------------- the committed results
SETTINGS = re.compile(r"^Settings: `--scale (?P<scale>\w+)`; (?P<runs>\d+) runs", re.MULTILINE)


def key_of(record: dict, trains: bool = True) -> str:
    threads = record.get("threads") if trains else None
    return suite.Run(record["ablation"], record["label"], record["config"], record["seed"],
                     threads=threads).key


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_every_committed_run_key_is_the_key_today_s_code_gives_its_run(ablation):
    """The spec, at the scale its README records, plans exactly the committed runs; every key,
    the superseded records' too, is the hash of its own ablation, config, seed and threads."""
    spec, folder = ABLATIONS[ablation], suite.RESULTS / ablation
    records = json.loads((folder / "results.json").read_text())["runs"]
    stated = SETTINGS.search((folder / "README.md").read_text())
    assert json.loads((folder / "findings.json").read_text())["scale"] == stated["scale"]
    runs = spec.runs(SCALES[stated["scale"]])
    assert {r.key for r in runs} == {r["key"] for r in records} and len(runs) == int(stated["runs"])
    superseded = folder / "superseded.json"
    old = [e["record"] for e in json.loads(superseded.read_text())["runs"]
           ] if superseded.exists() else []
    assert all(key_of(r, spec.trains) == r["key"] for r in records + old)
    assert all(r["threads"] == suite.COMMITTED_THREADS for r in records if spec.trains)


def test_every_committed_trial_key_is_the_key_today_s_code_gives_it():
    """The trials behind the scales' settings (the speed benchmark's: tests/test_speed.py)."""
    trials = sorted((suite.RESULTS / "trials").glob("*/results.json"))
    assert trials and all(key_of(r) == r["key"] for path in trials
                          for r in json.loads(path.read_text())["runs"])


@pytest.mark.parametrize("ablation", [name for name, spec in ABLATIONS.items() if spec.trains])
def test_committed_cpu_results_meet_the_accuracy_floors(ablation):
    """On all the training data: the base ViT at its learning rate >= 86% test accuracy, every
    ResNet and hybrid >= 88% (the data ablation's ResNet, at the ViT's compute: the ViT's floor)."""
    import vitzoo

    spec, scale = ABLATIONS[ablation], SCALES["cpu"]
    store = suite.ResultStore(suite.RESULTS / ablation, numerics=None)
    cells: dict[str, list[dict]] = {}
    for run in spec.runs(scale):
        cells.setdefault(run.label, []).append(store.get(run.key))
    base = vitzoo.get_config(scale.zoo_name, **scale.model)
    largest = max(r["config"]["train"].get("train_limit") or 0 for rs in cells.values() for r in rs)
    for label, runs in cells.items():
        config = runs[0]["config"]
        if (config["train"].get("train_limit") or 0) < largest:
            continue  # a subset of the data ablation: its point is to fall short
        model = vitzoo.get_config(config["model"], **config["options"])
        vit = model == base and config["train"].get("lr") == scale.train["lr"]
        floor = 0.88 if model.stem == "resnet" else 0.86 if vit else None
        if ablation == "data" and runs[0]["group"]["family"] == "ResNet":
            floor = 0.86
        accuracy = sum(r["metrics"]["test_acc"] for r in runs) / len(runs)
        assert floor is None or accuracy >= floor, f"{label}: {accuracy:.4f} < {floor}"


# ---------------------------------------------------------------------------- `vitzoo bench`
def test_vitzoo_bench_runs_the_benchmarks_in_a_child_from_the_callers_directory(
        tmp_path, monkeypatch, capfd):
    """A child process: this process's import path stays, and a relative --out is the caller's."""
    from vitzoo.cli import main

    monkeypatch.chdir(tmp_path)
    path = list(sys.path)
    assert main(["bench", "pos_embed", "--scale", "quick", "--report-only", "--out", "here"]) == 0
    assert sys.path == path
    assert "Results, figures and README in here/pos_embed" in capfd.readouterr().out


def test_vitzoo_bench_without_a_checkout_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    from vitzoo.cli import main
    from vitzoo.commands import bench as command

    monkeypatch.setattr(command, "__file__", str(tmp_path / "site/vitzoo/commands/bench.py"))
    assert main(["bench", "pos_embed"]) == 2
    err = capsys.readouterr().err
    assert "the benchmarks are not installed with vitzoo" in err
    assert "pip install -e '.[bench]'" in err


def test_matplotlib_is_the_benchmarks_extra_and_no_module_of_vitzoo_imports_it():
    tomllib = pytest.importorskip("tomllib")
    root = Path(suite.__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["bench"] == ["matplotlib"]
    assert not [d for d in project["dependencies"] if d.startswith("matplotlib")]
    for path in (root / "vitzoo").rglob("*.py"):  # imports run on import: not in a function
        nodes, names = list(ast.parse(path.read_text()).body), []
        while nodes:
            node = nodes.pop()
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names += [getattr(node, "module", None) or a.name for a in node.names]
            elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                nodes.extend(ast.iter_child_nodes(node))
        assert "matplotlib" not in {n.split(".")[0] for n in names}, path
