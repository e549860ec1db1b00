"""The HTML report: its data (label grid, hover, top heads, syntax, method), the page's
determinism, escaping and plotly.js embedding, the compare data, and atomic writes."""
import base64
import copy
import html
import json
import zlib

import numpy as np
import pytest

from tests.support.fake_analysis import NASTY_TOKENS, fake_analysis
from headscope.analysis import Analysis
from headscope.errors import HeadscopeError
from headscope.report import (
    compare_data, render_compare_html, render_html, report_data, write_compare, write_report, write_report_into,
)
from headscope.report import figures
from headscope.detectors.syntax.report import SYNTAX_ID
from headscope.detectors import REGISTRY
from headscope.report.data import OUTCOME_COLOURS, TOP_K, label_categories
from tests.support.pages import json_block


@pytest.fixture(scope="module")
def report_analysis():
    return fake_analysis()


@pytest.fixture(scope="module")
def report_analysis_data(report_analysis):
    return report_data(report_analysis)


@pytest.fixture(scope="module")
def page(report_analysis):
    return render_html(report_analysis)


def _with_meta(analysis, **changes) -> Analysis:
    other = copy.copy(analysis)
    other.meta = dict(copy.deepcopy(analysis.meta), **changes)
    return other


# --- data -----------------------------------------------------------------------------------

def test_fake_analysis_has_the_labels_the_report_must_handle(report_analysis):
    labels = set(report_analysis.labels["label"])
    assert {"mixed", "none", "syntactic:obj", "induction", "previous_token"} <= labels
    assert any(token in NASTY_TOKENS for example in report_analysis.examples for token in example.tokens)


def test_label_grid_matches_labels(report_analysis, report_analysis_data):
    grid = report_analysis_data.label_grid
    assert grid.index.shape == (report_analysis.n_layers, report_analysis.n_heads)
    for row in report_analysis.labels.itertuples(index=False):
        assert grid.labels[row.layer][row.head] == row.label
        assert grid.categories[grid.index[row.layer, row.head]] == row.label
        assert grid.passing[row.layer][row.head] == row.labels
        assert grid.scores[row.layer, row.head] == pytest.approx(row.score)
    # Fixed order and colours: headscope's labels first, others next, then "mixed" and "none".
    assert grid.categories == label_categories(report_analysis.labels["label"])
    assert grid.categories[-2:] == ("mixed", "none")
    for label, colour in zip(grid.categories, grid.colours):
        if label in REGISTRY and REGISTRY[label].colour:  # a detector's colour is its own
            assert colour == REGISTRY[label].colour
        if label in OUTCOME_COLOURS:
            assert colour == OUTCOME_COLOURS[label]
    assert len(set(grid.colours)) == len(grid.colours)


def test_hover_lists_every_detector_score_with_ci_quantity_and_control(report_analysis, report_analysis_data):
    quantities = {name: spec["quantity"] for name, spec in report_analysis.meta["detectors"].items()}
    for row in report_analysis.scores.itertuples(index=False):
        line = (f"{row.detector}: {quantities[row.detector]} {row.score:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]; "
                f"control (same head): {row.control:.3f}, control best head: {row.control_max:.3f}")
        assert line in report_analysis_data.label_grid.hover[row.layer][row.head]
    mixed = report_analysis.labels[report_analysis.labels["label"] == "mixed"].iloc[0]
    assert set(mixed["labels"].split(";")) == {"previous_token", "induction"}
    assert f"passing: {mixed['labels']}" in report_analysis_data.label_grid.hover[mixed["layer"]][mixed["head"]]


