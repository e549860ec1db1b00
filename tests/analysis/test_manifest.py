"""Analysis folders carry a manifest (size and SHA-256 of each file) that `Analysis.load`, and
through it `report` and `compare`, check: a table cut mid-row or changed is refused in one line,
never rendered in part. Folders written before manifests (and markers) existed still load;
one with headscope's marker but no manifest is damaged (tests/faults/test_newer_surfaces.py)."""
import json

import pytest
from typer.testing import CliRunner

from headscope.analysis import Analysis
from headscope.atomic import MANIFEST, MARKER
from headscope.cli import app
from headscope.errors import HeadscopeError
from tests.support.fake_analysis import fake_analysis


@pytest.fixture
def saved(tmp_path):
    return fake_analysis().save(tmp_path / "run")


def test_the_manifest_lists_every_data_file_with_its_size_and_hash(saved):
    files = json.loads((saved / MANIFEST).read_text())["files"]
    assert {"scores.csv", "labels.csv", "meta.json", "examples.json"} <= set(files)
    assert all(entry["bytes"] == (saved / name).stat().st_size and len(entry["sha256"]) == 64
               for name, entry in files.items())
    Analysis.load(saved)  # whole: loads


def test_a_table_cut_mid_row_is_refused(saved):
    scores = saved / "scores.csv"
    data = scores.read_bytes()
    scores.write_bytes(data[: len(data) // 2])  # mid-row: pandas alone would read half the heads
    with pytest.raises(HeadscopeError, match=rf"damaged: scores.csv has {len(data) // 2} of the {len(data)} bytes"):
        Analysis.load(saved)


def test_a_changed_byte_of_the_same_size_is_refused(saved):
    meta = saved / "meta.json"
    text = meta.read_text()
    meta.write_text(text.replace('"seed": 0', '"seed": 9'))
    assert len(meta.read_text()) == len(text)
    with pytest.raises(HeadscopeError, match="meta.json was changed after it was written"):
        Analysis.load(saved)


def test_report_and_compare_say_it_in_one_line_and_write_nothing(saved, tmp_path):
    other = fake_analysis(seed=1).save(tmp_path / "other")
    labels = saved / "labels.csv"
    labels.write_bytes(labels.read_bytes()[:-10])
    page = saved / "index.html"
    before = page.read_bytes() if page.exists() else None
    for args in (["report", str(saved)], ["compare", str(saved), str(other), "--out", str(tmp_path / "cmp")]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and "labels.csv has" in errors[0] and "Traceback" not in result.output
    assert not (tmp_path / "cmp").exists()
    assert (page.read_bytes() if page.exists() else None) == before


def test_re_rendering_the_report_keeps_the_folder_loadable(saved):
    result = CliRunner().invoke(app, ["report", str(saved)])
    assert result.exit_code == 0, result.output
    Analysis.load(saved)


def test_a_folder_from_before_manifests_and_markers_still_loads(saved):
    (saved / MANIFEST).unlink()
    (saved / MARKER).unlink()
    assert len(Analysis.load(saved).scores) > 0
