"""The READMEs' links land: every relative link names a file that exists, every anchor a target.

The READMEs quote benchmark figures and point each one at its row of ``benchmarks/REPORT.md``
(``REPORT.md#judge-engines``); REPORT.md points at the dated entries of ``HISTORY.md``. A row
renamed, a heading reworded or a file moved breaks such a link silently on GitHub, so this checks
them all, with no network and no Ray. Anchors are what GitHub makes: an explicit
``<a id="...">`` / ``<a name="...">``, or a heading's slug (lower case, punctuation dropped,
spaces to hyphens, ``-1``, ``-2`` ... for repeats).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "benchmarks" / "REPORT.md"

#: the pages a user reads first, and the two benchmark pages their figures point into
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "RELEASING.md",
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("examples/**/README.md"),
        REPORT,
        ROOT / "benchmarks" / "HISTORY.md",
    }
)
READMES = [page for page in PAGES if page.name == "README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def _prose_lines(page: Path) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with their line numbers."""
    lines, in_fence = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the ``-N`` of a repeat)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(page):
        found.update(EXPLICIT_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            repeat = seen.get(slug, 0)
            seen[slug] = repeat + 1
            found.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """Every link target of the page's prose (not of its code), with its line number."""
    return [
        (number, target)
        for number, line in _prose_lines(page)
        for target in LINK.findall(INLINE_CODE.sub("", line))
    ]


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)


def _broken(page: Path, target: str) -> str | None:
    """Why the link is broken, or None."""
    path_part, _, fragment = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    if not dest.exists():
        return f"{dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
        return f"no anchor #{fragment} in {dest.relative_to(ROOT)}"
    return None


def test_the_slug_is_githubs() -> None:
    assert github_slug("SGLang 0.5.17 on one H200, 2026-12-03 (fourth session)") == (
        "sglang-0517-on-one-h200-2026-12-03-fourth-session"
    )
    assert github_slug("2026-12-01 — memory handoff (`benchmarks/gpu_handoff.py`)") == (
        "2026-12-01--memory-handoff-benchmarksgpu_handoffpy"
    )
    assert github_slug("Where a batch's GPU time goes (one 8 × 8 batch)") == (
        "where-a-batchs-gpu-time-goes-one-8--8-batch"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(page: Path) -> None:
    broken = [
        f"{page.relative_to(ROOT)}:{number}: ({target}) {why}"
        for number, target in links(page)
        if _relative(target) and (why := _broken(page, target))
    ]
    assert not broken, "\n".join(broken)


def test_the_readmes_figures_point_at_report_rows_that_exist() -> None:
    report_anchors = anchors(REPORT)
    pointed = [
        (readme, number, target.partition("#")[2])
        for readme in READMES
        for number, target in links(readme)
        if _relative(target)
        and "#" in target
        and (readme.parent / target.partition("#")[0]).resolve() == REPORT
    ]
    assert pointed, "no README links a row of benchmarks/REPORT.md"
    missing = [
        f"{readme.relative_to(ROOT)}:{number}: REPORT.md#{fragment}"
        for readme, number, fragment in pointed
        if fragment not in report_anchors
    ]
    assert not missing, "\n".join(missing)


def test_the_report_points_at_its_history() -> None:
    assert any(target == "HISTORY.md" for _, target in links(REPORT)[:5])
