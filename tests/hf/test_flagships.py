"""Recent flagship families beyond the family matrix (tests/support/tiny.py): weights large enough
for each part of their attention to matter, verify against the model's eager attention at the
matrix's tolerances, and a mutation per feature: the adapter read without it fails verify by far."""
import pytest
import torch
from transformers import AutoModelForCausalLM

import headscope
from headscope.hf import adapters
from headscope.hf.adapters import attention_blocks
from headscope.hf.layouts import FusedGroups, FusedPerHead, FusedRows
from tests.support.contracts import with_adapter_changed
from tests.support.tiny import COMMON, EXTRA, HYBRID_ATTENTION, tiny_config, tiny_inputs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _model(family, kind, seed=0, init=0.3, **extra):
    """The family's tiny config of `kind` with `extra` set and weights of std `init`; norm weights
    drawn off their init (1, or 0 where the norm multiplies by 1 + weight) so a skipped norm shows."""
    config = tiny_config(family, kind=kind)
    for name, value in dict(initializer_range=init, **extra).items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.add_(torch.randn(param.shape, generator=generator) * 0.5)
    return model


def _verified(model, x=None):
    table = headscope.verify(model, tiny_inputs() if x is None else x)
    return table.max_abs_diff_output.max(), table.max_abs_diff_pattern.max()


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text"])
@torch.no_grad()
def test_qwen3_5s_gated_attention_verifies_and_needs_its_gate(family, monkeypatch):
    model = _model(family, "hybrid")
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert mine.output_gate and mine.qk_norm and mine.rotary_dim == 4  # head_dim 16 * partial_rotary_factor 0.25
    with_adapter_changed(monkeypatch, model, output_gate=False)
    assert _verified(model)[0] > 1e-2  # the same pattern, an output without the gate far off


@torch.no_grad()
def test_kimi_linears_latent_attention_verifies_with_its_shared_key_unrotated(monkeypatch):
    """Multi-head latent attention without rotary: from_hf gives rotary_dim 0, the shared key part
    joins every head's key unrotated; rotating it (a rotary read into the adapter) fails verify."""
    model = _model("kimi_linear", "hybrid")
    x = tiny_inputs(length=13)
    output, pattern = _verified(model, x)
    assert output <= 1e-5 and pattern <= 1e-5
    assert [l for l, _ in attention_blocks(model)] == list(HYBRID_ATTENTION["kimi_linear"])
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert (mine.d_head, mine.d_value, mine.rotary_dim, mine.latent.d_rope) == (24, 12, 0, 8)
    with_adapter_changed(monkeypatch, model, rotary=adapters.Rotary())
    assert _verified(model, x)[1] > 1e-3


@torch.no_grad()
def test_olmoes_clip_comes_after_its_qk_norm(monkeypatch):
    """OLMoE clamps q, k, v after its q/k RMSNorm (values near 1 there, the clip 0.5 cuts them):
    clamping before the norms instead, as OLMo does, fails verify."""
    model = _model("olmoe", "interface", init=0.02)
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    assert headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config.clip_after_norm
    with_adapter_changed(monkeypatch, model, clip_after_norm=False)
    assert _verified(model)[1] > 1e-2


@pytest.mark.parametrize("change, layer", [(dict(temperature=None), 1), (dict(qk_norm=None), 0)],
                         ids=["no-temperature", "no-l2-norm"])
@torch.no_grad()
def test_llama4s_temperature_and_l2_norm_matter(change, layer, monkeypatch):
    """Layer 0 (rotary, chunked) has the L2 norm of q and k after rotary, taken before it; layer 1
    (NoPE) the query temperature, which grows past position 3 with floor_scale 4. Dropping either
    fails verify at its layer, and only there."""
    model = _model("llama4_text", "interface")
    table = headscope.verify(model, tiny_inputs())
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    mine = [headscope.MultiHeadAttention.from_hf(block, model.config).config for _, block in attention_blocks(model)]
    assert [(c.rotary_dim, c.qk_norm, c.query_temperature) for c in mine] == [(16, True, None), (0, False, (4.0, 0.5, 1.0))]
    with_adapter_changed(monkeypatch, model, **change)
    wrong = headscope.verify(model, tiny_inputs()).max_abs_diff_pattern
    assert wrong[layer] > 1e-2 and wrong[1 - layer] <= 1e-5


