"""Multi-head latent attention families (DeepSeek-V2/V3, MiniCPM3, GLM-4-MoE-Lite, Youtu) beyond the
family matrix: verify against the model's eager attention with weights large enough for every part
to matter, each layout (rope_interleave on and off, a full-rank query, biases); the OV table against
an OV circuit built here straight from the checkpoint's matrices; analyze end to end; DeepSeek-V3.2's
sparse attention captured as its indexer selects, and verified with the indexer's own selection; hy_v4's
sink logits and sigmoid output gate, each needed by verify."""
import pytest
import torch
from transformers import AutoModelForCausalLM

import headscope
from headscope.attention.kernel import with_selected_keys
from headscope.hf import route
from headscope.hf.adapters import Latent, Rotary, attention_blocks
from headscope.head_geometry.ov_circuit import ov_copying, ov_scores
from headscope.loading.loader import Loaded
from headscope.probes.kinds import RepeatedProbe, TextProbe
from headscope.report import render_html
from tests.support.contracts import eager_weights, with_adapter_changed
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_config, tiny_inputs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _model(family, seed=0, **extra):
    """The family's tiny interface config (tests/support/tiny.py) with `extra` set, and weights large
    enough (init std 0.3) that a wrong rotary pairing or a skipped norm moves the outputs by ~1."""
    config = tiny_config(family, kind="interface")
    for name, value in dict(initializer_range=0.3, **extra).items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("family, extra", [
    ("deepseek_v3", {}), ("deepseek_v3", dict(rope_interleave=False)), ("deepseek_v3", dict(q_lora_rank=None)),
    ("deepseek_v3", dict(attention_bias=True)), ("deepseek_v2", {}), ("minicpm3", {}), ("glm4_moe_lite", {}),
    ("youtu", dict(rope_interleave=True)), ("deepseek_v32", {}), ("glm_moe_dsa", {}), ("hy_v4", {}),
], ids=["v3", "v3-halves", "v3-full-rank-q", "v3-biases", "v2-complex", "minicpm3", "glm4-moe-lite", "youtu",
        "v32-sparse", "glm5-sparse-shared", "hy-v4-sparse-shared-sinks-gate"])
@torch.no_grad()
def test_verify_agrees_at_every_layout(family, extra):
    model = _model(family, **extra)
    x = tiny_inputs(length=13)
    reference = model(**x).logits
    table = headscope.verify(model, x)
    assert list(table.layer) == [0, 1]
    assert table.max_abs_diff_output.max() <= 1e-5  # outputs reach ~10 with these weights
    assert table.max_abs_diff_pattern.max() <= 1e-5
    assert torch.equal(model(**x).logits, reference)  # verify left the model as it was
    module = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config)
    cfg = model.config
    assert (module.config.d_head, module.config.d_value, module.config.rotary_dim) == (
        cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.qk_rope_head_dim)


def _ov_by_hand(model, layer, head):
    """W_V `[d_model, d_value]` and W_O `[d_value, d_model]` of one head, from the checkpoint's own
    matrices: W_V = (W_UV,h diag(g) W_DKV)^T, the latent norm's gain g, its per-token scale left out."""
    attn = model.model.layers[layer].self_attn
    nope, dv, rank = attn.qk_nope_head_dim, attn.v_head_dim, attn.kv_lora_rank
    up = attn.kv_b_proj.weight.view(attn.num_heads, nope + dv, rank)[head, nope:]  # (dv, rank)
    down = attn.kv_a_proj_with_mqa.weight[:rank]  # (rank, d_model)
    w_v = (up @ (attn.kv_a_layernorm.weight[:, None] * down)).T
    w_o = attn.o_proj.weight[:, head * dv:(head + 1) * dv].T
    return w_v.float(), w_o.float()


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
@torch.no_grad()
def test_ov_table_is_the_circuit_of_the_checkpoints_matrices(family):
    model = _model(family)
    with torch.no_grad():  # a gain away from 1, so forgetting it changes the circuit
        for layer in model.model.layers:
            layer.self_attn.kv_a_layernorm.weight.uniform_(0.5, 1.5)
    loaded = Loaded.from_model(model, char_tokenizer(), f"tiny-{family}")
    table = ov_copying(loaded)
    assert len(table) == 2 * 4
    W_E = model.get_input_embeddings().weight.float()
    W_U = model.get_output_embeddings().weight.float().T
    for row in table.itertuples():
        top1, share = ov_scores(W_E, *_ov_by_hand(model, row.layer, row.head), W_U)
        assert row.copy_top1 == pytest.approx(top1, abs=1e-9)
        assert row.positive_eig_share == pytest.approx(share, abs=1e-5)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v32"])