def test_detector_grids_match_scores(report_analysis, report_analysis_data):
    assert [g.detector for g in report_analysis_data.detector_grids] == report_analysis.detectors
    for grid in report_analysis_data.detector_grids:
        rows = report_analysis.scores[report_analysis.scores["detector"] == grid.detector]
        for row in rows.itertuples(index=False):
            assert grid.score[row.layer, row.head] == pytest.approx(row.score)
            assert grid.ci_low[row.layer, row.head] == pytest.approx(row.ci_low)
            assert grid.ci_high[row.layer, row.head] == pytest.approx(row.ci_high)
            assert grid.control[row.layer, row.head] == pytest.approx(row.control)
            assert grid.control_max[row.layer, row.head] == pytest.approx(row.control_max)
            hover = grid.hover[row.layer][row.head]
            assert f"{row.detector} ({grid.quantity}): {row.score:.3f}" in hover
            assert f"95% CI [{row.ci_low:.3f}, {row.ci_high:.3f}] (n={row.n})" in hover
            assert f"control (same head): {row.control:.3f}, control best head: {row.control_max:.3f}" in hover
        assert grid.threshold == report_analysis.meta["detectors"][grid.detector]["threshold"]
        assert grid.quantity == report_analysis.meta["detectors"][grid.detector]["quantity"]


def test_without_a_control_the_report_warns_and_shows_no_control_numbers():
    plain = fake_analysis(control=False)
    data = report_data(plain)
    from headscope.loading.control import resolve_control

    assert plain.meta["control"] == resolve_control(None, None, 0)[1]  # the fake's meta is analyze's
    assert len(data.warnings) == 1 and data.warnings[0].startswith("No control model (none was asked for)")
    assert dict(data.header)["Control"] == "none (none was asked for)"
    assert all("control" not in line for row in data.label_grid.hover for line in row)
    assert all("control" not in line for g in data.detector_grids for row in g.hover for line in row)
    assert all(np.isnan(t.control) and np.isnan(t.control_max) for t in data.top_heads)
    rules = {m.topic: m.text for m in data.rules}
    assert rules["control"].startswith("No control model (none was asked for)")
    assert all("no control: threshold only" in m.rule for m in data.methods if m.learned)
    # An analysis saved before controls existed: no columns, no meta["control"].
    old = copy.copy(plain)
    old.scores = plain.scores.drop(columns=["control", "control_max"])
    old.meta = {k: v for k, v in plain.meta.items() if k != "control"}
    old_data = report_data(old)
    assert "this analysis records none" in old_data.warnings[0] and dict(old_data.header)["Control"] == "not recorded"
    # A model too big for a twin: the warning gives resolve_control's reason.
    big = {"kind": "none", "seed": None, "name": None, "note": "no control model: its weights (9.0 GiB) would take more "
           "than half of the free memory (10.0 GiB); labels are not checked against an untrained twin"}
    assert report_data(_with_meta(plain, control=big)).warnings[0].startswith(
        "No control model (its weights (9.0 GiB) would take more than half of the free memory (10.0 GiB)):")
    assert np.isnan(old_data.detector_grids[0].control).all()
    render_html(old, plotlyjs="cdn")


def test_a_skipped_syntactic_detector_is_a_warning(report_analysis):
    note = "syntactic detector skipped: no relation has at least 30 scored arcs in each half"
    skipped = _with_meta(fake_analysis(with_syntax=False), syntax_notes=[note])
    assert note in report_data(skipped).warnings
    assert report_data(report_analysis).warnings == ()


def test_top_heads_are_sorted_and_at_most_five_per_label():
    big = fake_analysis(12, 7, seed=3)
    rows = report_data(big).top_heads
    labels = list(dict.fromkeys(t.label for t in rows))
    assert "none" not in labels and labels == [c for c in label_categories(big.labels["label"]) if c != "none"]
    for label in labels:
        group = [t for t in rows if t.label == label]
        expected = big.labels[big.labels["label"] == label]
        assert len(group) == min(TOP_K, len(expected))
        assert [t.rank for t in group] == list(range(1, len(group) + 1))
        assert [t.score for t in group] == sorted((t.score for t in group), reverse=True)
        assert group[0].score == pytest.approx(expected["score"].max())
    assert any(len([t for t in rows if t.label == label]) == TOP_K for label in labels)