@pytest.mark.parametrize("change", [dict(temperature=None),
                                    dict(temperature=adapters.Temperature("original_max_position_embeddings",
                                                                          "llama_4_scaling_beta", nope_only=False,
                                                                          in_rope_parameters=True))],
                         ids=["no-scale", "llama4s-offset"])
@torch.no_grad()
def test_ministral3s_query_scale_verifies_and_needs_its_own_formula(change, monkeypatch):
    """Ministral 3 scales the query at position t by 1 + beta * log(1 + floor(t / M)) in every
    layer (M = original_max_position_embeddings 4, beta 0.5 in the tiny config): verify agrees;
    without the scale, or with Llama 4's (t + 1), it fails by far."""
    model = _model("ministral3", "interface")
    x = tiny_inputs(length=13)
    output, pattern = _verified(model, x)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = [headscope.MultiHeadAttention.from_hf(block, model.config).config for _, block in attention_blocks(model)]
    assert [c.query_temperature for c in mine] == [(4.0, 0.5, 0.0)] * 2 and all(c.rotary_dim == 16 for c in mine)
    with_adapter_changed(monkeypatch, model, **change)
    assert _verified(model, x)[1] > 1e-2


@pytest.mark.parametrize("family", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
@torch.no_grad()
def test_hunyuans_qk_norm_after_rotary_verifies_and_must_come_after_it(family, monkeypatch):
    """HunYuan's per-head q/k RMSNorm, gains drawn in [0.5, 1.5], comes after rotary: from_hf's
    module norms there too and verifies; the same norms taken before rotary fail verify."""
    model = _model(family, "interface")
    generator = torch.Generator().manual_seed(5)
    for _, block in attention_blocks(model):
        for norm in (block.query_layernorm, block.key_layernorm):
            norm.weight.copy_(torch.rand(norm.weight.shape, generator=generator) + 0.5)
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert mine.qk_norm and mine.qk_norm_after_rotary and mine.rotary_dim == 16
    with_adapter_changed(monkeypatch, model, qk_norm=adapters.QKNorm("query_layernorm", "key_layernorm"))
    assert _verified(model)[1] > 1e-3


@torch.no_grad()
def test_llama4s_l2_norm_after_rotary_with_a_gain_verifies():
    """Llama 4's norm is gainless; given a gain, taking it before rotary would no longer be the same,
    and from_hf's module, which norms after rotary as the model does, still verifies."""
    model = _model("llama4_text", "interface")
    block = attention_blocks(model)[0][1]
    block.qk_norm.weight = torch.nn.Parameter(torch.rand(16, generator=torch.Generator().manual_seed(3)) + 0.5)
    assert headscope.MultiHeadAttention.from_hf(block, model.config).config.qk_norm_after_rotary
    table = headscope.verify(model, tiny_inputs())
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5


@pytest.mark.parametrize("family", ["gemma4_text", "gemma3n_text"])
@torch.no_grad()
def test_the_gainless_value_norm_matters(family, monkeypatch):
    model = _model(family, "interface")
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = [headscope.MultiHeadAttention.from_hf(block, model.config).config for _, block in attention_blocks(model)]
    assert all(c.v_norm and c.qk_norm and c.scale == 1.0 for c in mine)
    with_adapter_changed(monkeypatch, model, v_norm=None)
    assert _verified(model)[0] > 1e-2


@torch.no_grad()
def test_gemma4s_full_attention_layer_has_its_own_sizes_and_its_keys_as_values():
    """Layer 1 (full attention) has heads of 24 and one key/value head whose values are the key
    projection's output (attention_k_eq_v); its proportional rotary tables are as wide as its heads."""
    model = _model("gemma4_text", "interface")
    (_, sliding), (_, full) = attention_blocks(model)
    assert full.v_proj is None
    mine = [headscope.MultiHeadAttention.from_hf(block, model.config) for block in (sliding, full)]
    assert [(m.config.d_head, m.config.n_kv_heads, m.config.rotary_dim) for m in mine] == [(16, 2, 16), (24, 1, 24)]
    assert torch.equal(mine[1].W_v.weight, full.k_proj.weight)


@torch.no_grad()
def test_gemma4s_layers_reusing_keys_and_values_are_refused_and_still_captured():
    """With num_kv_shared_layers, the last layers attend with the keys and values an earlier layer
    computed from its own input: from_hf refuses them (and so verify) in one line; capture works."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("gemma4_text", **{**COMMON, **EXTRA["gemma4_text"], "num_hidden_layers": 4,
                                                     "num_kv_shared_layers": 2,
                                                     "layer_types": ["sliding_attention", "full_attention"] * 2})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    blocks = attention_blocks(model)
    assert [block.is_kv_shared_layer for _, block in blocks] == [False, False, True, True]
    headscope.MultiHeadAttention.from_hf(blocks[1][1], model.config)
    for call in (lambda: headscope.MultiHeadAttention.from_hf(blocks[2][1], model.config),
                 lambda: headscope.verify(model, tiny_inputs())):
        with pytest.raises(headscope.HeadscopeError, match="reuses the keys and values") as err:
            call()
        assert "\n" not in str(err.value)
    x = tiny_inputs()
    before = model(**x).logits
    with headscope.capture(model) as cap:
        assert (model(**x).logits - before).abs().max() <= 1e-4
    assert sorted(cap.patterns) == [0, 1, 2, 3]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@torch.no_grad()
def test_qwen3_5s_text_decoder_verifies_with_an_image(family):
    """Qwen3.5 as its vision-language model, one image per example: the image tokens take their own
    positions on the three rotary axes (the model joins them into one table per position), and
    verify of the text decoder's attention layers (1 and 2) agrees there; capture leaves the logits."""
    from tests.support.tiny import tiny_image_inputs, tiny_model

    model = tiny_model(family, kind="composite")
    x = tiny_image_inputs(family)  # with mm_token_type_ids, what its processor marks: the image tokens
    logits = model(**x).logits
    assert (logits - model(**tiny_inputs()).logits).abs().max() > 1e-2  # the image reaches the text
    with headscope.capture(model) as cap:
        assert (model(**x).logits - logits).abs().max() <= 1e-4
    assert sorted(cap.patterns) == [1, 2]
    table = headscope.verify(model, x)
    assert tuple(table.layer) == (1, 2)
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5


@pytest.mark.parametrize("multi_query", [True, False], ids=["mqa", "mha"])
@torch.no_grad()
def test_gpt_bigcodes_c_attn_is_read_by_its_multi_query_switch(multi_query, monkeypatch):
    """GPT-BigCode's c_attn is `[q | k | v]` with one key/value head under multi_query, grouped per
    head otherwise: each verifies, and reading the per-head one as `[q | k | v]` fails verify by far."""
    model = _model("gpt_bigcode", "interface", multi_query=multi_query)
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    assert headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config.n_kv_heads == (
        1 if multi_query else 4)
    if not multi_query:  # per-head groups read as [q | k | v]
        with_adapter_changed(monkeypatch, model, qkv=FusedRows("c_attn"))
        assert _verified(model)[1] > 1e-2


@pytest.mark.parametrize("change, diff", [(dict(output_gate=False), 0), (dict(rotary=adapters.Rotary()), 1)],
                         ids=["no-gate", "rotary-everywhere"])
@torch.no_grad()
def test_afmoes_gate_and_nope_layers_matter(change, diff, monkeypatch):
    """AFMoE's sigmoid output gate (its own gate_proj) and its NoPE full-attention layer: verify agrees;
    without the gate the output, rotating layer 1 the pattern, are far off."""
    model = _model("afmoe", "interface")
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = [headscope.MultiHeadAttention.from_hf(b, model.config).config for _, b in attention_blocks(model)]
    assert [(c.output_gate, c.rotary_dim) for c in mine] == [(True, 16), (True, 0)]
    with_adapter_changed(monkeypatch, model, **change)
    assert _verified(model)[diff] > 1e-2


@torch.no_grad()
def test_dbrxs_clip_from_its_attn_config_matters(monkeypatch):
    """DBRX keeps clip_qkv in its nested attn_config (read from the core): with weights of std 0.3
    the clamp at 0.5 cuts q, k and v; verify agrees, and dropping the clamp fails it by far."""
    model = _model("dbrx", "interface")
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert (mine.clip, mine.n_kv_heads) == (0.5, 2)
    with_adapter_changed(monkeypatch, model, clip=None)
    assert _verified(model)[1] > 1e-2


@torch.no_grad()
def test_mimo_v2_flashs_narrow_scaled_values_sinks_and_rotary_per_layer_type_verify():
    """MiMo-V2-Flash: values of 12 beside q/k heads of 16, scaled by attention_value_scale (0.6 here,
    folded into W_V); its sliding layer with twice the key/value heads, sink logits and 6 rotary dims
    (int(16 * 0.334) rounded up to a pair), its full-attention layer 8 (factor 0.5) and no sinks."""
    model = _model("mimo_v2_flash", "interface")
    output, pattern = _verified(model, tiny_inputs(length=13))
    assert output <= 1e-4 and pattern <= 1e-5
    sliding, full = (headscope.MultiHeadAttention.from_hf(b, model.config).config for _, b in attention_blocks(model))
    assert (sliding.n_kv_heads, sliding.rotary_dim, sliding.sinks, sliding.d_value) == (4, 6, True, 12)
    assert (full.n_kv_heads, full.rotary_dim, full.sinks, full.d_value) == (2, 8, False, 12)
    block = attention_blocks(model)[0][1]
    mine = headscope.MultiHeadAttention.from_hf(block, model.config)
    assert torch.equal(mine.W_v.weight, block.v_proj.weight * 0.6)


@pytest.mark.parametrize("change, diff", [(dict(value_scale=None), 0), (dict(sinks=None), 1)],
                         ids=["no-value-scale", "no-sinks"])
@torch.no_grad()
def test_mimo_v2_flashs_value_scale_and_sinks_matter(change, diff, monkeypatch):
    """Leaving out the value scale moves the output (the pattern stays), leaving out the sinks the
    pattern, by far past verify's tolerances."""
    model = _model("mimo_v2_flash", "interface")
    with_adapter_changed(monkeypatch, model, **change)
    assert _verified(model, tiny_inputs(length=13))[diff] > 1e-2


@pytest.mark.parametrize("change, error, match", [
    (dict(rotary=adapters.Rotary()), ValueError, "rotary tables have 6 dims, module rotates 16"),
    (dict(value_size=None), RuntimeError, "size"),
    (dict(sizes_per_layer=False), RuntimeError, "size"),
], ids=["rotary-not-by-layer-type", "values-as-wide-as-keys", "sizes-from-the-config"])
@torch.no_grad()
def test_mimo_v2_flashs_sizes_read_otherwise_do_not_fit(change, error, match, monkeypatch):
    """Reading the partial rotary factor from the top of rope_parameters (none there: every dim
    rotated), the values as wide as the keys, or the key/value heads from the config (the sliding
    layer has twice as many) gives a module the model's tables or weights do not fit: refused."""
    model = _model("mimo_v2_flash", "interface")
    with_adapter_changed(monkeypatch, model, **change)
    with pytest.raises(error, match=match):
        headscope.verify(model, tiny_inputs(length=13))


def _granite_swa(family):
    """granite_swa or granitemoe_swa with std-0.3 weights and sink logits that differ by head (its init zeroes them)."""
    model = _model(family, "interface")
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=generator))
    return model


