"""The summary of every finding (benchmarks/summary.py) on constructed findings and records: how
many verdicts are decided and survive Holm's correction within their table, and which ablations'
verdicts depend on each other through runs they share."""

import json

from benchmarks import summary
from benchmarks.verdict import RULE


def _finding(claim, verdict, holm_p=None, family=None, survives=None, **more):
    return {"claim": claim, "verdict": verdict, "metric": "test_acc",
            "holm_p": holm_p, "family": family,
            "survives_holm": survives,
            "evidence": [{"compared": "a - b", "d": 0.01, "low": 0.005, "high": 0.015}], **more}


def test_the_summary_counts_decided_verdicts_and_those_that_survive_holm(tmp_path):
    findings = {"pos_embed": [_finding("x", "reproduced", 0.004, 3, True),
                              _finding("y", "contradicted", 0.04, 3, False,
                                                                                   regime="the paper's 300M images"),
                              _finding("z", "inconclusive", 0.3, 3)],
                "head": [_finding("w", "not testable", reason="identical seeds")]}
    for name, rows in findings.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "findings.json").write_text(json.dumps({"rule": RULE,
                                                                   "numerics": [1], "scale": "cpu",
                                                                   "findings": rows}))
    table = summary.findings_table(tmp_path, "")
    assert ("Of 3 judged rows, 2 are decided at 2.5% a side (1 reproduced, 1 contradicted) and 1 "
            "inconclusive; 1 of the "
            "decided survive Holm's correction across their table's judged rows (1 reproduced, 0 "
            "contradicted). 1 more "
            "are not testable") in table
    assert "| **reproduced** | survives (p 0.004 of 3) |" in table
    assert "| **contradicted** (outside the paper's regime: its README says how) | does not survive (p 0.04 of 3) |" in table
    assert "not testable: identical seeds; a - b" in table


def test_runs_shared_by_several_ablations_make_their_verdicts_dependent(tmp_path):
    def run(label, seed, loss, acc):
        return {"label": label, "seed": seed,
                "metrics": {"final_loss": loss, "test_acc": acc, "fewshot_5": acc - 0.1}}

    stores = {"pos_embed": [run("learned", s, 0.3 + s / 100,
                                0.87) for s in range(3)] + [run("none", 0, 0.5, 0.85)],
              "shape": [run("base", s, 0.3 + s / 100,
                            0.87) for s in range(3)] + [run("deep", 0, 0.5, 0.85)],
              "head": [run("token", 0, 0.3, 0.87)]}  # one seed alike by chance is no shared cell
    for name, runs in stores.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"runs": runs}))
    assert summary.shared_cells(tmp_path) == [[("pos_embed", "learned"), ("shape", "base")]]
    said = summary.dependence(summary.shared_cells(tmp_path))
    assert said.startswith("**Dependent verdicts:** pos_embed and shape share the runs of one cell "
                           "(pos_embed 'learned' = "
                           "shape 'base'")
    assert summary.dependence([]) == ""
