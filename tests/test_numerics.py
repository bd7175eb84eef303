"""One table, one code version: training's numbers are those the trace of the current NUMERICS_VERSION
recorded (tests/numerics_trace.json), so a change that moves them cannot land without a bump."""

import copy
import json

import pytest

from benchmarks import numerics
from benchmarks.suite import NUMERICS_VERSION


def test_training_numbers_are_those_recorded_for_the_numerics_version():
    """Two tiny runs trained now (seconds, one CPU thread) against the trace."""
    recorded = numerics.read_trace()
    assert recorded["numerics"] == NUMERICS_VERSION, (
        f"the trace is of numerics version {recorded['numerics']}, the code's is {NUMERICS_VERSION}: "
        f"re-record the trace with {numerics.RECORD}")
    changed = numerics.differences(recorded["runs"], numerics.trace())
    assert not changed, ("training's numbers changed: bump NUMERICS_VERSION and re-record the trace with "
                         f"{numerics.RECORD}\n" + "\n".join(changed))


def fake_trace() -> dict:
    return {"vit": {"losses": [2.302585, 2.25, 2.2], "test_loss": 2.1, "test_acc": 0.33, "fewshot_5": 0.42}}


def test_the_comparison_tolerates_rounding_and_nothing_more():
    recorded = fake_trace()
    rounded = copy.deepcopy(recorded)
    rounded["vit"]["losses"][2] *= 1 + 1e-6  # another CPU's float32 sums
    assert numerics.differences(recorded, rounded) == []
    moved = copy.deepcopy(recorded)
    moved["vit"]["losses"][2] *= 1 + 1e-3
    assert numerics.differences(recorded, moved) == [f"vit losses: recorded {recorded['vit']['losses']}, "
                                                    f"measured {moved['vit']['losses']}"]
    shorter = copy.deepcopy(recorded)
    shorter["vit"]["losses"].pop()
    assert numerics.differences(recorded, shorter) and numerics.differences(recorded, {})


def test_a_trace_is_not_re_recorded_over_other_numbers_without_a_bump(tmp_path):
    path = tmp_path / "trace.json"
    numerics.record(path, fake_trace())
    numerics.record(path, fake_trace())  # the same numbers again: fine
    moved = fake_trace()
    moved["vit"]["test_loss"] = 2.0
    with pytest.raises(SystemExit, match="bump NUMERICS_VERSION in benchmarks/suite.py first"):
        numerics.record(path, moved)
    assert numerics.read_trace(path)["runs"] == fake_trace()
    older = numerics.read_trace(path)
    older["numerics"] = NUMERICS_VERSION - 1  # a trace of the version before the bump
    path.write_text(json.dumps(older))
    numerics.record(path, moved)
    assert numerics.read_trace(path) == {"numerics": NUMERICS_VERSION, "torch": older["torch"], "runs": moved}
    with pytest.raises(FileNotFoundError, match="python -m benchmarks.numerics --record"):
        numerics.read_trace(tmp_path / "missing.json")
