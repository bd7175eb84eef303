"""The summary of every finding (benchmarks/summary.py) on constructed findings and records: the
verdicts decided and surviving Holm, and the ablations whose verdicts share runs."""

import json

from benchmarks import summary
from benchmarks.verdict import RULE


def _write(folder, name, file, content):
    (folder / name).mkdir(exist_ok=True)
    (folder / name / file).write_text(json.dumps(content))


def test_the_summary_counts_decided_verdicts_and_those_that_survive_holm(tmp_path):
    def finding(verdict, holm_p=None, family=None, survives=None, **more):
        return {"claim": "c", "verdict": verdict, "metric": "test_acc", "holm_p": holm_p,
                "family": family, "survives_holm": survives, **more,
                "evidence": [{"compared": "a - b", "d": 0.01, "low": 0.005, "high": 0.015}]}

    for name, rows in {"pos_embed": [finding("reproduced", 0.004, 3, True),
                                     finding("contradicted", 0.04, 3, False, regime="300M images"),
                                     finding("inconclusive", 0.3, 3)],
                       "head": [finding("not testable", reason="identical seeds")]}.items():
        _write(tmp_path, name, "findings.json", {"rule": RULE, "numerics": [1], "findings": rows})
    table = summary.findings_table(tmp_path, "")
    assert ("Of 3 judged rows, 2 are decided at 2.5% a side (1 reproduced, 1 contradicted) and 1 "
            "inconclusive; 1 of the decided survive Holm's correction across their table's judged "
            "rows (1 reproduced, 0 contradicted). 1 more are not testable") in table
    assert "| **reproduced** | survives (p 0.004 of 3) |" in table
    assert ("| **contradicted** (outside the paper's regime: its README says how) | does not "
            "survive (p 0.04 of 3) |") in table
    assert "not testable: identical seeds; a - b: d = +0.0100 [+0.0050, +0.0150]" in table


def test_runs_shared_by_several_ablations_make_their_verdicts_dependent(tmp_path):
    def run(label, seed, loss):
        return {"label": label, "seed": seed, "metrics": {"final_loss": loss, "test_acc": 0.87}}

    _write(tmp_path, "pos_embed", "results.json",
           {"runs": [run("learned", s, 0.3 + s / 100) for s in range(3)] + [run("none", 0, 0.5)]})
    _write(tmp_path, "shape", "results.json",
           {"runs": [run("base", s, 0.3 + s / 100) for s in range(3)] + [run("deep", 0, 0.5)]})
    _write(tmp_path, "head", "results.json", {"runs": [run("token", 0, 0.3)]})  # one seed: chance
    assert summary.shared_cells(tmp_path) == [[("pos_embed", "learned"), ("shape", "base")]]
    assert summary.dependence(summary.shared_cells(tmp_path)).startswith(
        "**Dependent verdicts:** pos_embed and shape share the runs of one cell (pos_embed "
        "'learned' = shape 'base'")
    assert summary.dependence([]) == ""
