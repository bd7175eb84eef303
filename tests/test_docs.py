"""The documentation a user reads: every relative link in it leads somewhere, and the blocks that code
writes into it are current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted({ROOT / "README.md", ROOT / "plugins" / "README.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks" / "results").glob("*/README.md")})
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)  # code blocks hold commands, not links


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def relative_links(page: Path) -> list[str]:
    targets = LINK.findall(FENCE.sub("", page.read_text()))
    return [t for t in targets if not re.match(r"[a-z]+:", t)]  # https:, mailto: are not files


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/pretrained.md", "docs/training.md", "docs/gpus.md", "benchmarks/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_that_exists(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file: {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: " + "; ".join(broken)


def test_a_broken_link_is_caught(tmp_path):
    """The check above can fail: a link to a missing file and one to a missing heading are both found."""
    (tmp_path / "other.md").write_text("# Here\n")
    page = tmp_path / "page.md"
    page.write_text("[a](missing.md) [b](other.md#there) [c](other.md#here) [d](https://x.org/y)\n"
                    "```\n[e](in_a_code_block.md)\n```\n")
    assert relative_links(page) == ["missing.md", "other.md#there", "other.md#here"]
    assert anchors(tmp_path / "other.md") == {"here"}
    assert slug("Fashion-MNIST in 10 minutes on a 2-core CPU") == "fashion-mnist-in-10-minutes-on-a-2-core-cpu"


def test_the_benchmarks_findings_table_is_the_committed_verdicts():
    """benchmarks/README.md holds the table `python -m benchmarks.summary` writes from every findings.json."""
    from benchmarks import summary
    from benchmarks.suite import RESULTS

    text = summary.BENCHMARKS_README.read_text()
    assert summary.START in text and summary.END in text, "benchmarks/README.md lost its findings markers"
    block = text.split(summary.START, 1)[1].split(summary.END, 1)[0]
    assert block == f"\n{summary.findings_table(RESULTS, 'results/')}\n", "regenerate: python -m benchmarks.summary"