@pytest.mark.parametrize("family", ["granite_swa", "granitemoe_swa"])
@torch.no_grad()
def test_granite_swas_sinks_and_nope_layer_verify(family):
    """Its sliding layer 0 rotates with its own base (layer_rope_theta 1000: from_hf's module alone, on
    its own tables, attends as on the model's), its layer 1 has no rotary; both hold the sink logits."""
    model = _granite_swa(family)
    x = tiny_inputs(length=13)
    output, pattern = _verified(model, x)
    assert output <= 1e-4 and pattern <= 1e-5
    (_, sliding), (_, full) = attention_blocks(model)
    mine = [headscope.MultiHeadAttention.from_hf(b, model.config) for b in (sliding, full)]
    assert [(m.config.rotary_dim, m.config.rotary_base, m.config.sinks) for m in mine] == [(16, 1000.0, True),
                                                                                         (0, 10000.0, True)]
    h = torch.randn(2, 13, 64)
    cos, sin = model.model.rotary_embs[0](h, torch.arange(13)[None])
    alone, given = mine[0](h, return_pattern=True)[1], mine[0](h, rotary=(cos, sin), return_pattern=True)[1]
    assert (alone - given).abs().max() <= 1e-5


@pytest.mark.parametrize("change, diff", [(dict(sinks=None), "output"), (dict(weights_before_sinks=False), "pattern"),
                                          (dict(rotary=adapters.Rotary()), "pattern")],
                         ids=["no-sinks", "eager-weights-as-they-are", "rotary-in-the-nope-layer"])
