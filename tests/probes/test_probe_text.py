"""Sanity checks for the natural-English probe corpus in probes/text/."""

from pathlib import Path

import pytest

TEXT_DIR = Path(__file__).resolve().parents[2] / "probes" / "text"
TEXT_FILES = sorted(TEXT_DIR.glob("*.txt"))

MIN_PASSAGE_WORDS = 100
MAX_PASSAGE_WORDS = 500
MIN_TOTAL_WORDS = 7000
MIN_REGISTERS = 7


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")


def _passages(text: str) -> list[str]:
    """Split on lines that consist only of '---'; drop empty chunks."""
    chunks: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip() == "---":
            chunks.append([])
        else:
            chunks[-1].append(line)
    return [p for p in ("\n".join(c).strip() for c in chunks) if p]


def test_at_least_seven_registers():
    assert len(TEXT_FILES) >= MIN_REGISTERS, [p.name for p in TEXT_FILES]


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: p.name)
def test_file_is_utf8_and_nonempty(path):
    text = _read(path)  # raises UnicodeDecodeError if not valid UTF-8
    assert text.strip(), f"{path.name} is empty"


@pytest.mark.parametrize("path", TEXT_FILES, ids=lambda p: p.name)
def test_passage_lengths(path):
    passages = _passages(_read(path))
    assert passages, f"{path.name} has no passages"
    for i, passage in enumerate(passages):
        n = len(passage.split())
        assert MIN_PASSAGE_WORDS <= n <= MAX_PASSAGE_WORDS, (
            f"{path.name} passage {i} has {n} words"
        )


def test_total_word_count():
    total = sum(len(_read(p).split()) for p in TEXT_FILES)
    assert total >= MIN_TOTAL_WORDS, total
