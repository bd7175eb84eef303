"""Every finding of every ablation in one table, from the findings.json each wrote:
benchmarks/results/README.md, and benchmarks/README.md between its `findings` markers.

    python -m benchmarks.summary            # after a suite (or part of one) has run
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.ablations import ABLATIONS
from benchmarks.spec import METRICS
from benchmarks.suite import RESULTS, markdown_table
from benchmarks.verdict import ALPHA, CONTRADICTED, DECIDED, JUDGED, NOT_COMPARED, REPRODUCED, RULE
from vitzoo.io import write_text

BENCHMARKS_README = Path(__file__).resolve().parent / "README.md"
START, END = "<!-- findings:start -->", "<!-- findings:end -->"


def evidence(e: dict) -> str:
    """One contrast: d with its interval, and the margin of a claim of no difference."""
    text = f"{e['compared']}: " + (f"d = {e['d']:+.4f}" if e.get("d") is not None else "no value")
    if e.get("low") is not None:
        text += f" [{e['low']:+.4f}, {e['high']:+.4f}]"
    return text + (f", margin ±{e['within']['margin']:.4f}" if e.get("within") else "")


def table_row(name: str, f: dict, link_prefix: str) -> list[str]:
    """A finding's row: its ablation, claim, metric, verdict, Holm's correction, numbers."""
    holm = f"p {f['holm_p']:.2g} of {f['family']}" if f.get("holm_p") is not None else ""
    if holm and f["verdict"] in DECIDED:
        holm = f"{'survives' if f['survives_holm'] else 'does not survive'} ({holm})"
    regime = " (outside the paper's regime: its README says how)" if f.get("regime") else ""
    numbers = "; ".join(map(evidence, f["evidence"])) or "no cells to compare"
    return [f"[{name}]({link_prefix}{name}/README.md)", f["claim"],
            METRICS.get(f["metric"], f["metric"]).replace(" linear", ""),
            f"**{f['verdict']}**{regime}", holm,
            f"not testable: {f['reason']}; {numbers}" if f.get("reason") else numbers]


def shared_cells(results: Path) -> list[list[tuple[str, str]]]:
    """Cells that are the same runs in several ablations: bit-identical outcomes (final loss, test
    and 5-shot accuracy) in at least two seeds; each as its (ablation, label) pairs."""
    seen: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for name in ABLATIONS:
        path = results / name / "results.json"
        for r in json.loads(path.read_text())["runs"] if path.exists() else []:
            m = r.get("metrics", {})
            if m.get("final_loss") is not None:
                outcome = (r["seed"], m["final_loss"], m.get("test_acc"), m.get("fewshot_5"))
                seen[outcome].append((name, r["label"]))
    cells: dict[tuple, set] = defaultdict(set)
    for (seed, *_), where in seen.items():
        if len({a for a, _ in where}) > 1:
            cells[tuple(sorted(set(where)))].add(seed)
    return [list(where) for where, seeds in cells.items() if len(seeds) >= 2]


def findings_table(results: Path, link_prefix: str) -> str:
    rows, judged, incomplete, versions = [], [], [], defaultdict(list)
    for name, spec in ABLATIONS.items():
        path = results / name / "findings.json"
        if not path.exists() or not spec.findings:
            continue
        recorded = json.loads(path.read_text())
        judged += [f for f in recorded["findings"] if f["verdict"] != NOT_COMPARED]
        rows += [table_row(name, f, link_prefix) for f in recorded["findings"]
                 if f["verdict"] != NOT_COMPARED]
        readme = results / name / "README.md"
        settings = readme.read_text() if readme.exists() else ""
        incomplete += [name] if "\n**Incomplete" in settings else []
        for version in recorded.get("numerics", [0]):  # without versions: runs before them
            versions[version].append(name)
    if not rows:
        return "(no findings measured yet: run `python -m benchmarks all --workers 2`)"
    text = markdown_table(["ablation", "finding of the paper", "metric", "here",
                           "Holm, across its table", "the numbers behind it"], rows)
    text += (f"\n\nThe rule for every verdict: {RULE}; d is the difference named, over the seeds "
             "of each cell, with its interval in brackets. " + multiplicity(judged) + " "
             + dependence(shared_cells(results)))
    if incomplete:
        text += f" Incomplete (a suite still running or interrupted): {', '.join(incomplete)}."
    if len(versions) > 1:
        text += (" **The tables come from code of different numerics versions: " + "; ".join(
            f"version {v}: {', '.join(names)}" for v, names in sorted(versions.items())) + ".**")
    elif versions:
        text += f" Every table's runs are of numerics version {next(iter(versions))}."
    return text


def multiplicity(findings: list[dict]) -> str:
    """How many verdicts are decided, and how many of those survive Holm within their table."""
    counted = [f for f in findings if f["verdict"] in JUDGED]
    decided = [f for f in counted if f["verdict"] in DECIDED]
    kept = [f for f in decided if f.get("survives_holm")]
    by = lambda v, rows: sum(f["verdict"] == v for f in rows)  # noqa: E731
    untestable = sum(f["verdict"] == "not testable" for f in findings)
    return (f"Of {len(counted)} judged rows, {len(decided)} are decided at {ALPHA:.1%} a side "
            f"({by(REPRODUCED, decided)} reproduced, {by(CONTRADICTED, decided)} contradicted) and "
            f"{len(counted) - len(decided)} inconclusive; {len(kept)} of the decided survive "
            "Holm's correction across their table's judged rows "
            f"({by(REPRODUCED, kept)} reproduced, {by(CONTRADICTED, kept)} contradicted). "
            f"{untestable} more are not testable at this scale, each with its reason.")


def dependence(shared: list[list[tuple[str, str]]]) -> str:
    """Which ablations' verdicts are not independent: they share the runs of a cell."""
    said = []
    for where in shared:
        names = sorted({a for a, _ in where})
        said.append(f"{', '.join(names[:-1])} and {names[-1]} share the runs of one cell ("
                    + " = ".join(f"{a} '{label}'" for a, label in where)
                    + ", bit-identical in every seed): a seed's luck in that cell moves every "
                    "verdict whose contrast uses it, in all of them at once, so those verdicts are "
                    "not independent of each other")
    return "**Dependent verdicts:** " + "; ".join(said) + "." if said else ""


def main() -> int:
    write_text(RESULTS / "README.md", "# Every finding, judged by one rule\n\nWritten by "
               "`python -m benchmarks.summary` from each ablation's `findings.json`; each "
               "ablation's README has its table, settings (date, commit, CPU) and figures.\n\n"
               + findings_table(RESULTS, "") + "\n")
    table = f"{START}\n{findings_table(RESULTS, 'results/')}\n{END}"
    write_text(BENCHMARKS_README, re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: table,
                                         BENCHMARKS_README.read_text(), flags=re.S))
    print(findings_table(RESULTS, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