def test_top_heads_carry_their_detector_quantity_and_the_control_of_the_same_head(report_analysis, report_analysis_data):
    scores = report_analysis.scores.set_index(["layer", "head", "detector"])
    specs = report_analysis.meta["detectors"]
    assert {t.label for t in report_analysis_data.top_heads} >= {"syntactic:obj", "mixed", "induction"}
    for t in report_analysis_data.top_heads:
        expected = {"syntactic:obj": "syntactic", "mixed": t.passing.split(";")[0]}.get(t.label, t.label)
        assert t.detector == expected and t.quantity == specs[expected]["quantity"]
        row = scores.loc[(t.layer, t.head, t.detector)]
        assert t.score == pytest.approx(row.score)  # the label's score is its detector's score
        assert (t.ci_low, t.ci_high) == (pytest.approx(row.ci_low), pytest.approx(row.ci_high))
        assert t.control == pytest.approx(row.control)  # the twin's score for this head and detector
        assert t.control_max == pytest.approx(scores.xs(t.detector, level="detector").control.max())
        assert t.text() == f"{t.score:.3f} (control {row.control:.3f})"  # what the table and the CLI print
        named = t.label if t.label.startswith("syntactic:") else t.passing.split(";")[0] if t.label == "mixed" else t.detector
        assert t.text(name_detector=True) == f"{named} {t.text()}"
    plain = report_data(fake_analysis(control=False)).top_heads[0]
    assert plain.text() == f"{plain.score:.3f}"  # no control, no bracket


def test_mixed_heads_show_the_detector_labels_would_pick():
    """A mixed head resting on the first token shows its repeated-probe detector, as labels.py picks it."""
    from headscope.report.data import label_detector

    meta = fake_analysis().meta
    assert label_detector("mixed", "sink;induction;duplicate_token", meta) == "induction"
    assert label_detector("mixed", "previous_token;self", meta) == "previous_token"
    assert label_detector("syntactic:obj", "syntactic:obj", meta) == "syntactic"
    head = report_data(fake_analysis()).top_heads[0]._replace(label="mixed", detector="syntactic", passing="sink;syntactic:cc")
    assert head.text(name_detector=True).startswith("syntactic:cc ")  # a mixed cell names the relation too


def test_syntax_best_from_meta_or_computed(report_analysis, report_analysis_data):
    assert [b.relation for b in report_analysis_data.syntax_best] == [b["relation"] for b in report_analysis.meta["syntax_best"]]
    assert report_analysis_data.syntax_best[1].accuracy == pytest.approx(report_analysis.meta["syntax_best"][1]["accuracy"])
    without_meta = _with_meta(report_analysis)
    del without_meta.meta["syntax_best"]
    computed = report_data(without_meta).syntax_best
    for best in computed:
        rows = report_analysis.syntax[report_analysis.syntax["relation"] == best.relation]
        assert best.accuracy == pytest.approx(rows["accuracy"].max())
        assert best.baseline_accuracy == pytest.approx(rows["baseline"].iloc[0])
    assert report_data(fake_analysis(with_syntax=False)).syntax_best is None


def test_syntax_relations_list_every_significant_relation_of_syntactic_heads(report_analysis, report_analysis_data):
    labelled = report_analysis.labels[report_analysis.labels["label"].str.startswith("syntactic:")]
    significant = report_analysis.syntax[report_analysis.syntax["significant"]]
    expected = significant.merge(labelled[["layer", "head"]], on=["layer", "head"])
    assert len(report_analysis_data.syntax_relations) == len(expected) >= 2  # the fake's obj head is also significant for nsubj
    for r in report_analysis_data.syntax_relations:
        row = expected[(expected.layer == r.layer) & (expected["head"] == r.head) & (expected.relation == r.relation)
                       & (expected.direction == r.direction)].iloc[0]
        assert (r.held_out_margin, r.ci_low, r.accuracy, r.baseline, r.n) == (
            pytest.approx(row.held_out_margin), pytest.approx(row.ci_low), pytest.approx(row.accuracy),
            pytest.approx(row.baseline), row.n)
        assert r.label == labelled.set_index(["layer", "head"]).label[(r.layer, r.head)]
    for head in {(r.layer, r.head) for r in report_analysis_data.syntax_relations}:  # clearest first within each head
        lows = [r.ci_low for r in report_analysis_data.syntax_relations if (r.layer, r.head) == head]
        assert lows == sorted(lows, reverse=True)
    assert report_data(fake_analysis(seed=5)).syntax_relations == ()  # no head labelled syntactic


