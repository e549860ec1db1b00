"""`headscope report --index DIR`: one page listing every report folder under DIR by the card each
writer leaves in its marker (analyses, comparisons, timelines; a kind the index has never heard
of is listed from its card alone; an analysis saved without its page with its tables and the
command that renders it), escaped, written atomically, each page linked back to it."""
import html
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope.atomic import MARKER, atomic_dir, read_card, write_card
from headscope.cli import app
from headscope.errors import HeadscopeError
from headscope.report import write_compare, write_report_into
from headscope.report.index import BACK_SLOT, BACK_SLOT_END, index_entries, is_index, update_index_of, write_index
from headscope.training.report import write_timeline_report
from tests.support.fake_analysis import fake_analysis
from tests.support.fake_timeline import fake_timeline_tables


def _analysis_folder(folder, analysis):
    with atomic_dir(folder) as tmp:
        analysis.write_into(tmp)
        write_report_into(analysis, tmp)
    return folder


def _timeline_folder(folder):
    scores, labels, steps = fake_timeline_tables()
    with atomic_dir(folder) as tmp:
        scores.to_csv(tmp / "timeline.csv", index=False)
        labels.to_csv(tmp / "labels.csv", index=False)
        steps.to_csv(tmp / "steps.csv", index=False)
        write_timeline_report(tmp, title="runs/toy")
    return folder


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """reports/ with two analyses, their comparison, a timeline, an analysis one level down, and a
    folder of a kind the index code never names (its card and page only)."""
    root = tmp_path_factory.mktemp("index") / "reports"
    a, b = fake_analysis(3, 4, seed=1, n_examples=1, seq_len=10), fake_analysis(3, 4, seed=2, n_examples=1, seq_len=10)
    b.meta["model"], b.meta["created"] = "other/<b>model</b>", "2025-02-01T10:00:00+00:00"
    _analysis_folder(root / "first", a)
    _analysis_folder(root / "second", b)
    write_compare(a, b, root / "compare")
    _timeline_folder(root / "timeline")
    _analysis_folder(root / "nested" / "deeper", a)
    with atomic_dir(root / "circuit") as tmp:  # a kind that lands later: only its card says what it is
        (tmp / "page.html").write_text("<!DOCTYPE html><html><body>" + BACK_SLOT + BACK_SLOT_END + "circuit</body></html>")
        write_card(tmp, "circuit", title="IOI circuit", model="tiny", headline=[("heads", "7")], page="page.html",
                   created="2025-03-01T00:00:00+00:00")
    (root / ".first.tmp-123").mkdir()  # a run's temporary folder: never listed
    (root / "notes").mkdir()  # a folder of the user's
    return root, a, b


def test_every_writer_leaves_a_card_with_its_kind_and_headline(reports):
    root, a, b = reports
    card = read_card(root / "first")
    assert card["kind"] == "analysis" and card["title"] == a.meta["model"] and card["created"] == a.meta["created"]
    counts = a.labels.label.str.split(":").str[0].value_counts()
    headline = dict(card["headline"])
    assert headline["heads"] == "3 × 4" and headline["control"] == a.meta["control"]["kind"]
    for name, value in headline.items():
        if name not in ("heads", "control"):
            assert int(value) == counts[name]  # the label counts themselves
    assert read_card(root / "compare")["kind"] == "comparison"
    changed = dict(read_card(root / "compare")["headline"])["heads that changed label"]
    assert int(changed) == int((a.labels.label != b.labels.label).sum())
    timeline = dict(read_card(root / "timeline")["headline"])
    assert timeline == {"steps": "3 (0 to 20)", "last ICL score": "-1.000", "heads labelled at the last step": "2 of 6"}


def test_the_index_lists_every_report_folder_newest_first(reports):
    root, a, b = reports
    entries = index_entries(root)
    assert {e.folder: e.kind for e in entries} == {"first": "analysis", "second": "analysis", "compare": "comparison",
                                                  "timeline": "timeline", "nested/deeper": "analysis", "circuit": "circuit"}
    created = [e.created for e in entries]
    assert created == sorted(created, reverse=True)
    assert next(e for e in entries if e.folder == "circuit").page == "circuit/page.html"


def test_an_analysis_folder_from_before_cards_is_listed_from_its_meta(reports, tmp_path):
    root, a, _ = reports
    old = _analysis_folder(tmp_path / "r" / "old", a)
    (old / MARKER).write_text("written by headscope; `--force` may replace this folder\n")  # the marker before cards
    (entry,) = index_entries(tmp_path / "r")
    assert (entry.kind, entry.title, entry.created) == ("analysis", a.meta["model"], a.meta["created"])
    assert dict(entry.headline)["heads"] == "3 × 4"


