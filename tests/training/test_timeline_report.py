"""The timeline page's data (`timeline_data`) from hand-made tables, and its HTML: escaped text,
plotly.js once, fixed div ids."""
from headscope.training.report import FIGURE_IDS, TOP_HEADS, render_timeline, timeline_data
from tests.support.fake_timeline import fake_timeline_tables


def test_the_data_holds_top_heads_first_labels_and_the_label_map():
    scores, labels, steps = fake_timeline_tables()
    data = timeline_data(scores, labels, steps, {"control": "<step 0>", "detectors": ["previous_token", "induction"]})
    assert data.steps == [0, 10, 20] and data.detectors == ["previous_token", "induction"]
    top = data.top["induction"]
    assert len(top) == TOP_HEADS and top[0]["head"] == "1.2" and top[0]["score"] == [0.05 + 0.02, 0.07, 0.9]
    assert top[0]["ci_high"][-1] == 0.92
    assert data.controls["induction"] == 0.06
    assert data.first_labels == [{"label": "previous_token", "head": "0.1", "step": 10, "score": 0.7},
                                 {"label": "induction", "head": "1.2", "step": 20, "score": 0.9}]
    assert data.icl["icl_score"] == [0.0, -0.1, -1.0]  # in step order
    assert data.icl["train_loss"][0] is None
    assert data.label_map[0] == [["none"] * 3] * 2
    assert data.label_map[2][1][2] == "induction" and data.label_map[1][0][1] == "previous_token"
    assert data.label_names == ["none", "induction", "previous_token"]


def test_the_page_escapes_text_embeds_plotly_once_and_has_fixed_ids():
    scores, labels, steps = fake_timeline_tables()
    data = timeline_data(scores, labels, steps, {"control": "<b>step 0</b>"})
    page = render_timeline(data, title="<script>alert(1)</script>")
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;step 0&lt;/b&gt;" in page
    import plotly.offline

    plotlyjs = plotly.offline.get_plotlyjs()
    assert page.count(plotlyjs[:300]) == 1 and plotlyjs in page
    assert page.count("</script>") == page.count("<script")
    for fig_id in [*FIGURE_IDS.values(), "hs-timeline-score-0", "hs-timeline-score-1"]:
        assert page.count(f'<div id="{fig_id}" class="figure">') == 1
    assert render_timeline(data, title="x") == render_timeline(data, title="x")  # deterministic
