"""Prose that quotes the findings is checked against them: every verdict set in bold in README.md and
benchmarks/README.md names its finding (in italics) and metric ("*claim* on test accuracy: **verdict**")
and is the verdict findings.json records, and every difference and interval quoted after it (d = +0.0236,
CI [-0.0117, +0.0589]) is one of that finding's, at the digits printed. The generated table between the
findings markers is `benchmarks.summary`'s own (tests/test_docs.py)."""

import json
import re
from pathlib import Path

import pytest

from benchmarks import summary
from benchmarks.ablations import ABLATIONS
from benchmarks.suite import RESULTS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", summary.BENCHMARKS_README]
METRICS = {"test accuracy": "test_acc", "5-shot accuracy": "fewshot_5", "downstream 5-shot accuracy": "transfer_fewshot_5",
           "downstream fine-tuned accuracy": "transfer_finetune"}
VERDICT_WORDS = r"reproduced|contradicted|inconclusive|not testable|not reproduced|not compared"
TOKEN = re.compile(r"\*\*(?P<verdict>[^*]+)\*\*|\*(?P<claim>[^*]+)\*|\bon (?P<metric>" + "|".join(METRICS) + r"):"
                   r"|\bd = (?P<d>[+-]?\d+\.\d+)(?:,? (?:95% )?CI \[(?P<low>[+-]?\d+\.\d+), (?P<high>[+-]?\d+\.\d+)\])?")


def recorded(results: Path = RESULTS) -> dict[tuple[str, str], list[dict]]:
    """(claim, metric) -> the findings of that claim on that metric, of every ablation (lower-cased claims)."""
    out: dict[tuple[str, str], list[dict]] = {}
    for name in ABLATIONS:
        path = results / name / "findings.json"
        for f in json.loads(path.read_text())["findings"] if path.exists() else []:
            out.setdefault((f["claim"].lower(), f["metric"]), []).append(f)
    return out


def _printed(value: float | None, text: str) -> bool:
    return value is not None and f"{value:+.{len(text.split('.')[1])}f}" == text


def problems(text: str, findings: dict[tuple[str, str], list[dict]]) -> list[str]:
    """What in `text` disagrees with the findings, or quotes a verdict or number that cannot be checked."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(re.escape(summary.START) + ".*?" + re.escape(summary.END), "", text, flags=re.S)
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
                    found.append(f"**{m['verdict']}** names no finding and metric (write '*claim* on test accuracy: "
                                 f"**verdict**'): ...{paragraph[max(0, m.start() - 80):m.end()]}")
                elif m["verdict"] not in {f["verdict"] for f in rows}:
                    found.append(f"*{claim}* on {metric}: the prose says {m['verdict']!r}, findings.json "
                                 f"{sorted({f['verdict'] for f in rows})}")
                judged = rows or None
            elif m["d"] is not None:
                evidence = [e for f in judged or [] for e in f["evidence"]]
                if not any(_printed(e.get("d"), m["d"]) and (m["low"] is None or (_printed(e.get("low"), m["low"])
                           and _printed(e.get("high"), m["high"]))) for e in evidence):
                    found.append(f"{m.group(0)!r} is no difference of the finding it follows ({claim}, {metric})")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_verdict_and_number_quoted_beside_a_finding_is_the_recorded_one(page):
    assert not problems(page.read_text(), recorded()), "\n".join(problems(page.read_text(), recorded()))


def test_a_stale_verdict_or_number_in_the_prose_is_caught():
    findings = {("vit overtakes", "test_acc"): [{"verdict": "contradicted",
                                                 "evidence": [{"d": -0.0167, "low": -0.0314, "high": -0.0020}]}]}
    good = "*ViT overtakes* on test accuracy: **contradicted** (d = -0.0167, CI\n[-0.0314, -0.0020])."
    assert problems(good, findings) == []
    assert problems(good.replace("contradicted", "not reproduced"), findings)  # the verdict of an earlier rule
    assert problems(good.replace("-0.0314", "-0.0283"), findings)  # an interval of earlier runs
    assert problems("The ViT trails by d = -0.0167.", findings)  # a number beside no finding
    assert problems("ViT overtakes: **contradicted**.", findings)  # a verdict that names no finding
    assert problems(good.replace("test accuracy", "5-shot accuracy"), findings)  # another metric's
