"""The documentation speaks of headscope, not of how it was made: no page refers to issues,
sessions, who lent what, or what an earlier version did. Every docs/*.md page, README.md,
CONTRIBUTING.md and benchmarks/README.md (which the site includes) are searched for such phrases
(case-insensitive); a hit names the file and line."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",  # in the site
                *(ROOT / "docs").glob("*.md")])

HISTORY = [re.compile(pattern, re.IGNORECASE) for pattern in (
    r"\bthe issue\b",
    r"\bissue's\b",                # "an issue's target"
    r"\bissue\s*#?\d+",            # "issue 29", "issue #13"
    r"(?<![\w`])#\d+\b",           # a bare "#29"
    r"\bthis session\b",
    r"\bthis work\b",
    r"\bbeen lent\b",
    r"\bno gpu has\b",
    r"\bearlier versions?\b",
    r"\bpull request\b",
    r"\bthe brief\b",
    r"\b(was|were) rewritten\b",
)]


def _hits(text: str) -> list[tuple[int, str]]:
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
            if any(pattern.search(line) for pattern in HISTORY)]


def test_the_phrases_are_caught_and_ordinary_prose_is_not():
    caught = ["So the issue's second claim holds.", "As the issue expected, it is weak.",
              "learns such a head, issue 29.", "see #13", "No GPU has been lent to this work.",
              "Run it in this session.", "Earlier versions bundled 700 sentences.", "The Issue 13 count",
              "Before the patched runs were rewritten, a run took 12 s"]
    assert [_hits(line) for line in caught] == [[(1, line)] for line in caught]
    ordinary = ["this works on every family", "a tissue of lies", "known issues with padding",
                "the anchor [hooks](hooks.md#names)", "an earlier copy of the token"]
    assert [line for line in ordinary if _hits(line)] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_no_page_speaks_of_how_it_was_made(page):
    hits = _hits(page.read_text(encoding="utf-8"))
    where = page.relative_to(ROOT).as_posix()
    assert not hits, "\n".join(f"{where}:{number}: {line}" for number, line in hits)