def test_an_analysis_saved_without_its_page_is_listed_with_its_tables_and_how_to_render_it(tmp_path):
    root = tmp_path / "saved"
    first = fake_analysis(3, 4, seed=1, n_examples=1, seq_len=10).save(root / "first")
    fake_analysis(3, 4, seed=2, n_examples=1, seq_len=10).save(root / "second")
    runner = CliRunner()
    result = runner.invoke(app, ["report", "--index", str(root)])
    assert result.exit_code == 0, result.output
    entries = {e.folder: e for e in index_entries(root)}
    assert set(entries) == {"first", "second"}
    entry = entries["first"]
    assert entry.kind == "analysis" and entry.page == ""
    assert {"first/scores.csv", "first/labels.csv"} <= set(entry.tables)
    assert entry.render == f"headscope report {shlex.quote(str(first))}"
    page = (root / "index.html").read_text()
    assert "No report folders" not in page
    assert 'href="first/scores.csv"' in page and 'href="second/labels.csv"' in page
    assert f"<code>{html.escape(entry.render)}</code> renders it" in page
    result = runner.invoke(app, ["report", str(first), "--plotlyjs", "cdn"])  # the command the list shows
    assert result.exit_code == 0, result.output
    entries = {e.folder: e for e in index_entries(root)}
    assert (entries["first"].page, entries["first"].tables, entries["first"].render) == ("first/index.html", (), "")
    page = (root / "index.html").read_text()  # re-written by `report DIR`: the index was above it
    assert 'href="first/index.html"' in page and 'href="second/scores.csv"' in page
    assert '<a href="../index.html">' in (first / "index.html").read_text()


def test_the_page_is_escaped_offline_and_links_each_report_back(reports):
    root, a, b = reports
    path = write_index(root)
    page = path.read_text()
    assert is_index(path)
    assert "<b>model</b>" not in page and "other/&lt;b&gt;model&lt;/b&gt;" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for folder in ("first", "second", "compare", "timeline", "nested/deeper"):
        assert f'href="{folder}/index.html"' in page
        text = (root / folder / "index.html").read_text()
        depth = folder.count("/") + 1
        assert f'{BACK_SLOT}<nav class="hs-index"><a href="{"../" * depth}index.html">' in text
    assert '<a href="../index.html">' in (root / "circuit" / "page.html").read_text()
    before = {f: (root / f / "index.html").stat().st_mtime_ns for f in ("first", "compare")}
    write_index(root)  # again: the pages already link back and are not re-written
    assert {f: (root / f / "index.html").stat().st_mtime_ns for f in before} == before
    assert not [p.name for p in root.iterdir() if p.name.startswith(".index")]  # no temporary file left


def test_a_page_of_the_users_or_a_report_folder_is_refused_and_left_alone(reports, tmp_path):
    root, a, _ = reports
    theirs = tmp_path / "mine"
    theirs.mkdir()
    (theirs / "index.html").write_text("<html>my own page</html>")
    with pytest.raises(HeadscopeError, match="was not written by `headscope report --index`"):
        write_index(theirs)
    assert (theirs / "index.html").read_text() == "<html>my own page</html>"
    with pytest.raises(HeadscopeError, match="is itself a report folder"):
        write_index(root / "first")
    with pytest.raises(HeadscopeError, match="is not a folder"):
        write_index(tmp_path / "absent")


def test_only_a_folder_named_reports_or_one_already_indexed_is_indexed_on_its_own(reports, tmp_path):
    root, a, _ = reports
    elsewhere = _analysis_folder(tmp_path / "runs" / "one", a)
    assert update_index_of(elsewhere) is None and not (tmp_path / "runs" / "index.html").exists()
    write_index(tmp_path / "runs")
    _analysis_folder(tmp_path / "runs" / "two", a)
    assert update_index_of(tmp_path / "runs" / "two") == tmp_path / "runs" / "index.html"
    assert 'href="two/index.html"' in (tmp_path / "runs" / "index.html").read_text()


def test_the_command_writes_the_index_and_compare_into_reports_updates_it(reports, tmp_path):
    root, a, b = reports
    work = tmp_path / "work"
    _analysis_folder(work / "reports" / "a", a)
    _analysis_folder(work / "reports" / "b", b)
    runner = CliRunner()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        result = runner.invoke(app, ["compare", "reports/a", "reports/b"])  # the default out: reports/compare
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    assert f"index: {Path('reports') / 'index.html'}" in result.output
    assert {e.folder for e in index_entries(work / "reports")} == {"a", "b", "compare"}
    result = runner.invoke(app, ["report", "--index", str(root)])
    assert result.exit_code == 0 and f"index: {root / 'index.html'}" in result.output
    result = runner.invoke(app, ["report"])
    assert result.exit_code == 2 and "--index" in result.output
