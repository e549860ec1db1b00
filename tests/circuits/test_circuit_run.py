"""The circuit folder: written whole (the circuit's files, the page, the card, the manifest), read
back as written, refused or replaced by the rules every headscope folder follows."""
import json

import pandas as pd
import pytest

import headscope
from headscope.circuits.circuit_run import circuit_headline, read_circuit, write_circuit
from headscope.folders import read_card

from tests.support.fake_circuit import fake_circuit


def test_the_folder_and_its_card(tmp_path):
    found = fake_circuit(3, 4, evaluated=True)
    page = write_circuit(found, tmp_path / "c", labels={(1, 2): "induction"})
    assert page == tmp_path / "c" / "index.html"
    names = {p.name for p in (tmp_path / "c").iterdir()}
    assert names == {"edges.csv", "nodes.csv", "meta.json", "evaluation.csv", "index.html", "manifest.json",
                     ".headscope"}
    listed = json.loads((tmp_path / "c" / "manifest.json").read_text())["files"]
    assert set(listed) == {"edges.csv", "nodes.csv", "meta.json", "evaluation.csv"}  # the page: re-linked in place
    card = read_card(tmp_path / "c")
    assert card["kind"] == "circuit" and card["page"] == "index.html" and card["model"] == "fake"
    assert dict(card["headline"]) == dict(circuit_headline(found))
    assert dict(card["headline"])["CPR"] == "0.930"
    back = read_circuit(tmp_path / "c")
    pd.testing.assert_frame_equal(back.edges, found.edges)
    assert back.evaluation.attrs["cmd"] == pytest.approx(0.05)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_force_replaces_only_headscope_folders(tmp_path):
    found = fake_circuit(2, 3)
    write_circuit(found, tmp_path / "c")
    with pytest.raises(headscope.HeadscopeError, match="already exists"):
        write_circuit(found, tmp_path / "c")
    write_circuit(fake_circuit(2, 3, seed=5), tmp_path / "c", force=True)
    assert read_circuit(tmp_path / "c").edges.score.tolist() == fake_circuit(2, 3, seed=5).edges.score.tolist()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(headscope.HeadscopeError, match="did not write"):
        write_circuit(found, mine, force=True)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_changed_file_is_caught(tmp_path):
    write_circuit(fake_circuit(2, 3), tmp_path / "c")
    edges = tmp_path / "c" / "edges.csv"
    edges.write_text(edges.read_text().replace("embed", "embex", 1))
    with pytest.raises(headscope.HeadscopeError, match="edges.csv was changed"):
        read_circuit(tmp_path / "c")


def test_the_index_lists_it_and_links_back_without_damaging_it(tmp_path):
    from headscope.report.index import index_entries, write_index

    write_circuit(fake_circuit(2, 3, evaluated=True), tmp_path / "runs" / "c")
    entries = index_entries(tmp_path / "runs")
    assert [(e.kind, e.page) for e in entries] == [("circuit", "c/index.html")]
    write_index(tmp_path / "runs")  # fills the page's link back in place
    assert "../index.html" in (tmp_path / "runs" / "c" / "index.html").read_text()
    read_circuit(tmp_path / "runs" / "c")  # the manifest leaves the page out, so the folder is intact
