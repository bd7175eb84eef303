"""An ablation's results store is shared by every process that measures its runs: two suites on one
`--out`, or the jobs of a cluster, each keep every result they add. A result counts as measured only
for the code of its numerics version."""

import json
import multiprocessing

from benchmarks.execute import execute
from benchmarks.launchers.assign import assign
from benchmarks.suite import NUMERICS_VERSION, ResultStore, Run, run_folder

NOW = {"numerics": NUMERICS_VERSION}  # a record of the current code


def _add_many(directory: str, writer: int, count: int, start) -> None:
    store = ResultStore(directory)  # opened before the other writer adds anything
    start.wait()
    for i in range(count):
        store.add({"key": f"{writer}-{i}", "writer": writer, "metrics": {"test_acc": i / count}})


def test_two_processes_adding_at_once_keep_every_result(tmp_path):
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [context.Process(target=_add_many, args=(str(tmp_path), w, 40, start)) for w in range(2)]
    for p in writers:
        p.start()
    start.set()
    for p in writers:
        p.join(60)
        assert p.exitcode == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert sorted(r["key"] for r in runs) == sorted(f"{w}-{i}" for w in range(2) for i in range(40))


def test_a_store_opened_earlier_sees_what_others_added_once_refreshed(tmp_path):
    early, other = ResultStore(tmp_path), ResultStore(tmp_path)
    other.add({"key": "a", **NOW})
    assert early.get("a") is None
    early.refresh()
    assert early.get("a") == {"key": "a", **NOW}
    early.add({"key": "b", **NOW})  # merged with what is on disk, not with what it had read
    assert {r["key"] for r in ResultStore(tmp_path).runs} == {"a", "b"}


def test_adding_a_key_again_replaces_its_record(tmp_path):
    store = ResultStore(tmp_path)
    store.add({"key": "a", "value": 1})
    store.add({"key": "a", "value": 2})
    assert ResultStore(tmp_path).runs == [{"key": "a", "value": 2}]


def test_a_record_of_other_code_is_not_a_result_and_is_measured_again(tmp_path):
    """A record without a numerics version (before versions were recorded) or of another version is not
    measured for the current code: a resumed suite measures its run again, in a folder of its own, and
    the new record replaces it; a store of every version (--report-only) still reads it."""
    run = Run("x", "a", {"lr": 1}, 0)
    old = {"key": run.key, "label": "a", "metrics": {"v": 0}}
    (tmp_path / "results.json").write_text(json.dumps({"runs": [old, {"key": "other", "numerics": NUMERICS_VERSION + 1}]}))
    store = ResultStore(tmp_path)
    assert store.get(run.key) is None and store.get("other") is None and store.keys() == set()
    assert ResultStore(tmp_path, numerics=None).get(run.key) == old
    assert ResultStore(tmp_path, numerics=0).keys() == {run.key}
    measured = []

    def measure(run, device, out):
        measured.append(out)
        return {"metrics": {"v": 1}}

    records = execute([run], measure, store, assign("cpu"), quiet=True)
    assert measured == [run_folder(store, run)] and run_folder(store, run).name == f"{run.key}-n{NUMERICS_VERSION}"
    assert records[0]["numerics"] == NUMERICS_VERSION and records[0]["metrics"] == {"v": 1}
    assert [r["key"] for r in ResultStore(tmp_path, numerics=None).runs] == ["other", run.key]  # replaced, not added
    assert execute([run], measure, ResultStore(tmp_path), assign("cpu"), quiet=True) == records and len(measured) == 1