def test_method_rows_and_header(report_analysis, report_analysis_data):
    specs = report_analysis.meta["detectors"]
    assert [m.detector for m in report_analysis_data.methods] == report_analysis.detectors
    for m in report_analysis_data.methods:
        spec = specs[m.detector]
        assert (m.formula, m.threshold, m.source, m.probe, m.quantity, m.learned, m.gate) == (
            spec["formula"], spec["threshold"], spec["source"], spec["probe"], spec["quantity"], spec["learned"], spec["gate"])
        value = "95% CI lower bound" if spec["gate"] == "ci_low" else "score"
        assert m.rule.startswith(f"{value} ≥ {spec['threshold']:g}")
        if spec["learned"]:
            assert m.rule.endswith("and 95% CI lower bound > the control's best head")
        else:
            assert "descriptive" in m.rule
    header = dict(report_analysis_data.header)
    assert header["Model"] == "fake/tiny-4x3"
    assert header["Heads"].startswith("4 layers × 3 heads (1 KV heads)")
    assert "seed" not in header and header["Seed"] == "0"
    assert "headscope 0.1.0" in header["Versions"] and header["Run time"].startswith("1.8 s")
    assert header["Control"] == f"random-init twin (same config and tokenizer), seed {report_analysis.meta['control']['seed']}"
    assert header["Treebank"] == "bundled: 445 sentences, 445 natural"
    assert dict(report_data(_with_meta(report_analysis, treebank={"source": "ud.conllu", "n_sentences": 9, "natural": None})).header)[
        "Treebank"] == "ud.conllu: 9 sentences, natural: unknown"
    assert "Treebank" not in dict(report_data(fake_analysis(with_syntax=False)).header)
    assert report_analysis_data.created == report_analysis.meta["created"]


def test_label_rules_state_the_rule_of_labels_py(report_analysis, report_analysis_data):
    from headscope.detectors.labels import MIXED_MARGIN

    rules = {m.topic: m.text for m in report_analysis_data.rules}
    assert set(rules) == {"pass", "control", "clarity", "resting", "syntax"}
    assert f"by less than {MIXED_MARGIN:g} the label is \"mixed\"" in rules["clarity"]
    assert "syntactic: the score's 95% CI lower bound" in rules["pass"]
    learned = [d for d, spec in report_analysis.meta["detectors"].items() if spec["learned"]]
    assert f"Learned behaviours ({', '.join(learned)})" in rules["control"]
    assert "sink, uniform describe where attention rests" in rules["control"]
    assert "(induction, duplicate_token)" in rules["resting"]
    syntactic = report_analysis.meta["detectors"]["syntactic"]["threshold"]
    assert f"95% CI lower bound ≥ {syntactic:g} and above the control's best head" in rules["syntax"]
    assert "two or more labels" not in " ".join(rules.values())
    assert "syntax" not in {m.topic for m in report_data(fake_analysis(with_syntax=False)).rules}


def test_prefixed_detector_names_and_missing_scores(report_analysis):
    """Scores named "syntactic:obj" use the "syntactic" threshold and method row; NaN shows as no score."""
    other = copy.copy(report_analysis)
    other.scores = report_analysis.scores.copy()
    syntactic = other.scores["detector"] == "syntactic"
    other.scores.loc[syntactic, "detector"] = "syntactic:obj"
    other.scores.loc[other.scores.index[0], ["score", "ci_low", "ci_high"]] = np.nan
    result = report_data(other)
    grid = [g for g in result.detector_grids if g.detector == "syntactic:obj"][0]
    assert grid.threshold == report_analysis.meta["detectors"]["syntactic"]["threshold"]
    assert [m.detector for m in result.methods] == report_analysis.detectors
    first = other.scores.iloc[0]
    assert f"{first.detector}: no score" in result.label_grid.hover[first["layer"]][first["head"]]
    assert "no score" in result.detector_grids[0].hover[first["layer"]][first["head"]]
    render_html(other, plotlyjs="cdn")