def test_analyze_runs_end_to_end_with_the_ov_table_and_renders(family):
    model = _model(family)
    loaded = Loaded.from_model(model, char_tokenizer(), f"tiny-{family}")
    probes = [TextProbe(n_examples=4, seq_len=32), RepeatedProbe(n_examples=4, repeat_len=8, repeats=3)]
    analysis = headscope.analyze(loaded, detectors=["previous_token", "induction", "sink"], probes=probes,
                                 explorer_examples=1)
    assert len(analysis.scores) == 3 * 2 * 4 and analysis.scores.score.notna().all()
    assert "ov" in analysis.tables and len(analysis.tables["ov"]) == 2 * 4
    assert f"tiny-{family}" in render_html(analysis, plotlyjs="cdn")


@pytest.mark.parametrize("family, change", [("deepseek_v3", dict(latent=Latent())),  # rope_interleave ignored
                                            ("deepseek_v32", dict(latent=Latent())),  # its pairs not regrouped
                                            ("deepseek_v2", dict(rotary=Rotary(interleaved=False, tables="complex"))),
                                            ("minicpm3", dict(rotary=None))])
@torch.no_grad()
def test_each_rotary_reading_matters(family, change, monkeypatch):
    """Not regrouping DeepSeek-V3's interleaved pairs, rotating DeepSeek-V2's pairs as halves, or no
    rotary at all moves verify's patterns far past its tolerance."""
    model = _model(family)
    with_adapter_changed(monkeypatch, model, **change)
    assert headscope.verify(model, tiny_inputs(length=13)).max_abs_diff_pattern.max() > 1e-3


@torch.no_grad()
def test_deepseek_v32s_patterns_keep_only_the_keys_its_indexer_picks(monkeypatch):
    """DeepSeek-V3.2 hands headscope's kernel each query's top-k keys (`indices`; index_topk 4 of
    up to 13 here) instead of folding them into the mask: the captured patterns equal the model's
    eager (folded) weights, attend only to keys the layer's own indexer returned, and the kernel
    dropping the selection would change the model's output by far."""
    model = _model("deepseek_v32")
    x = tiny_inputs(length=13)
    valid = x["attention_mask"].bool()
    cores = dict(attention_blocks(model))
    picked, handles = {}, []
    for layer, block in cores.items():
        handles.append(block.indexer.register_forward_hook(lambda m, a, out, layer=layer: picked.setdefault(layer, out)))
    before = model(**x).logits
    with headscope.capture(model) as cap:
        captured = model(**x).logits
    for handle in handles:
        handle.remove()
    assert (before - captured).abs()[valid].max() <= 1e-4
    eager = eager_weights(model, cores, x)
    for layer in cores:
        mine = cap.patterns[layer]  # (B, H, T, T)
        assert (mine - eager[layer]).abs().max() <= 1e-5
        chosen = torch.zeros(mine.shape[0], 13, 13, dtype=torch.bool).scatter(-1, picked[layer].long(), True)
        assert not (mine > 0)[~chosen[:, None].expand_as(mine)].any()  # nothing outside the selection
        rows = (mine[0] > 0).sum(-1)  # (H, T): the first example has no padding
        assert rows.max() == 4 and (rows[:, 4:] == 4).all()  # sparse once more than 4 keys are visible
    monkeypatch.setattr(route, "with_selected_keys", lambda mask, indices, n_keys, causal: mask)
    with headscope.capture(model):
        dense = model(**x).logits
    assert (before - dense).abs()[valid].max() > 1e-2


