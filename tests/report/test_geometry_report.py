"""Geometry inside an analysis and its report: the section's data and figures against the
`GeometryResult`, per-layer normalised importance, save/load, and `headscope geometry --into`;
a hybrid's geometry in its report."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import headscope
from tests.support.fake_analysis import fake_analysis
from tests.support.geometry_fixture import fake_analysis_with_geometry
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model
from headscope.analysis import Analysis
from headscope.errors import HeadscopeError
from headscope.loading.loader import Loaded
from headscope.probes.kinds import TextProbe
from headscope.head_geometry.importance import normalize_per_layer, probe_loss, pruning_curve
from headscope.head_geometry.geometry_result import removable_heads
from headscope.probes.base import text_probe
from headscope.report import render_html, report_data
from headscope.report.geometry_data import LOSS_RISE, TOP_IMPORTANT
from headscope.report.geometry_figures import (
    GEOMETRY_MAP_ID, IMPORTANCE_ID, PRUNING_ID, geometry_figures, geometry_map_figure, importance_figure,
    pruning_figure,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
WRITERS = {(0, 0), (1, 0)}  # the planted heads with W_V != 0: the only ones whose gate moves the loss


@pytest.fixture(scope="module")
def geometry_analysis(planted_geometry_result):
    return fake_analysis_with_geometry(planted_geometry_result[1])


def test_normalize_per_layer_divides_each_layer_by_its_l2_norm():
    scores = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.25]])
    normalized = normalize_per_layer(scores)
    assert normalized[0].tolist() == pytest.approx([0.6, 0.8, 0.0])
    assert normalized[1].tolist() == [0.0, 0.0, 0.0]  # a silent layer stays zero, no NaN
    assert normalized[2].tolist() == pytest.approx([0.5 / np.hypot(0.5, 0.25), 0.0, 0.25 / np.hypot(0.5, 0.25)])
    assert np.linalg.norm(normalized, axis=1).tolist() == pytest.approx([1.0, 0.0, 1.0])
    assert scores[0, 0] == 3.0  # input untouched


def test_planted_normalized_importance(planted_geometry_result):
    heads = planted_geometry_result[1].heads.set_index(["layer", "head"])
    grid = heads.importance.to_numpy().reshape(2, 4)
    assert heads.importance_normalized.to_numpy().reshape(2, 4) == pytest.approx(normalize_per_layer(grid))
    # One writer per layer, so each gets 1 and every silent head 0, although the raw scores differ.
    assert heads.importance[(0, 0)] != pytest.approx(heads.importance[(1, 0)])
    assert all(heads.importance_normalized[h] == pytest.approx(1.0 if h in WRITERS else 0.0) for h in heads.index)


def test_pruning_follows_the_normalized_order(planted_geometry_result):
    loaded, result = planted_geometry_result
    raw = result.heads.importance.to_numpy().reshape(2, 4)
    probe = text_probe(loaded.tokenizer, 4, 32)
    everything = [(layer, head) for layer in range(2) for head in range(4)]
    # Seven heads removed: the raw order keeps the most important writer, the normalised order
    # (a tie at 1.0, broken by position) keeps 1.0.
    kept = {"raw": max(WRITERS, key=lambda h: raw[h]), "normalized": (1, 0)}
    for name, scores in (("raw", raw), ("normalized", normalize_per_layer(raw))):
        curve = pruning_curve(loaded, probe, scores, steps=8, seeds=())
        at_seven = curve.set_index("removed").loss[7]
        expected = probe_loss(loaded, probe, 4, [h for h in everything if h != kept[name]])
        assert at_seven == pytest.approx(expected, rel=1e-6), name
    assert kept["raw"] != kept["normalized"]


def test_report_data_is_the_geometry(geometry_analysis, planted_geometry_result):
    result = planted_geometry_result[1]
    data = report_data(geometry_analysis).geometry
    heads = result.heads.set_index(["layer", "head"])
    labels = geometry_analysis.labels.set_index(["layer", "head"]).label
    assert [(p.layer, p.head) for p in data.points] == list(heads.index)
    for p in data.points:
        assert (p.x, p.y) == (heads.mds_x[(p.layer, p.head)], heads.mds_y[(p.layer, p.head)])
        assert p.cluster == heads.cluster[(p.layer, p.head)] and p.label == labels[(p.layer, p.head)]
        assert p.importance == heads.importance[(p.layer, p.head)]  # the curve used the raw order
    assert data.importance_kind == "importance" and data.importance.shape == (2, 4)
    assert data.n_clusters == heads.cluster.nunique()
    assert data.approximation_error == result.approximation_error
    ranked = result.heads.sort_values(["importance", "layer", "head"], ascending=[False, True, True])
    assert [(r.layer, r.head) for r in data.ranking] == list(zip(ranked.layer, ranked["head"]))[:TOP_IMPORTANT]
    assert [r.rank for r in data.ranking] == list(range(1, len(data.ranking) + 1))
    assert {(r.layer, r.head) for r in data.ranking[:2]} == WRITERS
    assert [r.importance_normalized for r in data.ranking] == [heads.importance_normalized[(r.layer, r.head)]
                                                              for r in data.ranking]
    rank = {(p.layer, p.head): p.rank for p in data.points}
    assert [rank[h] for h in zip(ranked.layer, ranked["head"])] == list(range(1, 9))
    assert [r.label for r in data.label_ranks] == sorted({p.label for p in data.points} - {"none"},
                                                         key=lambda label: min(v for h, v in rank.items() if labels[h] == label))
    for r in data.label_ranks:
        assert set(r.heads) == {h for h in rank if labels[h] == r.label} and r.n_total == 8
        assert list(r.ranks) == sorted(rank[h] for h in r.heads) == [rank[h] for h in r.heads]
    assert [(r.layer, r.head_a, r.head_b) for r in data.redundant] == \
        [(r.layer, r.head_a, r.head_b) for r in result.redundant.itertuples()]


def test_report_data_pruning_lines(geometry_analysis, planted_geometry_result):
    curve = planted_geometry_result[1].curve
    data = report_data(geometry_analysis).geometry
    assert [(line.order, line.seed) for line in data.curve] == [("importance", -1), ("random", 0), ("random", 1)]
    removable = removable_heads(curve, LOSS_RISE)
    for line in data.curve:
        rows = curve[(curve.order == line.order) & (curve.seed == line.seed)].sort_values("removed")
        assert line.removed == tuple(rows.removed) and line.loss == pytest.approx(tuple(rows.loss))
        assert line.removable == removable[(line.order, line.seed)]
    assert data.baseline_loss == curve[curve.removed == 0].loss.iloc[0]
    assert data.random_removable_mean == np.mean([removable[("random", s)] for s in (0, 1)])
    # The six silent heads go first in importance order without changing the loss.
    assert data.curve[0].removable == 6


def test_figures_carry_every_head_for_the_explorer(geometry_analysis):
    data = report_data(geometry_analysis)
    g = data.geometry
    fig = geometry_map_figure(g, data.label_grid)
    clicked = [tuple(c) for trace in fig.data for c in trace.customdata]
    assert sorted(clicked) == [(p.layer, p.head) for p in g.points]  # every head once, by [layer, head]
    points = {(p.layer, p.head): p for p in g.points}
    grid = data.label_grid
    for trace in fig.data:
        for (layer, head), x, y in zip(trace.customdata, trace.x, trace.y):
            p = points[(layer, head)]
            assert (x, y) == (pytest.approx(p.x, abs=1e-5), pytest.approx(p.y, abs=1e-5))
            assert trace.marker.color == grid.colours[grid.categories.index(p.label)]  # the label map's colour
    sizes = {tuple(c): s for trace in fig.data for c, s in zip(trace.customdata, trace.marker.size)}
    assert max(sizes, key=sizes.get) == (0, 0)  # the most important head is drawn largest
    heat = importance_figure(g)
    assert np.array(heat.data[0].z, dtype=float) == pytest.approx(np.round(g.importance, 4))
    pruning = pruning_figure(g)
    assert [list(t.y) for t in pruning.data[:-1]] == [pytest.approx(line.loss, abs=1e-5) for line in g.curve]
    assert list(pruning.data[-1].y) == pytest.approx([g.baseline_loss * (1 + LOSS_RISE)] * 2, abs=1e-5)
    assert [fig_id for fig_id, _ in geometry_figures(g, grid)] == [GEOMETRY_MAP_ID, IMPORTANCE_ID, PRUNING_ID]


def test_no_geometry_no_section_and_no_importance_no_figures(planted_geometry_result):
    assert report_data(fake_analysis(2, 4, seed=1)).geometry is None
    result = planted_geometry_result[1]
    silent = result.heads.assign(importance=np.nan, importance_normalized=np.nan)
    from headscope.head_geometry.geometry_result import GeometryResult

    bare = GeometryResult(silent, result.pairs, result.divergence, result.approximation_error, None, result.settings)
    data = report_data(fake_analysis_with_geometry(bare))
    g = data.geometry
    assert g.importance is None and g.ranking == () and g.label_ranks == () and g.curve == ()
    assert {p.rank for p in g.points} == {0}
    assert [fig_id for fig_id, _ in geometry_figures(g, data.label_grid)] == [GEOMETRY_MAP_ID]


def test_shape_mismatch_is_refused(planted_geometry_result):
    with pytest.raises(HeadscopeError, match="2 x 4 model"):
        fake_analysis(3, 4).with_geometry(planted_geometry_result[1])


def test_save_and_load_keep_the_geometry(geometry_analysis, tmp_path):
    geometry_analysis.save(tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a" / "geometry").iterdir()) == [
        "heads.csv", "pairs.csv", "pruning.csv", "settings.json", "similarity.csv"]
    back = Analysis.load(tmp_path / "a").geometry
    g = geometry_analysis.geometry
    pd.testing.assert_frame_equal(back.heads, g.heads, check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(back.pairs, g.pairs, check_exact=False, rtol=1e-12)
    pd.testing.assert_frame_equal(back.curve, g.curve, check_exact=False, rtol=1e-12)
    off = ~np.eye(8, dtype=bool)
    assert back.divergence[off] == pytest.approx(g.divergence[off], rel=1e-12, abs=1e-15)
    assert np.abs(np.diag(g.divergence)).max() < 1e-6 and (np.diag(back.divergence) == 0).all()
    assert back.approximation_error == g.approximation_error and back.settings == g.settings
    assert report_data(Analysis.load(tmp_path / "a")).geometry.curve == report_data(geometry_analysis).geometry.curve
    bare = fake_analysis(2, 4, seed=1)
    assert bare.with_geometry(g).geometry is g and bare.geometry is None  # a copy; the original is unchanged
    bare.save(tmp_path / "b")
    assert not (tmp_path / "b" / "geometry").exists() and Analysis.load(tmp_path / "b").geometry is None


def test_geometry_into_an_analysis_folder(planted_path, tmp_path):
    from typer.testing import CliRunner

    from headscope.cli import app
    model = planted_path
    out = tmp_path / "runs" / "planted"
    analyzed = CliRunner().invoke(app, ["analyze", model, "--out", str(out), "--n-examples", "4", "--seq-len", "40",
                                        "--device", "cpu", "--detectors", "previous_token,sink,uniform,self"])
    assert analyzed.exit_code == 0, analyzed.output
    (out / "notes.txt").write_text("mine")  # a file of the user's own survives the re-write
    before = {name: (out / name).read_bytes() for name in ("scores.csv", "labels.csv", "meta.json", "examples.json")}
    page_before = (out / "index.html").read_bytes()
    result = CliRunner().invoke(app, ["geometry", model, "--into", str(out), "--device", "cpu", "--examples", "4",
                                      "--seq-len", "32", "--normalize"])
    assert result.exit_code == 0, result.output
    assert f"report: {out / 'index.html'}" in result.output
    assert not (tmp_path / "geometry").exists()  # no --out: only the analysis folder is written
    assert {name: (out / name).read_bytes() for name in before} == before
    assert (out / "notes.txt").read_text() == "mine"
    assert [p.name for p in out.parent.iterdir()] == ["planted"]  # no temporary folders left
    analysis = Analysis.load(out)
    g = analysis.geometry
    assert len(g.heads) == 8 and g.settings["pruning_order"] == "importance_normalized"
    assert set(g.curve.order) == {"importance", "random"} and sorted(set(g.curve.seed)) == [-1, 0, 1, 2]
    data = report_data(analysis).geometry
    assert data.importance_kind == "importance_normalized"
    assert data.importance == pytest.approx(g.heads.importance_normalized.to_numpy().reshape(2, 4))
    assert (out / "index.html").read_bytes() != page_before
    rerendered = CliRunner().invoke(app, ["report", str(out)])  # the page is the saved analysis's page
    page = (out / "index.html").read_bytes()
    assert rerendered.exit_code == 0 and page == (out / "index.html").read_bytes()


def test_geometry_into_refuses_a_mismatch_and_leaves_the_folder(planted_path, tmp_path):
    from typer.testing import CliRunner

    from headscope.cli import app
    model = planted_path
    other = tmp_path / "other"
    fake_analysis(3, 5).save(other)
    files = {p.name: p.read_bytes() for p in other.iterdir()}
    result = CliRunner().invoke(app, ["geometry", model, "--into", str(other), "--device", "cpu", "--examples", "2",
                                      "--seq-len", "16", "--no-importance"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "has 2 x 4 heads, the analysis (fake/tiny-3x5) 3 x 5" in result.output.strip().splitlines()[-1]
    assert {p.name: p.read_bytes() for p in other.iterdir()} == files
    missing = CliRunner().invoke(app, ["geometry", model, "--into", model, "--no-importance"])
    assert missing.exit_code == 1 and "is not a headscope analysis" in missing.output


def test_notebook_helpers_are_the_report_figures(geometry_analysis):
    from headscope.report.plotting import plot_geometry_map, plot_pruning

    data = report_data(geometry_analysis)
    assert plot_geometry_map(geometry_analysis).to_plotly_json() == geometry_map_figure(data.geometry, data.label_grid).to_plotly_json()
    assert plot_pruning(geometry_analysis).to_plotly_json() == pruning_figure(data.geometry).to_plotly_json()
    with pytest.raises(HeadscopeError, match="holds no geometry"):
        plot_geometry_map(fake_analysis(2, 4))


def test_analyze_with_geometry_writes_it_into_the_report(planted_dir, tmp_path):
    from typer.testing import CliRunner

    from headscope.cli import app

    out = tmp_path / "planted"
    result = CliRunner().invoke(app, ["analyze", str(planted_dir), "--out", str(out), "--n-examples", "4",
                                      "--seq-len", "32", "--device", "cpu", "--detectors", "previous_token,sink",
                                      "--geometry"])
    assert result.exit_code == 0, result.output
    analysis = Analysis.load(out)
    assert analysis.geometry is not None and len(analysis.geometry.heads) == 8
    assert report_data(analysis).geometry is not None
    assert 'id="hs-geometry-map"' in (out / "index.html").read_text()


def test_a_hybrids_geometry_in_its_report_saved_and_from_the_command_line(tmp_path):
    """Jamba (attention in layers 1 and 3 of 4): the section's points are its attention heads, the
    importance grid is the label map's (every layer, blank where there is no attention), the page
    renders, the analysis folder reads back; `headscope geometry` works on the saved model."""
    from typer.testing import CliRunner

    from headscope.cli import app

    model, tokenizer = tiny_model("jamba", kind="hybrid"), char_tokenizer()
    loaded = Loaded.from_model(model, tokenizer, "tiny-jamba")
    analysis = headscope.analyze(loaded, detectors=["previous_token"], probes=[TextProbe(n_examples=2, seq_len=16)],
                                 explorer_examples=1)
    measured = headscope.add_geometry(analysis, loaded, n_examples=2, seq_len=16, pruning_steps=2, seeds=(0,))
    heads = measured.geometry.heads
    data = report_data(measured).geometry
    assert [(p.layer, p.head) for p in data.points] == [(layer, head) for layer in (1, 3) for head in range(4)]
    assert data.importance.shape == (4, 4) and np.isnan(data.importance[[0, 2]]).all()
    assert data.importance[[1, 3]] == pytest.approx(heads.importance.to_numpy().reshape(2, 4))
    hover = importance_figure(data).data[0].customdata
    assert hover[0][0] == "<b>layer 0</b>: no attention" and hover[3][2].startswith("<b>layer 3 head 2</b>")
    page = render_html(measured, plotlyjs="cdn")
    assert 'id="geometry"' in page and IMPORTANCE_ID in page and PRUNING_ID in page
    measured.save(tmp_path / "analysis")
    back = Analysis.load(tmp_path / "analysis").geometry
    assert back.layers == (1, 3) and back.divergence == pytest.approx(measured.geometry.divergence, abs=1e-12)
    dense = measured.geometry.heads.assign(layer=measured.geometry.heads.layer.map({1: 0, 3: 1}))
    with pytest.raises(HeadscopeError, match=r"the geometry is of a 2 x 4 model, the analysis of layers 1, 3 x 4"):
        analysis.with_geometry(replace(measured.geometry, heads=dense))

    model.save_pretrained(tmp_path / "jamba")
    tokenizer.save_pretrained(tmp_path / "jamba")
    result = CliRunner().invoke(app, ["geometry", str(tmp_path / "jamba"), "--out", str(tmp_path / "geometry"),
                                      "--device", "cpu", "--examples", "2", "--seq-len", "16", "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert sorted(set(pd.read_csv(tmp_path / "geometry" / "heads.csv").layer)) == [1, 3]
    assert (tmp_path / "geometry" / "geometry.html").exists()