# --- page -----------------------------------------------------------------------------------

def test_render_is_deterministic_except_the_created_line(report_analysis, page):
    assert render_html(report_analysis) == page
    other = render_html(_with_meta(report_analysis, created="2031-12-31T23:59:59+00:00"))
    changed = [(a, b) for a, b in zip(page.splitlines(), other.splitlines()) if a != b]
    assert len(page.splitlines()) == len(other.splitlines())
    assert len(changed) == 1 and report_analysis.meta["created"] in changed[0][0] and "2031-12-31" in changed[0][1]


def test_tokens_are_escaped(report_analysis, page):
    assert "<script>alert" not in page and "<b>&" not in page
    # Every "</script>" closes one of the page's own script elements (none comes from a token).
    assert page.count("</script>") == page.count("<script")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;&lt;b&gt;&amp;" in page  # the example <select>
    payload = json_block(page, "hs-explorer-data")
    first = report_analysis.examples[0]
    # Tokens reach plotly escaped for its pseudo-HTML; unescaping gives the token back.
    assert [html.unescape(t) for t in payload["examples"][0]["tokens"]] == [t.replace(" ", "\u2423") for t in first.tokens]


def test_explorer_payload_holds_the_uint8_patterns(report_analysis, page):
    payload = json_block(page, "hs-explorer-data")
    assert (payload["n_layers"], payload["n_heads"]) == (report_analysis.n_layers, report_analysis.n_heads)
    assert payload["labels"][1][0] == "mixed" and payload["clickable"][0] == figures.LABEL_MAP_ID
    for example, stored in zip(report_analysis.examples, payload["examples"]):
        assert stored["encoding"] == "zlib+base64" and stored["n"] == len(example.tokens)
        raw = zlib.decompress(base64.b64decode(stored["data"]))
        assert np.array_equal(np.frombuffer(raw, np.uint8).reshape(example.patterns.shape), example.patterns)


def test_a_square_examples_payload_has_no_key_fields(page):
    examples = json_block(page, "hs-explorer-data")["examples"]
    assert all(not {"m", "keyTokens", "keyTicks"} & set(stored) for stored in examples)


def test_a_cross_attention_example_has_each_axis_tokens_escaped():
    analysis = fake_analysis(n_examples=2, seq_len=10, key_len=13)
    page = render_html(analysis, plotlyjs="cdn")
    payload = json_block(page, "hs-explorer-data")
    for example, stored in zip(analysis.examples, payload["examples"]):
        assert (stored["n"], stored["m"]) == (10, 13)
        raw = zlib.decompress(base64.b64decode(stored["data"]))
        assert np.array_equal(np.frombuffer(raw, np.uint8).reshape(example.patterns.shape), example.patterns)
        for tokens, shown in ((example.tokens, stored["tokens"]), (example.key_tokens, stored["keyTokens"])):
            assert [html.unescape(t) for t in shown] == [t.replace(" ", "\u2423") for t in tokens]
        assert stored["keyTicks"][4] == stored["keyTokens"][4] == "Le" and stored["ticks"][0] == "&lt;s&gt;"
    # The key axis's nasties reach the page escaped, as the queries' do.
    assert "<script>alert" not in page and page.count("</script>") == page.count("<script")
    assert "\\u0026lt;/script\\u0026gt;" in page.split('id="hs-explorer-data">')[1]
    assert "(10 query × 13 key tokens)" in page and "key (the encoder's tokens) on x" in page


