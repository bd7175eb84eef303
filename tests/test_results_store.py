"""An ablation's results store is shared by every process that measures its runs: two suites on one
`--out`, or the jobs of a cluster, each keep every result they add."""

import json
import multiprocessing

from benchmarks.suite import ResultStore


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
    other.add({"key": "a"})
    assert early.get("a") is None
    early.refresh()
    assert early.get("a") == {"key": "a"}
    early.add({"key": "b"})  # merged with what is on disk, not with what it had read
    assert {r["key"] for r in ResultStore(tmp_path).runs} == {"a", "b"}


def test_adding_a_key_again_replaces_its_record(tmp_path):
    store = ResultStore(tmp_path)
    store.add({"key": "a", "value": 1})
    store.add({"key": "a", "value": 2})
    assert ResultStore(tmp_path).runs == [{"key": "a", "value": 2}]
