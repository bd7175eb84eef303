"""An ablation's results store is shared by every process that measures its runs (two suites on
one `--out`, a cluster's jobs) with no lock: each record is a file of its own, results.json their
union. A result counts as measured only for the code of its numerics version."""

import json
import multiprocessing
import shutil

from benchmarks.runner import assign, execute
from benchmarks.suite import (COMMITTED_THREADS, NUMERICS_VERSION, RECORD, RESULTS, ResultStore,
                              Run, record_folder, run_folder)

NOW = {"numerics": NUMERICS_VERSION}  # a record of the current code


def _add_many(directory: str, writer: int, start) -> None:
    store = ResultStore(directory)  # opened before the other writer adds anything
    start.wait()
    for i in range(30):
        store.add({"key": f"{writer}-{i}", **NOW})


def test_two_processes_adding_at_once_keep_every_result(tmp_path):
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [context.Process(target=_add_many, args=(str(tmp_path), w, start)) for w in range(2)]
    for p in writers:
        p.start()
    start.set()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert sorted(r["key"] for r in runs) == sorted(f"{w}-{i}" for w in range(2) for i in range(30))


def test_results_json_is_the_union_of_the_record_files_and_whoever_reads_writes_it(tmp_path):
    run = Run("x", "a", {"lr": 1}, 0)
    store = ResultStore(tmp_path)
    store.add({"key": run.key, **NOW})
    assert json.loads((run_folder(store, run) / RECORD).read_text()) == {"key": run.key, **NOW}
    lost = record_folder(tmp_path, "b", NUMERICS_VERSION) / RECORD  # its writer lost the race
    lost.parent.mkdir(parents=True)
    lost.write_text(json.dumps({"key": "b", **NOW}))
    assert ResultStore(tmp_path).keys() == {run.key, "b"}
    assert [r["key"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == \
        [run.key, "b"]
    (tmp_path / "results.json").unlink()
    assert [r["key"] for r in ResultStore(tmp_path).runs] == [run.key, "b"]
    store.add({"key": "b", "value": 2, **NOW})  # a key added again: its record replaced
    assert ResultStore(tmp_path).get("b") == {"key": "b", "value": 2, **NOW}


def test_a_record_added_while_the_union_is_written_is_in_the_file_the_writer_leaves(
        tmp_path, monkeypatch):
    import benchmarks.suite as suite

    other, written = record_folder(tmp_path, "b", NUMERICS_VERSION) / RECORD, suite.write_text

    def another_process_adds_meanwhile(path, text):
        written(path, text)
        if path.name == "results.json" and not other.exists():
            other.parent.mkdir(parents=True)
            other.write_text(json.dumps({"key": "b", **NOW}))

    monkeypatch.setattr(suite, "write_text", another_process_adds_meanwhile)
    ResultStore(tmp_path).add({"key": "a", **NOW})
    assert [r["key"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == \
        ["a", "b"]


def test_the_committed_results_load_unchanged_and_reading_does_not_rewrite_them(tmp_path):
    committed = sorted(p for p in RESULTS.glob("**/results.json") if p.parent.name != "loader")
    assert len(committed) >= 12
    for path in committed:
        copy = tmp_path / path.parent.relative_to(RESULTS) / "results.json"
        copy.parent.mkdir(parents=True)
        shutil.copy(path, copy)
        assert ResultStore(copy.parent, numerics=None).runs == json.loads(path.read_text())["runs"]
        assert copy.read_bytes() == path.read_bytes(), path


def test_a_record_of_other_code_is_measured_again_and_replaced(tmp_path):
    """A record of another numerics version (0: none recorded) is no result of this code: its run
    is measured again in a folder of its own; `--report-only`'s store (numerics=None) reads it."""
    run = Run("x", "a", {"lr": 1}, 0)
    old = {"key": run.key, "metrics": {"v": 0}}
    (tmp_path / "results.json").write_text(json.dumps({"runs": [old]}))
    assert ResultStore(tmp_path).get(run.key) is None
    assert ResultStore(tmp_path, numerics=None).get(run.key) == old
    measured = []

    def measure(run, device, out):
        measured.append(out)
        return {"metrics": {"v": 1}}

    records = execute([run], measure, ResultStore(tmp_path), assign("cpu"), quiet=True)
    assert measured == [run_folder(ResultStore(tmp_path), run)]
    assert measured[0].name == f"{run.key}-n{NUMERICS_VERSION}"
    assert records[0]["numerics"] == NUMERICS_VERSION and records[0]["metrics"] == {"v": 1}
    assert [r["key"] for r in ResultStore(tmp_path, numerics=None).runs] == [run.key]
    assert execute([run], measure, ResultStore(tmp_path), assign("cpu"), quiet=True) == records
    assert len(measured) == 1  # a second invocation measures nothing again


def test_a_runs_key_hashes_its_config_seed_and_threads_not_its_label():
    run = Run("x", "a", {"lr": 1}, 0)
    assert run.key == Run("x", "another label", {"lr": 1}, 0).key
    assert run.key != Run("x", "a", {"lr": 2}, 0).key != Run("x", "a", {"lr": 1}, 1).key
    assert Run("x", "a", {"lr": 1}, 0, threads=COMMITTED_THREADS).key == run.key
    assert Run("x", "a", {"lr": 1}, 0, threads=COMMITTED_THREADS + 1).key != run.key
    two = assign("cpu", workers=2)
    assert two.keyed_threads(trains=True) == two.threads_per_process
    assert two.keyed_threads(trains=False) is None  # a timing's key holds no threads
