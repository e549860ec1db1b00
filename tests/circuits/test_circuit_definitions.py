"""The circuit numbers as the literature defines them, each against an independent reference:
EAP-IG against integrated gradients taken by hand (autograd on a Llama forward written out from
the weights, tests/support/llama_reference.py) at the EAP-IG code's points and the other rule;
exact edge patching of .q, .k and .v edges under grouped-query attention against the same
forward with one edge moved; CPR and CMD as MIB ranks them, over sizes that run to 100%; the kl
metric refused where its gradient is 0; non-finite models named; stability and the EAP-IG JSON."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

import headscope
from headscope.circuits.edge_circuit import Circuit, circuit
from headscope.circuits.faithfulness import area, check_sizes, toward_clean
from headscope.circuits.edges import graph_of
from headscope.circuits.interchange import from_eap_name, to_eap_name
from headscope.circuits.edge_patching import Patched
from headscope.circuits.target import Target
from headscope.circuits.stability import stability

from tests.support.circuit_models import one_edge_nudged, random_task, scaled
from tests.support.llama_reference import LlamaReference, eap_ig_scores, edge_patched_metric
from tests.support.tiny import tiny_model


@pytest.fixture(scope="module")
def llama():
    return scaled(tiny_model("llama"), 0.2)  # 2 layers, 6 query heads sharing 2 key/value heads


def _one_layer():
    model = scaled(tiny_model("llama", seed=4), 0.3, seed=7)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    return model


def _scores(found) -> dict:
    return {(s, d): float(v) for s, d, v in zip(found.edges.src, found.edges.dst, found.edges.score)}


@pytest.mark.parametrize("steps, riemann", [(1, "left"), (3, "left"), (5, "left"), (1, "right"), (3, "right"),
                                            (5, "right")])
def test_eap_ig_is_integrated_gradients_by_hand(llama, steps, riemann):
    task = random_task(seed=2)
    reference = LlamaReference(llama)
    reference.check(task.clean)
    expected = eap_ig_scores(reference, task, steps, riemann)
    got = _scores(circuit(llama, task, method="eap-ig", steps=steps, riemann=riemann, batch_size=2))
    assert set(got) == set(expected)  # the same 198 edges, .q/.k/.v of every query head included
    scale = max(abs(v) for v in expected.values())
    assert scale > 0.1
    worst = max(abs(got[e] - expected[e]) for e in expected)
    assert worst <= 1e-5 * scale, worst


def test_the_two_rules_differ_and_left_starts_at_the_corrupted_run(llama):
    task = random_task(seed=2)
    left = _scores(circuit(llama, task, method="eap-ig", steps=3))
    right = _scores(circuit(llama, task, method="eap-ig", steps=3, riemann="right"))
    assert max(abs(left[e] - right[e]) for e in left) > 1e-3
    with pytest.raises(headscope.HeadscopeError, match="Riemann rule"):
        circuit(llama, task, method="eap-ig", riemann="middle")


@pytest.mark.parametrize("model_kind, edges", [
    ("one layer", [("embed", "a0.h1.q"), ("embed", "a0.h4.k"), ("embed", "a0.h5.v"), ("a0.h2", "logits"),
                   ("embed", "m0")]),
    ("two layers", [("a0.h1", "a1.h3.k"), ("a0.h1", "a1.h4.k"), ("a0.h5", "a1.h0.v"), ("m0", "a1.h2.q"),
                    ("a0.h3", "m0"), ("a1.h5", "logits")]),
])
def test_one_edge_patched_equals_the_hand_written_forward(llama, model_kind, edges):
    model = _one_layer() if model_kind == "one layer" else llama
    task = random_task(seed=6)
    reference = LlamaReference(model)
    reference.check(task.clean)
    target = Target(model, task)
    graph = graph_of(target, task)
    names = [(graph.senders[u][0], name) for u, _, name in graph.edges()]
    patched = Patched(target, graph, task, batch_size=2)
    clean = patched.metric(np.ones(len(names), dtype=bool))
    moved = 0
    for edge in edges:
        kept = np.array([n != edge for n in names])
        expected = edge_patched_metric(reference, task, *edge)
        assert patched.metric(kept) == pytest.approx(expected, abs=2e-5), edge
        moved = max(moved, abs(expected - clean))
    assert moved > 1e-3  # the edges matter, so a wrong copy would show


def test_area_of_a_hand_made_curve():
    assert area([10, 50, 100], [0.2, 0.6, 1.0]) == pytest.approx(0.4 * 0.4 + 0.5 * 0.8)
    assert area([0.1, 100], [1.0, 1.0]) == pytest.approx(0.999)
    with pytest.raises(headscope.HeadscopeError, match="at least two sizes"):
        area([50], [0.5])


def test_sizes_run_to_100_and_need_two():
    assert check_sizes([10, 20]) == [10, 20, 100]
    assert check_sizes([50]) == [50, 100]
    assert check_sizes((0.1, 100, 1)) == [0.1, 1, 100]
    with pytest.raises(headscope.HeadscopeError, match="at least one size below 100"):
        check_sizes([100])


def test_cpr_ranks_by_signed_score_and_cmd_by_magnitude(llama):
    task = random_task(seed=3)
    found = circuit(llama, task, method="eap")
    scores = found.edges.score.to_numpy()
    table = found.evaluate(sizes=[2, 10, 50], n_random=1, batch_size=5)
    clean, empty = table.attrs["clean_metric"], table.attrs["corrupted_metric"]
    target = Target(llama, task)
    patched = Patched(target, graph_of(target, task), task, batch_size=5)
    for row in table.itertuples():
        for values, column in ((toward_clean(scores, clean, empty), "faithfulness"), (np.abs(scores), "faithfulness_abs")):
            kept = np.zeros(len(scores), dtype=bool)
            kept[np.argsort(-values, kind="stable")[:row.n_edges]] = True
            expected = (patched.metric(kept) - empty) / (clean - empty)
            assert getattr(row, column) == pytest.approx(expected, abs=1e-6)
    x = [2, 10, 50, 100]
    assert table.attrs["cpr"] == pytest.approx(area(x, table.faithfulness))
    assert table.attrs["cmd"] == pytest.approx(area(x, np.abs(1 - table.faithfulness_abs)))
    # the two rankings pick different edges here, so the two curves are different measurements
    assert not np.allclose(table.faithfulness, table.faithfulness_abs)


def test_toward_clean_follows_the_runs_order():
    scores = np.array([-2.0, 1.0, 0.5])
    assert list(toward_clean(scores, clean=3.0, corrupted=1.0)) == [2.0, -1.0, -0.5]
    assert list(toward_clean(scores, clean=0.0, corrupted=1.0)) == [-2.0, 1.0, 0.5]


def test_kl_is_refused_where_its_gradient_is_zero(llama):
    task = random_task(seed=4).with_metric("kl")
    for kwargs in (dict(method="eap"), dict(method="eap-ig", steps=1, riemann="right")):
        with pytest.raises(headscope.HeadscopeError, match="kl metric's gradient is exactly 0"):
            circuit(llama, task, **kwargs)
    for method in ("atp", "atp*"):
        with pytest.raises(headscope.HeadscopeError, match="kl metric's gradient is exactly 0"):
            headscope.attribute(llama, task, method=method, direction="noising")
    found = circuit(llama, task, method="eap-ig", steps=3)  # the left rule starts at the corrupted run
    assert float(found.edges.score.abs().max()) > 1e-3


def test_a_non_finite_model_is_named_as_such():
    model = scaled(tiny_model("llama"), 0.2)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(headscope.HeadscopeError, match="not finite"):
        circuit(model, random_task(seed=1), method="eap")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_run_and_agree_with_float32(llama, dtype):
    task = random_task(seed=2)
    exact = circuit(llama, task, method="eap-ig", steps=3).edges.score
    half = circuit(scaled(tiny_model("llama"), 0.2).to(dtype), task, method="eap-ig", steps=3).edges.score
    assert pd.Series(exact).corr(pd.Series(half), method="spearman") > 0.99


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_dla_and_atp_run_and_agree_with_float32(llama, dtype):
    task = random_task(seed=2)
    half = scaled(tiny_model("llama"), 0.2).to(dtype)
    for run in (lambda m: headscope.logit_attribution(m, task, n_resamples=10),
                lambda m: headscope.attribute(m, task, method="atp", n_resamples=10)):
        exact, rounded = run(llama).effect, run(half).effect
        assert pd.Series(exact).corr(pd.Series(rounded), method="spearman") > 0.99


def test_a_small_writer_beside_a_massive_stream_stays_a_writer_in_bfloat16():
    """A stream dimension hundreds of times the rest (SmolLM2's massive activations) widens
    bfloat16's tolerance past a small MLP's output; the decomposition still keeps the MLP (the
    set of writers that adds up most closely, not the first within tolerance)."""
    model = scaled(tiny_model("llama"), 0.2)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 400.0
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(0.3)
    task = random_task(seed=2)
    names = lambda m: [s[0] for s in graph_of(Target(m, task), task).senders]  # noqa: E731
    assert names(model.to(torch.bfloat16)) == names(model.float()) == ["embed", *[f"a0.h{h}" for h in range(6)],
                                                                       "m0", *[f"a1.h{h}" for h in range(6)], "m1"]


def test_scores_are_means_of_per_prompt_scores(llama):
    task = random_task(seed=5, n=6)
    found = circuit(llama, task, method="eap-ig", steps=2)
    assert found.prompt_scores.shape == (6, len(found.edges))
    np.testing.assert_allclose(found.prompt_scores.mean(0), found.edges.score, atol=1e-6)
    rows = [0, 2, 3, 5]  # a resample's circuit is the mean of its prompts' scores
    part = circuit(llama, task.subset(rows), method="eap-ig", steps=2)
    np.testing.assert_allclose(found.prompt_scores[rows].mean(0), part.edges.score, atol=1e-5)


def test_stability_on_planted_per_prompt_scores():
    rng = np.random.default_rng(0)
    signal = np.zeros(1000)
    signal[:10] = 5.0
    steady = signal + rng.normal(0, 0.01, (20, 1000))  # every prompt agrees on the top 1%
    table = stability(steady, sizes=(1,), n_boot=50)
    assert table.jaccard[0] == 1.0 and table.jaccard_lo[0] == 1.0 and table.n_edges[0] == 10
    noise = rng.normal(0, 1, (20, 1000))  # nothing to agree on
    table = stability(noise, sizes=(1, 5), n_boot=50)
    assert (table.jaccard < 0.3).all() and (table.jaccard_lo <= table.jaccard).all()
    with pytest.raises(headscope.HeadscopeError, match="at least 2 prompts"):
        stability(noise[:1])


def test_circuit_stability_is_kept_in_meta(llama, tmp_path):
    found = circuit(llama, random_task(seed=1), method="eap")
    table = found.stability(n_boot=20, sizes=(1, 5))
    assert list(table.columns) == ["size", "n_edges", "jaccard", "jaccard_lo", "jaccard_hi", "n_boot", "n_prompts"]
    assert found.meta["stability"][0]["n_edges"] == 2
    back = Circuit.load(found.save(tmp_path / "c"))
    assert back.meta["stability"] == found.meta["stability"]
    with pytest.raises(headscope.HeadscopeError, match="per-prompt scores"):
        back.stability()


def test_edge_names_map_both_ways():
    pairs = [(("embed", "a0.h1.q"), "input->a0.h1<q>"), (("a0.h3", "a1.h4.k"), "a0.h3->a1.h4<k>"),
             (("m0", "a1.h2.v"), "m0->a1.h2<v>"), (("a1.h0", "m1"), "a1.h0->m1"), (("m1", "logits"), "m1->logits"),
             (("embed", "logits"), "input->logits")]
    for ours, theirs in pairs:
        assert to_eap_name(*ours) == theirs and from_eap_name(theirs) == ours
    with pytest.raises(headscope.HeadscopeError, match="no node for 'c1'"):
        to_eap_name("c1", "logits")


def test_eap_json_round_trip(llama, tmp_path):
    task = random_task(seed=1)
    found = circuit(llama, task, method="eap-ig", steps=2)
    path = found.to_eap_json(tmp_path / "graph.json", in_graph=12)
    record = json.loads(path.read_text())
    assert record["cfg"] == {"n_layers": 2, "n_heads": 6, "parallel_attn_mlp": False, "d_model": 36}
    assert len(record["edges"]) == 198 and record["edges"]["input->a0.h1<q>"]["score"] == pytest.approx(
        -float(found.edges.score[(found.edges.src == "embed") & (found.edges.dst == "a0.h1.q")].iloc[0]))
    assert sum(e["in_graph"] for e in record["edges"].values()) == 12
    assert record["nodes"]["logits"]["in_graph"] and set(record["nodes"]) >= {"input", "a0.h0", "m1"}
    back = Circuit.from_eap_json(path, llama, task)
    pd.testing.assert_frame_equal(back.edges, found.edges, check_exact=False, rtol=1e-12)
    assert len(back.meta["in_graph"]) == 12
    again = back.to_eap_json(tmp_path / "again.json")
    assert json.loads(again.read_text())["edges"] == record["edges"]
    assert json.loads(again.read_text())["nodes"] == record["nodes"]


def test_eap_json_of_another_model_is_refused(llama, tmp_path):
    found = circuit(llama, random_task(seed=1), method="eap")
    path = found.to_eap_json(tmp_path / "graph.json")
    with pytest.raises(headscope.HeadscopeError, match="not a circuit of this model"):
        Circuit.from_eap_json(path, _one_layer(), random_task(seed=1))
    (tmp_path / "bad.json").write_text('{"cfg": {}, "nodes": {}}')
    with pytest.raises(headscope.HeadscopeError, match="cfg, nodes and edges"):
        Circuit.from_eap_json(tmp_path / "bad.json", llama)


def test_progress_counts_every_gradient_pass(llama):
    seen = []
    circuit(llama, random_task(seed=1), method="eap-ig", steps=3, batch_size=2, progress=lambda *a: seen.append(a))
    stage = "circuit (eap-ig: 3 gradients x 2 batches)"  # 5 prompts in batches of 2 and 3
    assert seen == [(stage, k, 6) for k in range(1, 7)]


def _gemma(family):
    import transformers as tf

    from tests.support.tiny import tiny_config

    torch.manual_seed(0)
    model = scaled(tf.AutoModelForCausalLM.from_config(tiny_config(family, "interface")).eval(), 0.2)
    with torch.no_grad():  # norm weights far from their init, so an unfolded scale would show
        for name, param in model.named_parameters():
            if param.dim() == 1 and "norm" in name:
                param.copy_(-1 + 2 * torch.rand(param.shape))
    return model


@pytest.mark.parametrize("family", ["gemma3_text", "gemma2"])
def test_heads_under_a_post_attention_norm_send_their_frozen_share(family):
    model = _gemma(family)
    task = random_task(seed=1)
    found = circuit(model, task, method="eap")
    with torch.no_grad():
        clean = float(task.score(model(**task.inputs("clean")).logits).mean())
        corrupted = float(task.score(model(**task.inputs("corrupted")).logits).mean())
    table = found.evaluate(sizes=[10], n_random=0, batch_size=5)
    assert table.attrs["clean_metric"] == pytest.approx(clean, abs=1e-5)  # every edge kept: the model
    assert table.attrs["corrupted_metric"] == pytest.approx(corrupted, abs=1e-5)  # the shares add up exactly
    scale = float(found.edges.score.abs().max())
    for src, dst in [("a0.h1", "a1.h2.k"), ("a0.h3", "logits"), ("a1.h0", "logits"), ("embed", "a1.h1.q")]:
        score = float(found.edges[(found.edges.src == src) & (found.edges.dst == dst)].score.iloc[0])
        eps = 1e-2
        derivative = (one_edge_nudged(model, task, src, dst, eps) - one_edge_nudged(model, task, src, dst, -eps)) / (2 * eps)
        assert score * task.n == pytest.approx(derivative, abs=1e-3 * scale * task.n), (src, dst)


def test_a_heads_summed_outgoing_eap_is_its_noising_atp(llama):
    """Sum_v score(u -> v) = delta a_u . dM/d(stream) = delta z_u . dM/dz_u: the same linearisation
    as noising AtP at z (corrupted minus clean, gradient on the clean run)."""
    task = random_task(seed=1)
    found = circuit(llama, task, method="eap")
    summed = found.edges.groupby("src").score.sum()
    atp = headscope.attribute(llama, task, method="atp", point="z", direction="noising")
    gap = atp.attrs["corrupted_metric"] - atp.attrs["clean_metric"]  # means over the prompts
    scale = float(summed.abs().max())
    for row in atp.itertuples():
        assert summed[f"a{row.layer}.h{row.head}"] == pytest.approx(row.effect * gap, abs=1e-5 * scale)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma2"])
def test_under_a_post_norm_a_heads_summed_outgoing_eap_is_its_frozen_shares_linearisation(family):
    """Gemma 2/3: the head sends g * (z_h W_O,h) / s, s the post-attention norm's per-row scale
    in each run; its summed outgoing score is delta share . dM/d(norm output), taken here by hand
    from z, W_O and the norm's input, with autograd's gradient on the clean run."""
    model = _gemma(family)
    task = random_task(seed=1)
    found = circuit(model, task, method="eap")
    summed = found.edges.groupby("src").score.sum()
    n_heads, head_dim = model.config.num_attention_heads, model.config.head_dim

    def run(which, grad):
        kept = {}
        handles = []
        for i, layer in enumerate(model.model.layers):
            handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
                lambda m, args, i=i: kept.__setitem__(("z", i), args[0].detach())))

            def post(module, args, output, i=i):
                kept[("x", i)] = args[0].detach()
                if grad:
                    output.retain_grad()
                kept[("y", i)] = output
            handles.append(layer.post_attention_layernorm.register_forward_hook(post))
        try:
            with torch.set_grad_enabled(grad):
                logits = model(**task.inputs(which)).logits
                if grad:
                    task.score(logits).sum().backward()
        finally:
            for handle in handles:
                handle.remove()
        return kept

    def shares(kept, i):
        layer = model.model.layers[i]
        x, z = kept[("x", i)].double(), kept[("z", i)].double()
        norm = layer.post_attention_layernorm
        gain_over_s = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * (1 + norm.weight.double())
        W_O = layer.self_attn.o_proj.weight.double()
        return [(z[..., h * head_dim:(h + 1) * head_dim] @ W_O[:, h * head_dim:(h + 1) * head_dim].T) * gain_over_s
                for h in range(n_heads)]

    clean, corrupted = run("clean", True), run("corrupted", False)
    scale = float(summed.abs().max())
    for i in range(len(model.model.layers)):
        grad = clean[("y", i)].grad.double()
        for h, (a, b) in enumerate(zip(shares(clean, i), shares(corrupted, i))):
            expected = float(((b - a) * grad).sum()) / task.n
            assert summed[f"a{i}.h{h}"] == pytest.approx(expected, abs=1e-4 * scale), (i, h)


def test_a_long_run_is_estimated_after_its_first_pass(llama, monkeypatch):
    """The first forward/backward pair is timed: the whole run estimated over an hour is warned
    about and over a day refused, naming the estimate (a clock that ticks 200 s per reading)."""
    import itertools

    from headscope.circuits import eap
    from headscope.errors import HeadscopeWarning

    ticks = itertools.count(0, 200.0)
    monkeypatch.setattr(eap.time, "monotonic", lambda: next(ticks))
    task = random_task(seed=1)  # 5 prompts in batches of 2 and 3
    with pytest.warns(HeadscopeWarning, match=r"20 forward/backward passes at about 200 s each: about 1\.1 hours"):
        circuit(llama, task, method="eap-ig", steps=10, batch_size=2)
    with pytest.raises(headscope.HeadscopeError, match=r"about 55\.6 hours on this machine; use fewer steps"):
        circuit(llama, task, method="eap-ig", steps=500, batch_size=2)
    eap.check_estimate(1.0, 3600)  # exactly an hour: neither


def test_an_evaluation_with_several_circuits_a_pass_equals_one_a_pass(llama):
    """`evaluate` runs as many circuits a pass as `batch_size` holds copies of the prompts: the
    tables (the method's curves, the random draws, CPR and CMD) are those of a circuit a pass."""
    task = random_task(seed=1)
    found = circuit(llama, task, method="eap")
    one = found.evaluate(sizes=[1, 10, 50], n_random=2, batch_size=task.n)
    one_random = found.random
    many = found.evaluate(sizes=[1, 10, 50], n_random=2, batch_size=4 * task.n)
    many_random = found.random
    for column in ("faithfulness", "metric", "faithfulness_abs", "metric_abs", "random_mean"):
        assert many[column].to_numpy() == pytest.approx(one[column].to_numpy(), rel=1e-5, abs=1e-6)
    assert many_random.faithfulness.to_numpy() == pytest.approx(one_random.faithfulness.to_numpy(), rel=1e-5, abs=1e-6)
    assert (many_random[["draw", "size", "n_edges"]] == one_random[["draw", "size", "n_edges"]]).all().all()
    for key in ("cpr", "cmd", "random_cpr", "random_cmd"):
        assert many.attrs[key] == pytest.approx(one.attrs[key], rel=1e-5, abs=1e-6)


def test_an_evaluation_counts_its_runs_and_is_estimated_after_the_empty_circuit(llama, monkeypatch):
    """Progress moves a patched run at a time up to every run, or a pass at a time where a pass
    runs several circuits; an evaluation estimated over a day from the empty circuit's run is
    refused before the other runs."""
    import itertools

    from headscope.circuits import faithfulness

    task = random_task(seed=1)
    found = circuit(llama, task, method="eap")
    # 1%, 50% and the 100% always added: 2 + 3 x (2 rankings + 2 random) runs
    for batch_size, steps in ((task.n, list(range(2, 15))), (3 * task.n, [2, 5, 8, 11, 12, 13, 14])):  # 1 or 3 a pass
        # (at 100% every circuit is the full one: measured once, counted as each comes)
        seen = []
        found.evaluate(sizes=[1, 50], n_random=2, batch_size=batch_size,
                       progress=lambda stage, done, total: seen.append((stage, done, total)))
        assert [done for _, done, _ in seen] == steps and {total for *_, total in seen} == {14}
    ticks = itertools.count(0, 20000.0)
    monkeypatch.setattr(faithfulness.time, "monotonic", lambda: next(ticks))
    runs = []
    real = faithfulness.Patched.metric
    monkeypatch.setattr(faithfulness.Patched, "metric", lambda self, kept: runs.append(1) or real(self, kept))
    with pytest.raises(headscope.HeadscopeError, match=r"this evaluation would take 12 patched runs at about 2e\+04 s "
                                                       r"each: about 66\.7 hours .* fewer sizes, random circuits"):
        found.evaluate(sizes=[1, 50], n_random=2)
    assert len(runs) == 2  # the clean and empty circuits only
