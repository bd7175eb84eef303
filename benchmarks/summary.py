"""Every finding of every ablation in one table, from the verdicts the ablations wrote (findings.json):
benchmarks/results/README.md, and the project README between its `findings` markers. Nothing in it is
written by hand.

    python -m benchmarks.summary            # after a suite (or part of one) has run
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from benchmarks.ablations import ABLATIONS
from benchmarks.suite import RESULTS, markdown_table
from benchmarks.verdict import NOT_COMPARED, RULE
from vitzoo.io import write_text

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- findings:start -->", "<!-- findings:end -->"
METRIC_NAMES = {"test_acc": "test accuracy", "fewshot_5": "5-shot"}


def settings_of(readme: Path) -> str:
    """The results README's settings line and its incompleteness note, if any."""
    text = readme.read_text() if readme.exists() else ""
    lines = [line for line in text.splitlines() if line.startswith(("Settings:", "**Incomplete"))]
    return " ".join(lines)


def findings_table(results: Path, link_prefix: str) -> str:
    rows, notes = [], []
    for name, spec in ABLATIONS.items():
        path = results / name / "findings.json"
        if not path.exists() or not spec.findings:
            continue
        recorded = json.loads(path.read_text())
        link = f"[{name}]({link_prefix}{name}/README.md)"
        for f in recorded["findings"]:
            if f["verdict"] == NOT_COMPARED:  # its cells are not run at the scale measured
                continue
            evidence = "; ".join(f"{e['compared']}: d = {e['d']:+.4f}" + (f", 2 SE = {2 * e['se']:.4f}" if e["se"] is not None else "")
                                 for e in f["evidence"]) or "no cells to compare"
            rows.append([link, f["claim"], METRIC_NAMES.get(f["metric"], f["metric"]), f"**{f['verdict']}**", evidence])
        if "Incomplete" in settings_of(results / name / "README.md"):
            notes.append(name)
    if not rows:
        return "(no findings measured yet: run `python -m benchmarks all --workers 2`)"
    text = markdown_table(["ablation", "finding of the paper", "metric", "here", "the numbers behind it"], rows)
    text += f"\n\nThe rule for every verdict: {RULE}; d is the difference named, over the seeds of each cell."
    if notes:
        text += " Incomplete (a suite still running or interrupted): " + ", ".join(notes) + "."
    return text


def main() -> int:
    write_text(RESULTS / "README.md", "# Every finding, judged by one rule\n\nWritten by `python -m benchmarks.summary` from "
               "each ablation's `findings.json`; each ablation's README has its table, settings (date, commit, CPU) "
               "and figures.\n\n" + findings_table(RESULTS, "") + "\n")
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START in text and END in text:
        table = findings_table(RESULTS, "benchmarks/results/")
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{table}\n{END}", text, flags=re.S)
        write_text(readme, text)
    print(findings_table(RESULTS, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
