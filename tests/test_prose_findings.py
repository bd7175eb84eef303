"""Prose quoting the findings agrees with them: every bold verdict in README.md and
benchmarks/README.md names its finding and metric ("*claim* on test accuracy: **verdict**") and is
the one findings.json records, and every d and interval quoted after it is that finding's."""

import json
import re
from pathlib import Path

import pytest

from benchmarks import summary
from benchmarks.ablations import ABLATIONS
from benchmarks.suite import RESULTS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", summary.BENCHMARKS_README]
METRICS = {"test accuracy": "test_acc", "5-shot accuracy": "fewshot_5",
           "downstream 5-shot accuracy": "transfer_fewshot_5",
           "downstream fine-tuned accuracy": "transfer_finetune"}
VERDICT_WORDS = r"reproduced|contradicted|inconclusive|not testable|not reproduced|not compared"
NUMBER = r"[+-]?\d+\.\d+"
TOKEN = re.compile(rf"\*\*(?P<verdict>[^*]+)\*\*|\*(?P<claim>[^*]+)\*"
                   rf"|\bon (?P<metric>{'|'.join(METRICS)}):|\bd = (?P<d>{NUMBER})"
                   rf"(?:,? (?:95% )?CI \[(?P<low>{NUMBER}), (?P<high>{NUMBER})\])?")


def recorded() -> dict[tuple[str, str], list[dict]]:
    """(lower-cased claim, metric) -> its findings, of every ablation."""
    out: dict[tuple[str, str], list[dict]] = {}
    for path in (RESULTS / name / "findings.json" for name in ABLATIONS):
        for f in json.loads(path.read_text())["findings"] if path.exists() else []:
            out.setdefault((f["claim"].lower(), f["metric"]), []).append(f)
    return out


def _printed(value: float | None, text: str) -> bool:  # at the digits printed
    return value is not None and f"{value:+.{len(text.split('.')[1])}f}" == text


def problems(text: str, findings: dict[tuple[str, str], list[dict]]) -> list[str]:
    """What in `text` disagrees with the findings, or quotes what cannot be checked."""
    generated = re.escape(summary.START) + ".*?" + re.escape(summary.END)
    text = re.sub(rf"```.*?```|{generated}", "", text, flags=re.S)
    claims = {claim for claim, _ in findings}
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        claim = metric = judged = None
        for m in TOKEN.finditer(paragraph):
            if m["claim"] is not None and m["claim"].lower() in claims:
                claim, metric, judged = m["claim"].lower(), None, None
            elif m["metric"]:
                metric = METRICS[m["metric"]]
            elif m["verdict"] is not None and re.fullmatch(VERDICT_WORDS, m["verdict"]):
                rows = findings.get((claim, metric)) if claim and metric else None
                if not rows:
                    quoted = paragraph[max(0, m.start() - 80):m.end()]
                    found.append(f"**{m['verdict']}** names no finding and metric (write '*claim* "
                                 f"on test accuracy: **verdict**'): ...{quoted}")
                elif m["verdict"] not in {f["verdict"] for f in rows}:
                    found.append(f"*{claim}* on {metric}: the prose says {m['verdict']!r}, "
                                 f"findings.json {sorted({f['verdict'] for f in rows})}")
                judged = rows or None
            elif m["d"] is not None:
                if not any(_printed(e.get("d"), m["d"]) and (m["low"] is None or (
                        _printed(e.get("low"), m["low"]) and _printed(e.get("high"), m["high"])))
                        for f in judged or [] for e in f["evidence"]):
                    found.append(f"{m.group(0)!r} is no d of its finding ({claim}, {metric})")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_verdict_and_number_quoted_beside_a_finding_is_the_recorded_one(page):
    found = problems(page.read_text(), recorded())
    assert not found, "\n".join(found)


def test_a_stale_verdict_or_number_in_the_prose_is_caught():
    findings = {("vit overtakes", "test_acc"): [{"verdict": "contradicted", "evidence": [
        {"d": -0.0167, "low": -0.0314, "high": -0.0020}]}]}
    good = ("*ViT overtakes* on test accuracy: **contradicted** (d = -0.0167, CI\n"
            "[-0.0314, -0.0020]).")
    assert problems(good, findings) == []
    assert problems(good.replace("contradicted", "not reproduced"), findings)  # an earlier rule's
    assert problems(good.replace("-0.0314", "-0.0283"), findings)  # an interval of earlier runs
    assert problems("The ViT trails by d = -0.0167.", findings)  # a number beside no finding
    assert problems("ViT overtakes: **contradicted**.", findings)  # a verdict naming no finding
    assert problems(good.replace("test accuracy", "5-shot accuracy"), findings)  # another metric's