def test_figures_have_fixed_ids(report_analysis, report_analysis_data, page):
    figs = json_block(page, "hs-figures")
    ids = [fig_id for fig_id, _ in figs]
    expected = [figures.LABEL_MAP_ID] + [figures.detector_id(i) for i in range(len(report_analysis.detectors))]
    assert ids == expected + [SYNTAX_ID, figures.EXPLORER_ID]
    for fig_id in ids:
        assert page.count(f'<div id="{fig_id}" class="figure">') == 1
    label_map = dict(figs)[figures.LABEL_MAP_ID]["data"][0]
    assert label_map["customdata"][0][0] == report_analysis_data.label_grid.hover[0][0]


def test_plotlyjs_embedded_once_and_cdn_page_is_small(report_analysis, page):
    import plotly.offline

    plotlyjs = plotly.offline.get_plotlyjs()
    assert page.count(plotlyjs[:300]) == 1 and plotlyjs in page
    cdn = render_html(report_analysis, plotlyjs="cdn")
    assert plotlyjs[:300] not in cdn and cdn.count("https://cdn.plot.ly/plotly-") == 1
    assert len(cdn.encode()) < 200_000
    with pytest.raises(HeadscopeError, match="plotlyjs"):
        render_html(report_analysis, plotlyjs="inline")


def test_syntax_section_present_iff_syntax(page):
    assert '<section id="syntax">' in page and f'id="{SYNTAX_ID}"' in page
    plain = render_html(fake_analysis(with_syntax=False), plotlyjs="cdn")
    assert '<section id="syntax">' not in plain and f'id="{SYNTAX_ID}"' not in plain
    for section in ("labels", "detectors", "explorer", "top-heads", "method"):
        assert f'<section id="{section}">' in plain


def test_page_for_a_30x9_model_stays_small():
    big = fake_analysis(30, 9, n_examples=4, seq_len=64)
    size = len(render_html(big).encode())
    assert size < 10_000_000, size  # plotly.js is ~4.8 MB of it


def test_report_of_a_saved_and_loaded_analysis(report_analysis, tmp_path):
    report_analysis.save(tmp_path / "run")
    loaded = Analysis.load(tmp_path / "run")
    assert report_data(loaded).label_grid.labels == report_data(report_analysis).label_grid.labels
    path = write_report_into(loaded, tmp_path / "run", plotlyjs="cdn")
    assert path == tmp_path / "run" / "index.html" and "headscope report" in path.read_text()


# --- compare --------------------------------------------------------------------------------

def test_compare_finds_changed_labels_and_score_differences(report_analysis):
    after = copy.copy(report_analysis)
    after.labels = report_analysis.labels.copy()
    after.scores = report_analysis.scores.copy()
    row_a = (after.labels["layer"] == 0) & (after.labels["head"] == 1)
    row_b = (after.labels["layer"] == 3) & (after.labels["head"] == 2)
    after.labels.loc[row_a, ["label", "score"]] = ["induction", 0.9]
    after.labels.loc[row_b, ["label", "score"]] = ["none", 0.1]
    sink = after.scores["detector"] == "sink"
    after.scores.loc[sink, "score"] = after.scores.loc[sink, "score"] + 0.25
    result = compare_data(report_analysis, after)
    assert result.same_shape and result.notes == ()
    assert [(c.layer, c.head, c.label_a, c.label_b) for c in result.changed] == [(0, 1, "none", "induction"), (3, 2, "mixed", "none")]
    assert result.changed[0].score_b == pytest.approx(0.9)
    assert result.changed[0].quantity_a == "highest score of any detector"
    assert result.changed[0].quantity_b == report_analysis.meta["detectors"]["induction"]["quantity"]
    mixed = report_analysis.labels.set_index(["layer", "head"]).labels[(3, 2)].split(";")[0]  # its clearest detector
    assert result.changed[1].quantity_a == report_analysis.meta["detectors"][mixed]["quantity"]
    assert all(d.quantity == report_analysis.meta["detectors"][d.detector]["quantity"] for d in result.diffs)
    assert all(t.quantity == report_analysis.meta["detectors"][t.detector]["quantity"] for t in result.top)
    diffs = {d.detector: d.diff for d in result.diffs}
    assert np.allclose(diffs["sink"], 0.25) and np.allclose(diffs["induction"], 0.0)
    assert "b − a: +0.250" in result.diffs[report_analysis.detectors.index("sink")].hover[2][1]
    assert "sink (attention mass)" in result.diffs[report_analysis.detectors.index("sink")].hover[2][1]
    counts = {c.label: (c.count_a, c.count_b) for c in result.label_counts}
    assert counts["none"] == (2, 2) and counts["mixed"] == (2, 1)
    assert result.grid_a.categories == result.grid_b.categories


