"""The circuit page: the layout places every drawn edge's ends by layer, the figures hold the circuit's
own numbers, text from labels and meta is escaped, the faithfulness section appears only once the
circuit was evaluated."""
import pandas as pd

from headscope.circuits.edge_circuit import Circuit
from headscope.circuits.circuit_page import (FAITHFULNESS_ID, GRAPH_ID, PARTS, faithfulness_figure, graph_figure,
                                             graph_layout, page_data, receiver_node, render_circuit_html)

from tests.support.fake_circuit import fake_circuit


def test_receiver_names():
    assert receiver_node("a3.h2.k") == ("a3.h2", "k")
    assert receiver_node("a12.h0.q") == ("a12.h0", "q")
    assert receiver_node("m3") == ("m3", "")
    assert receiver_node("m3.2") == ("m3.2", "")  # a layer's second mixer, not a head's input
    assert receiver_node("c4") == ("c4", "")
    assert receiver_node("logits") == ("logits", "")


def test_the_layout_places_every_shown_edge_by_layer():
    found = fake_circuit(30, 9)  # SmolLM2's size: 30 layers x 9 heads and 30 MLPs
    positions = graph_layout(found.nodes)
    assert set(positions) == set(found.nodes.name)
    for row in found.top(300).itertuples():
        assert row.src in positions and receiver_node(row.dst)[0] in positions
    x = {name: point[0] for name, point in positions.items()}
    for layer in range(30):
        heads = [f"a{layer}.h{h}" for h in range(9)]
        assert len({x[h] for h in heads}) == 1  # a layer's heads share a column ...
        assert len({positions[h][1] for h in heads}) == 9  # ... spread in y
        assert x["embed"] < x[heads[0]] < x[f"m{layer}"] < x["logits"]  # the MLP beside its heads, after them
        if layer:
            assert x[f"m{layer - 1}"] < x[heads[0]]  # every node of a layer after the layer before
    # whatever reads a sender lies right of it: each edge runs forward
    for row in found.edges.itertuples():
        assert x[row.src] < x[receiver_node(row.dst)[0]] or (row.src.startswith("a") and row.dst.startswith("m"))


def test_the_layout_of_a_saved_circuit(tmp_path):
    found = fake_circuit(3, 4, evaluated=True)
    found.save(tmp_path / "c")
    back = Circuit.load(tmp_path / "c")  # nodes.csv read back: missing layers are NaN, not <NA>
    assert graph_layout(back.nodes) == graph_layout(found.nodes)


def test_the_graph_draws_the_top_edges():
    found = fake_circuit(4, 3, seed=1)
    data = page_data(found, labels={(2, 1): "induction"}, n_edges=25)
    top = found.top(25)
    assert [(e.src, e.dst, e.score) for e in data.edges] == list(zip(top.src, top.dst, top.score))
    assert data.labels["a2.h1"] == "induction" and data.labels["a0.h0"] == ""
    assert data.touched == set(top.src) | {receiver_node(d)[0] for d in top.dst}
    fig = graph_figure(data)
    lines = [t for t in fig.data if t.mode == "lines" and t.x[0] is not None]
    assert sum(list(t.x).count(None) for t in lines) == 25  # one segment per edge drawn
    for part, (dash, _) in PARTS.items():  # each receiving input has its own dash, in the legend too
        drawn = sum(list(t.x).count(None) for t in lines if t.line.dash == dash)
        assert drawn == sum(1 for e in data.edges if e.part == part)
    assert {t.name for t in fig.data if t.name} >= {words for _, words in PARTS.values()}


def test_the_faithfulness_curve_holds_the_evaluation():
    found = fake_circuit(3, 4, evaluated=True)
    fig = faithfulness_figure(page_data(found))
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["top edges by signed score (CPR)"].x) == [0.1, 1, 10, 100]
    assert list(by_name["top edges by signed score (CPR)"].y) == [0.2, 0.5, 0.9, 1.0]
    assert list(by_name["random circuits: mean"].y) == [0.0, 0.05, 0.2, 1.0]
    assert fig.layout.xaxis.type == "log"


def test_the_faithfulness_section_only_with_an_evaluation():
    plain = render_circuit_html(fake_circuit(3, 4), plotlyjs="cdn")
    evaluated = render_circuit_html(fake_circuit(3, 4, evaluated=True), plotlyjs="cdn")
    assert GRAPH_ID in plain and GRAPH_ID in evaluated
    assert FAITHFULNESS_ID not in plain and "CPR" not in plain
    assert f"id=\"{FAITHFULNESS_ID}\"" in evaluated and "CPR 0.930" in evaluated and "CMD 0.050" in evaluated
    assert f"{len(fake_circuit(3, 4).edges)} scored; the graph draws the top {len(fake_circuit(3, 4).edges)} " in plain
    larger = fake_circuit(6, 4)
    assert f"{len(larger.edges)} scored; the graph draws the top 300 " in render_circuit_html(larger, plotlyjs="cdn")
    assert "the top 40 by" in render_circuit_html(larger, n_edges=40, plotlyjs="cdn")


def test_text_from_labels_and_meta_is_escaped():
    found = fake_circuit(3, 4)
    found.meta.update(model="<img src=x onerror=alert(1)>", task="</script><script>alert(2)</script>")
    hostile = "<script>alert(3)</script>"
    labels = pd.DataFrame([(layer, head, hostile) for layer in range(3) for head in range(4)],
                          columns=["layer", "head", "label"])  # an analysis's labels table
    page = render_circuit_html(found, labels=labels, plotlyjs="cdn")
    assert "alert(3)</script>" not in page and "<img src=x" not in page and "<script>alert(2)" not in page
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in page  # the edges table, escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # the title and header