@pytest.mark.parametrize("family", ["granite_swa", "granitemoe_swa"])
@torch.no_grad()
def test_granite_swas_sinks_weights_and_nope_layer_each_matter(family, change, diff, monkeypatch):
    """Without the sink logits from_hf's module outputs far off (its pattern is compared with the
    eager weights times its own key share, so the sink shows in the output alone); comparing with
    the eager weights as they are (without the sink) puts the pattern far off; rotating the NoPE
    layer (rotary read without layer_rope_theta) puts that layer's pattern far off."""
    model = _granite_swa(family)
    with_adapter_changed(monkeypatch, model, **change)
    output, pattern = _verified(model, tiny_inputs(length=13))
    assert (output if diff == "output" else pattern) > 1e-2


@pytest.mark.parametrize("change", [dict(qkv=FusedGroups("qkv_proj", "mp_num", order=("q", "k", "v"))),
                                    dict(qkv=FusedPerHead("qkv_proj")),
                                    dict(rotary=adapters.Rotary(dims="rotary_dim", sin_first=True))],
                         ids=["keys-before-values", "grouped-per-head", "rotate-half"])
@torch.no_grad()
def test_codegens_grouped_qkv_and_interleaved_rotary_verify_and_matter(change, monkeypatch):
    """CodeGen's qkv_proj is 4 groups (mp_num), each [q | v | k] over 2 of its 8 heads (of 8 dims, 4 of
    them rotated in pairs (2i, 2i + 1)): verify agrees; reading k before v in each group, the groups as
    one head each (GPT-NeoX's [q_h | k_h | v_h]) or the rotary as rotate-half fails it by far."""
    model = _model("codegen", "interface", n_head=8, rotary_dim=4)
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert (mine.n_heads, mine.d_head, mine.rotary_dim) == (8, 8, 4)
    with_adapter_changed(monkeypatch, model, **change)
    assert max(_verified(model)) > 1e-2