def test_compare_notes_when_only_one_analysis_had_a_control(report_analysis):
    notes = compare_data(report_analysis, fake_analysis(control=False)).notes
    assert len(notes) == 1 and notes[0].startswith("Controls differ (a: random-init twin")
    assert "b: none (none was asked for)" in notes[0]


def test_compare_of_different_shapes_compares_top_heads_only(report_analysis):
    other = fake_analysis(5, 2, seed=1, with_syntax=False)
    result = compare_data(report_analysis, other)
    assert not result.same_shape and result.diffs == () and result.changed == ()
    assert "different shapes" in result.notes[0] and "only in a: syntactic" in result.notes[1]
    sink = [t for t in result.top if t.detector == "sink"]
    assert [t.rank for t in sink] == [1, 2, 3, 4, 5]
    best_b = other.scores[other.scores["detector"] == "sink"].sort_values("score").iloc[-1]
    assert sink[0].b_head == (best_b["layer"], best_b["head"]) and sink[0].b_score == pytest.approx(best_b.score)
    page = render_compare_html(report_analysis, other, plotlyjs="cdn")
    assert "different shapes" in page and '<section id="changed">' not in page


def test_write_compare(report_analysis, tmp_path):
    path = write_compare(report_analysis, fake_analysis(seed=2), tmp_path / "cmp")
    text = path.read_text()
    assert path.name == "index.html" and '<section id="differences">' in text and "hs-diff-0" in text
    with pytest.raises(HeadscopeError, match="already exists"):
        write_compare(report_analysis, report_analysis, tmp_path / "cmp")


# --- atomic writes ---------------------------------------------------------------------------

def test_write_report_refuses_an_existing_folder_without_force(report_analysis, tmp_path):
    out = tmp_path / "report"
    path = write_report(report_analysis, out, plotlyjs="cdn")
    assert path == out / "index.html"
    before = path.read_bytes()
    with pytest.raises(HeadscopeError, match="already exists"):
        write_report(fake_analysis(seed=5), out, plotlyjs="cdn")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    write_report(fake_analysis(seed=5), out, plotlyjs="cdn", force=True)
    assert path.read_bytes() != before


def test_failed_render_leaves_no_folder(report_analysis, tmp_path, monkeypatch):
    def broken(grid):
        raise RuntimeError("figure failed")

    monkeypatch.setattr(figures, "detector_figure", broken)
    with pytest.raises(RuntimeError, match="figure failed"):
        write_report(report_analysis, tmp_path / "report")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    with pytest.raises(HeadscopeError, match="plotlyjs"):
        write_report(report_analysis, tmp_path / "report", plotlyjs="bogus")
    assert list(tmp_path.iterdir()) == []


def test_a_saved_analysis_renders_with_its_detectors_colours_in_a_fresh_process(report_analysis, report_analysis_data, tmp_path):
    """`headscope report DIR` loads a saved analysis without running any detector: the report
    must still know the built-in detectors' colours and legend order (it once got an empty
    registry there, and drew every label in spare colours, sorted by name)."""
    import subprocess
    import sys

    report_analysis.save(tmp_path / "saved")
    script = ("import json, sys; from headscope.analysis import Analysis; from headscope.report.data import report_data; "
              "g = report_data(Analysis.load(sys.argv[1])).label_grid; "
              "print(json.dumps([list(g.categories), list(g.colours)]))")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "saved")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    categories, colours = json.loads(out.stdout)
    assert categories == list(report_analysis_data.label_grid.categories) and colours == list(report_analysis_data.label_grid.colours)
    assert colours[categories.index("induction")] == REGISTRY["induction"].colour