@pytest.mark.parametrize("family, without", [("deepseek_v32", dict(selector=None)),
                                             ("glm_moe_dsa", dict(returns=("output", "weights"))),
                                             ("hy_v4", dict(returns=("output", "weights")))])
@torch.no_grad()
def test_sparse_attentions_verify_needs_the_indexers_selection(family, without, monkeypatch):
    """verify hands from_hf's module (dense latent attention, no indexer) the keys the model's own
    indexer picked (DeepSeek-V3.2: read from the indexer; GLM-5 and hy_v4: returned by each layer, its
    layer 1 reusing layer 0's picks); without them the module attends to every earlier key and fails by far,
    in every layer."""
    model = _model(family)
    x = tiny_inputs(length=13)
    table = headscope.verify(model, x)
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    with_adapter_changed(monkeypatch, model, **without)
    assert (headscope.verify(model, x).max_abs_diff_pattern > 1e-2).all()


@pytest.mark.parametrize("given", ["none-causal", "none-bidirectional", "boolean", "additive"])
def test_selected_keys_join_any_mask_as_written_out(given):
    """`with_selected_keys` against the mask built by hand, key by key: a key is kept where the
    given mask keeps it (a causal one: not later than the query, aligned to the end) and the query
    selected it."""
    g = torch.Generator().manual_seed(0)
    B, Tq, Tk, k = 2, 5, 7, 3
    indices = torch.stack([torch.stack([torch.randperm(Tk, generator=g)[:k] for _ in range(Tq)]) for _ in range(B)])
    keep = torch.rand(B, 1, Tq, Tk, generator=g) > 0.3
    mask = {"none-causal": None, "none-bidirectional": None, "boolean": keep,
            "additive": torch.zeros(B, 1, Tq, Tk).masked_fill(~keep, float("-inf"))}[given]
    got = with_selected_keys(mask, indices.int(), Tk, causal=given == "none-causal")
    for b in range(B):
        for q in range(Tq):
            for key in range(Tk):
                allowed = {"none-causal": key <= q + Tk - Tq, "none-bidirectional": True}.get(given, keep[b, 0, q, key])
                expected = bool(allowed) and key in indices[b, q].tolist()
                value = got[b, 0, q, key]
                assert (bool(value) if got.dtype == torch.bool else bool(value > -1e30)) == expected
    assert with_selected_keys(mask, None, Tk, causal=False) is mask


def _hy_v4(seed=0):
    """hy_v4 with sink logits that differ by head (its init gives every head learnable_sink_init)."""
    model = _model("hy_v4", seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=generator))
    return model


@torch.no_grad()
def test_hy_v4s_sinks_and_output_gate_are_copied_and_verify():
    model = _hy_v4()
    table = headscope.verify(model, tiny_inputs(length=13))
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    block = attention_blocks(model)[0][1]
    mine = headscope.MultiHeadAttention.from_hf(block, model.config)
    assert mine.config.sinks and mine.config.output_gate and mine.latent is not None
    assert torch.equal(mine.sinks, block.sinks) and torch.equal(mine.W_gate.weight, block.gate_proj.weight)


@pytest.mark.parametrize("change, diff", [(dict(sinks=None), 1), (dict(latent=Latent()), 0)],
                         ids=["no-sinks", "no-gate"])
@torch.no_grad()
def test_hy_v4s_sinks_and_gate_each_matter(change, diff, monkeypatch):
    """Without its sink logits from_hf's module attends with other patterns, without its gate's
    projection (a latent read without `gate`) it outputs z ungated: each far past verify's tolerances."""
    model = _hy_v4()
    with_adapter_changed(monkeypatch, model, **change)
    table = headscope.verify(model, tiny_inputs(length=13))
    assert (table.max_abs_diff_output if diff == 0 else table.max_abs_diff_pattern).min() > 1e-2
