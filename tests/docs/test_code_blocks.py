"""The Python blocks of README.md and docs/ run, page by page, top to bottom in one namespace, in
a fresh working folder: what the documentation shows works as written.

Where the real model is not the point, `headscope.load("smollm2-135m")` and `load("minilm-l6")`
give small stand-ins of the same family (`tests/docs/standins.py`): no block's point is a number
of the real models (tests/cli/test_real_cli.py and the golden analyses check those). A comment on
the line before a block changes how it runs:
`<!-- docs-test: slow -->` runs it only in the slow tests (a block that trains, or runs long
prompts, even on the stand-ins), with the page's other blocks before it;
`<!-- docs-test: skip: REASON -->` leaves it out, for what a test machine cannot give (a model of
the reader's own, an image model), and the reason must be said. Blocks in other languages
(`bash`, `text`) are not run.
"""
import re
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!--\s*docs-test:\s*(slow|skip:\s*(\S.*?))\s*-->")
MAX_SKIPPED = 4  # blocks left out for good; each says why


class Block(NamedTuple):
    page: str
    line: int
    code: str
    mode: str  # "fast", "slow" or "skip"
    reason: str


def _pages() -> list:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p.relative_to(ROOT).as_posix() for p in pages]


def blocks(page: str) -> list:
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        mode, reason = ("fast", "") if marker is None else \
            (("slow", "") if marker.group(1) == "slow" else ("skip", marker.group(2)))
        found.append(Block(page, text[:match.start()].count("\n") + 2, match.group(1), mode, reason))
    return found


ALL = [b for page in _pages() for b in blocks(page)]
FAST_PAGES = sorted({b.page for b in ALL if b.mode == "fast"})
SLOW_PAGES = sorted({b.page for b in ALL if b.mode == "slow"})


@pytest.fixture(scope="session")
def standins(tmp_path_factory):
    from tests.docs.standins import save_standins

    return save_standins(tmp_path_factory.mktemp("standins"))


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A fresh working folder; detectors a page registers and plotly's renderer put back after it."""
    import plotly.io as pio

    from headscope.detectors.registry import REGISTRY

    monkeypatch.chdir(tmp_path)
    registered, renderer = dict(REGISTRY), pio.renderers.default
    yield tmp_path
    for name in [name for name in REGISTRY if name not in registered]:
        del REGISTRY[name]
    REGISTRY.update(registered)
    pio.renderers.default = renderer


def _run(page: str, modes: tuple) -> None:
    namespace = {"__name__": "__docs__"}
    for block in blocks(page):
        if block.mode in modes:
            exec(compile(block.code, f"{block.page}:{block.line}", "exec"), namespace)  # noqa: S102 (our own docs)


@pytest.fixture
def routed(standins, monkeypatch):
    """`headscope.load` gives the stand-ins for the two aliases."""
    from headscope.loading import loader

    real = loader.load

    def load(spec=loader.DEFAULT_MODEL, *args, **kwargs):
        return real(str(standins[spec]) if spec in standins else spec, *args, **kwargs)

    monkeypatch.setattr(loader, "load", load)


@pytest.mark.parametrize("page", FAST_PAGES)
def test_the_python_blocks_of_a_page_run(page, sandbox, routed):
    _run(page, ("fast",))


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES)
def test_the_slow_blocks_of_a_page_run(page, sandbox, routed):
    _run(page, ("fast", "slow"))


def test_blocks_are_found_and_few_are_left_out():
    assert len(ALL) >= 20 and {"README.md", "docs/getting-started.md"} <= set(FAST_PAGES)
    skipped = [b for b in ALL if b.mode == "skip"]
    assert len(skipped) <= MAX_SKIPPED, [f"{b.page}:{b.line}" for b in skipped]
    assert all(len(b.reason.split()) >= 3 for b in skipped), "a skipped block says why"
