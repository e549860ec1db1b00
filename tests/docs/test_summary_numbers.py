"""The command-line summaries of SmolLM2 that the README and the docs show are one run's: every
label's head count and every head's score and control score in them are the golden analysis's
(`tests/support/golden/smollm2-135m`, which tests/project/test_golden.py checks against
`headscope analyze smollm2-135m`)."""
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "support" / "golden" / "smollm2-135m"
PAGES = ("README.md", "docs/getting-started.md", "docs/report.md")
HEADER = "smollm2-135m: 30 layers x 9 heads"
LINE = re.compile(r"^  (\S+)\s+(\d+)(?:\s+[^:]+: (.*))?$")
HEAD = re.compile(r"(\d+)\.(\d+) (?:(\S+) )?(-?\d\.\d{3}) \(control (-?\d\.\d{3})\)")


def _summaries(page: str) -> list:
    """The label lines of every summary block on `page` (after the header, up to `report:`)."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found = []
    for start in [i for i, line in enumerate(lines) if line == HEADER]:
        for line in lines[start + 1:]:
            if line.startswith(("report:", "```")):
                break
            if (match := LINE.match(line)) and match.group(1) != "...":
                found.append(match.groups())
    return found


def test_every_page_shows_a_summary():
    for page in PAGES:
        assert len(_summaries(page)) >= 4, f"{page} shows no summary of SmolLM2"


@pytest.mark.parametrize("page", PAGES)
def test_the_summaries_are_the_golden_analysis(page):
    labels = pd.read_csv(GOLDEN / "labels.csv")
    scores = pd.read_csv(GOLDEN / "scores.csv").set_index(["layer", "head", "detector"])
    counts = labels.label.value_counts()
    by_head = labels.set_index(["layer", "head"])
    for label, count, shown in _summaries(page):
        assert int(count) == counts[label], f"{page}: {label} has {counts[label]} heads, not {count}"
        for layer, head, detector, score, control in HEAD.findall(shown or ""):
            row = by_head.loc[(int(layer), int(head))]
            assert row.label == label, f"{page}: {layer}.{head} is {row.label}, not {label}"
            assert f"{row.score:.3f}" == score, f"{page}: {label} {layer}.{head} scores {row.score:.3f}, not {score}"
            name = detector or label.split(":")[0]
            if (int(layer), int(head), name) in scores.index and not name.startswith("syntactic"):
                expected = scores.loc[(int(layer), int(head), name), "control"]
                assert f"{expected:.3f}" == control, f"{page}: {label} {layer}.{head}'s control is {expected:.3f}"
