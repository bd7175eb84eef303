"""An ablation's results store is shared by every process that measures its runs: two suites on one
`--out`, or the jobs of a cluster, each keep every result they add, with no lock (a cluster's file
system may have none that holds across nodes): each record is a file of its own, results.json their
union. A result counts as measured only for the code of its numerics version."""

import json
import multiprocessing
import shutil

from benchmarks.assignment import assign
from benchmarks.runner import execute
from benchmarks.suite import NUMERICS_VERSION, RECORD, RESULTS, ResultStore, Run, record_folder, run_folder

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
    assert not list(tmp_path.glob("*.lock"))  # and no lock was taken


def test_each_record_is_a_file_in_its_runs_folder_and_results_json_their_union(tmp_path):
    run = Run("x", "a", {"lr": 1}, 0)
    store = ResultStore(tmp_path)
    store.add({"key": run.key, **NOW})
    assert json.loads((run_folder(store, run) / RECORD).read_text()) == {"key": run.key, **NOW}
    # a record whose writer lost the race for results.json (another process wrote its union last)
    lost = record_folder(tmp_path, "b", NUMERICS_VERSION) / RECORD
    lost.parent.mkdir(parents=True)
    lost.write_text(json.dumps({"key": "b", **NOW}))
    assert [r["key"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == [run.key]
    assert ResultStore(tmp_path).keys() == {run.key, "b"}  # whoever reads next writes the union
    assert [r["key"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == [run.key, "b"]
    (tmp_path / "results.json").unlink()
    assert [r["key"] for r in ResultStore(tmp_path).runs] == [run.key, "b"]  # the records alone make it again
    assert ResultStore(tmp_path, numerics=None).get("a key with spaces / slashes") is None
    ResultStore(tmp_path).add({"key": "a key with spaces / slashes", **NOW})  # a key that is no file name: hashed
    assert ResultStore(tmp_path).get("a key with spaces / slashes") == {"key": "a key with spaces / slashes", **NOW}


def test_a_record_added_while_the_union_is_written_is_in_the_file_the_writer_leaves(tmp_path, monkeypatch):
    """Whoever writes the union looks at the record files again afterwards, and writes again for one
    that came meanwhile: the last writer's results.json holds every record."""
    import benchmarks.suite as suite

    other = record_folder(tmp_path, "b", NUMERICS_VERSION) / RECORD
    written = suite.write_text

    def another_process_adds_meanwhile(path, text):
        written(path, text)
        if path.name == "results.json" and not other.exists():
            other.parent.mkdir(parents=True)
            other.write_text(json.dumps({"key": "b", **NOW}))

    monkeypatch.setattr(suite, "write_text", another_process_adds_meanwhile)
    ResultStore(tmp_path).add({"key": "a", **NOW})
    assert [r["key"] for r in json.loads((tmp_path / "results.json").read_text())["runs"]] == ["a", "b"]


def test_the_committed_results_load_unchanged(tmp_path):
    """Every committed results.json reads as the records it holds, and reading does not rewrite it."""
    # every store of runs; the loader benchmark's results.json is one measurement's figures, not a store
    committed = sorted(p for p in RESULTS.glob("**/results.json") if p.parent != RESULTS / "loader")
    assert len(committed) >= 12
    for path in committed:
        copy = tmp_path / path.parent.relative_to(RESULTS) / "results.json"
        copy.parent.mkdir(parents=True)
        shutil.copy(path, copy)
        assert ResultStore(copy.parent, numerics=None).runs == json.loads(path.read_text())["runs"], path
        assert copy.read_bytes() == path.read_bytes(), path


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


def test_superseded_records_move_to_an_archive_with_the_reason_and_stay_out(tmp_path):
    """Records of other settings under a label still in use, and one of uncommitted code, leave results.json
    for the archive beside it, each with why; the current ones stay as they were; an archived record's own
    record file does not bring it back, and archiving again moves nothing twice."""
    from benchmarks.archive import archive, archived_records
    from benchmarks.suite import ARCHIVE

    planned = [Run("x", "a", {"train": {"lr": 2, "epochs": 4}}, s) for s in range(2)]
    current = [{"key": run.key, "label": "a", "seed": run.seed, "config": run.config, "commit": "abc", **NOW} for run in planned]
    earlier = {"key": Run("x", "a", {"train": {"lr": 1, "epochs": 4}}, 0).key, "label": "a", "seed": 0,
               "config": {"train": {"lr": 1, "epochs": 4}}, "commit": "abc", **NOW}
    dropped = {"key": "k-gone", "label": "b", "seed": 0, "config": {}, "commit": "abc", **NOW}
    dirty = {"key": "k-dirty", "label": "a", "seed": 1, "config": {}, "commit": "abc-dirty", **NOW}
    (tmp_path / "results.json").write_text(json.dumps({"runs": [current[0], earlier, dropped, current[1], dirty]}))
    stale = record_folder(tmp_path, earlier["key"], NUMERICS_VERSION) / RECORD  # its record file, git-ignored, still there
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps(earlier))

    assert archive(tmp_path, planned, "cpu") == 3
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == current
    reasons = {entry["record"]["key"]: entry["reason"] for entry in json.loads((tmp_path / ARCHIVE).read_text())["runs"]}
    assert reasons[earlier["key"]] == "other settings than --scale cpu's run of 'a' (seed 0): train.lr: 1 -> 2"
    assert "no cell of --scale cpu is labelled 'b'" in reasons["k-gone"] and "abc-dirty" in reasons["k-dirty"]
    assert [r["key"] for r in ResultStore(tmp_path).runs] == [r["key"] for r in current]  # the record file stays out
    assert archive(tmp_path, planned, "cpu") == 0 and len(archived_records(tmp_path)) == 3
    again = dict(earlier, metrics={"v": 1})  # measured anew under that key: a new record, which counts
    ResultStore(tmp_path).add(again)
    assert ResultStore(tmp_path).get(earlier["key"]) == again


def test_threads_recorded_wrong_are_corrected_from_the_runs_that_went_at_once():
    """Before threads were recorded per worker, a record said the launching process's 2 for runs that
    trained two at once, one thread each: corrected where the start and wall times show runs side by side,
    left where the run went alone or was recorded after the fix."""
    from benchmarks.archive import correct_threads

    def record(started, wall, commit="old", **more):
        return {"started": started, "wall_s": wall, "threads": 2, "launcher": "local", "processes": 1, "device": "cpu",
                "commit": commit, **more}

    pair = [record(0.0, 100.0), record(10.0, 100.0)]
    alone, later = record(500.0, 10.0), record(1000.0, 100.0, commit="new")
    records = pair + [alone, later, record(1010.0, 50.0, commit="new")]
    assert correct_threads(records, before=lambda commit: commit == "old") == 2
    assert [r["threads"] for r in records] == [1, 1, 2, 2, 2] and pair[0]["threads_recorded"] == 2
    assert "2 runs trained at once" in pair[0]["threads_note"]
    assert correct_threads(records, before=lambda commit: commit == "old") == 0  # corrected once, never again


def test_a_runs_key_holds_its_threads_only_where_they_differ_from_the_committed_runs():
    from benchmarks.suite import COMMITTED_THREADS

    run = Run("x", "a", {"lr": 1}, 0)
    assert Run("x", "a", {"lr": 1}, 0, threads=COMMITTED_THREADS).key == run.key  # the committed runs' keys stand
    assert Run("x", "a", {"lr": 1}, 0, threads=COMMITTED_THREADS + 1).key != run.key  # another run
    assert assign("cpu", workers=2).keyed_threads(trains=True) == assign("cpu", workers=2).threads_per_process
    assert assign("cpu").keyed_threads(trains=False) is None  # a timing's key holds no threads