@pytest.mark.parametrize("nope", [False, True], ids=["rotary", "nope"])
@torch.no_grad()
def test_olmo_hybrids_attention_verifies_with_and_without_rotary(nope, monkeypatch):
    """OLMo Hybrid's attention layers (1 and 3, beside Gated DeltaNet) norm q and k over the whole
    projection and rotate only where rope_parameters names a base (the released checkpoints: none,
    NoPE): verify agrees either way; rotating the NoPE model's layers (rotary read without
    `needs_base`), or leaving out the q/k norms, fails it by far."""
    rope = dict(rope_type="default", rope_theta=None if nope else 10000.0)
    model = _model("olmo_hybrid", "hybrid", rope_parameters=rope)
    assert (model.model.rotary_emb is None) == nope
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    assert [l for l, _ in attention_blocks(model)] == list(HYBRID_ATTENTION["olmo_hybrid"])
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert mine.qk_norm and mine.rotary_dim == (0 if nope else 16)
    with_adapter_changed(monkeypatch, model, **(dict(rotary=adapters.Rotary()) if nope else dict(qk_norm=None)))
    assert _verified(model)[1] > 1e-2


@pytest.mark.parametrize("gate", [True, False], ids=["gate", "no-gate"])
@torch.no_grad()
def test_lfm3s_gated_attention_verifies(gate):
    """LFM3's attention layers (1 sliding, 3 full attention with proportional rotary) beside short
    convolutions: verify agrees with its per-head sigmoid gate (g_proj, one row a head) and without it."""
    model = _model("lfm3", "hybrid", use_attention_gate=gate)
    output, pattern = _verified(model, tiny_inputs(length=13))
    assert output <= 1e-4 and pattern <= 1e-5
    assert [l for l, _ in attention_blocks(model)] == list(HYBRID_ATTENTION["lfm3"])
    mine = [headscope.MultiHeadAttention.from_hf(b, model.config).config for _, b in attention_blocks(model)]
    assert [(c.output_gate, c.rotary_dim) for c in mine] == [(gate, 16)] * 2  # proportional: tables over the head


@torch.no_grad()
def test_lfm3s_head_gate_matters(monkeypatch):
    """Without its per-head gate from_hf's module outputs far off in both attention layers, its patterns
    unchanged (the gate acts after them)."""
    model = _model("lfm3", "hybrid")
    with_adapter_changed(monkeypatch, model, output_gate=False)
    table = headscope.verify(model, tiny_inputs(length=13))
    assert (table.max_abs_diff_output > 1e-2).all() and (table.max_abs_diff_pattern <= 1e-5).all()
