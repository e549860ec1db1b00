"""zamba2's adapter: one attention block shared by several layers, reading the hidden state joined
to the embeddings (2 * hidden_size), each layer adding its own low-rank adapters (LoRA) to q, k, v.

A tiny zamba2 with the adapters and rotary on and its LoRA weights moved off their init
(tests/support/tiny.py's `zamba2_with_lora`; its plain hybrid zamba2 has neither), so a missing or
misplaced adapter shows. The references
are the model's own: each attention module's eager weights (`eager_weights`), what it returned
and what its o_proj produced on the inputs it received, and removing a head at o_proj's input
(`head_zeroed_at`); the folded weights are checked against W + B A computed here from the
adapters' own Linear weights."""
import pytest
import torch

import headscope
from headscope.hf import route
from headscope.hf.adapters import attention_blocks, core_modules
from headscope.loading.loader import Loaded
from tests.support.contracts import assert_hook_contract, assert_ov_refused, eager_weights, head_zeroed_at
from tests.support.planted import char_tokenizer
from tests.support.tiny import HYBRID_ATTENTION, tiny_inputs, tiny_model, zamba2_with_lora

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LAYERS = HYBRID_ATTENTION["zamba2"]  # (1, 3): the hybrid layers, attention layers 0 and 1 of the block
ADAPTERS = ("linear_q_adapter_list", "linear_k_adapter_list", "linear_v_adapter_list")
PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def core_of(model, layer):
    return model.model.layers[layer].shared_transformer.self_attn


def folded_by_hand(model, layer):
    """`[W_q + B_q A_q, W_k + ..., W_v + ...]` from the adapters' Linear weights, the entry being
    the layer's position among the hybrid layers (`config.hybrid_layer_ids`)."""
    core = core_of(model, layer)
    entry = model.config.hybrid_layer_ids.index(layer)
    out = []
    for projection, adapters in zip(PROJECTIONS, ADAPTERS):
        down, up = getattr(core, adapters)[entry]  # Linear(d_in -> rank), Linear(rank -> rows)
        out.append(getattr(core, projection).weight + up.weight @ down.weight)
    return out


@torch.no_grad()
def seen_by_the_model(model, x):
    """Per attention layer, what its module received (hidden_states, mask, rotary tables) and
    returned, and what its o_proj produced, on the eager path."""
    received, returned, produced, handles = {}, {}, {}, []
    previous = model.config._attn_implementation
    try:
        for layer in LAYERS:
            core = core_of(model, layer)
            handles.append(core.register_forward_pre_hook(
                lambda m, args, kwargs, layer=layer: received.__setitem__(layer, kwargs), with_kwargs=True))
            handles.append(core.register_forward_hook(lambda m, args, out, layer=layer: returned.__setitem__(layer, out)))
            handles.append(core.o_proj.register_forward_hook(
                lambda m, args, out, layer=layer: produced.__setitem__(layer, out)))
        model.set_attn_implementation("eager")
        model(**x)
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
    return received, returned, produced


def test_the_test_model_has_its_adapters_rotary_and_a_shared_block():
    model = zamba2_with_lora()
    config = model.config
    assert config.use_shared_attention_adapter and config.use_mem_rope and config.hybrid_layer_ids == [1, 3]
    one, three = core_of(model, 1), core_of(model, 3)
    assert one is not three and one.q_proj.weight is three.q_proj.weight  # one block's weights, two layers
    assert one.layer_dic == {1: 0, 3: 1}
    deltas = [(up.weight @ down.weight).abs().max() for down, up in one.linear_q_adapter_list]
    assert min(deltas) > 0.5 * one.q_proj.weight.abs().max()  # off their near-zero init: a missing LoRA shows
    assert [type(a).__name__ for a in core_of(zamba2_with_lora(2), 3).linear_q_adapter_list] == ["Identity", "Sequential"]


@pytest.mark.parametrize("num_mem_blocks", [1, 2])
@torch.no_grad()
def test_each_layers_module_holds_its_own_folded_weights(num_mem_blocks):
    model = zamba2_with_lora(num_mem_blocks)
    assert [layer for layer, _ in attention_blocks(model)] == list(LAYERS)
    mine = {layer: headscope.MultiHeadAttention.from_hf(block, model.config, layer)
            for layer, block in attention_blocks(model)}
    for layer, module in mine.items():
        core = core_of(model, layer)
        cfg = module.config
        assert (cfg.d_in, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head) == (128, 64, 4, 4, 32)
        assert cfg.scale == pytest.approx(16 ** -0.5) and cfg.rotary_dim == 32  # (head_dim / 2) ** -0.5, full rotary
        for weight, expected in zip((module.W_q, module.W_k, module.W_v), folded_by_hand(model, layer)):
            assert (weight.weight - expected).abs().max() <= 1e-6
        assert torch.equal(module.W_o.weight, core.o_proj.weight)
    assert (mine[1].W_q.weight - mine[3].W_q.weight).abs().max() > 0.1  # the shared block, two layers' LoRA


@pytest.mark.parametrize("num_mem_blocks", [1, 2])
@torch.no_grad()
def test_verify_agrees_with_each_cores_own_eager_weights(num_mem_blocks):
    model = zamba2_with_lora(num_mem_blocks)
    x = tiny_inputs()
    table = headscope.verify(model, x)
    assert tuple(table.layer) == LAYERS
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    eager = eager_weights(model, dict(core_modules(model)), x)
    assert tuple(sorted(eager)) == LAYERS and eager[1].shape == (2, 4, 11, 11)
    assert_hook_contract(model)


@torch.no_grad()
def test_a_from_hf_module_fed_a_layers_inputs_gives_its_output_and_pattern():
    """headscope's module of each layer, given what the layer's attention received (the joined,
    normed 2 * hidden input, the mask and the model's own rotary tables, passed as they are),
    reproduces o_proj's output and the eager weights; the other layer's LoRA on the same inputs
    does not (the shared block alone is not the layer's attention)."""
    model = zamba2_with_lora()
    x = tiny_inputs()
    received, returned, produced = seen_by_the_model(model, x)
    valid = x["attention_mask"].bool()
    for layer in LAYERS:
        inputs = received[layer]
        assert inputs["hidden_states"].shape == (2, 11, 128)
        module = headscope.MultiHeadAttention.from_hf(core_of(model, layer), model.config, layer)
        out, pattern = module(inputs["hidden_states"], inputs["attention_mask"], rotary=inputs["position_embeddings"],
                              return_pattern=True)
        assert (out - produced[layer]).abs()[valid].max() <= 1e-4
        assert (pattern - returned[layer][1]).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5
        other = LAYERS[1 - LAYERS.index(layer)]
        wrong = headscope.MultiHeadAttention.from_hf(core_of(model, layer), model.config, other)
        assert (wrong(inputs["hidden_states"], inputs["attention_mask"], rotary=inputs["position_embeddings"])
                - produced[layer]).abs().max() > 1e-3


def test_from_hf_without_the_layer_is_refused_in_one_line():
    model = zamba2_with_lora()
    block = core_of(model, 1)
    for layer in (None, 2):
        with pytest.raises(headscope.HeadscopeError, match=r"zamba2's attention block is shared by layers 1, 3.*"
                                                           r"needs layer=") as err:
            headscope.MultiHeadAttention.from_hf(block, model.config, layer)
        assert "\n" not in str(err.value)
    tiny = tiny_model("zamba2", kind="hybrid")  # without adapters the layer is not needed
    assert headscope.MultiHeadAttention.from_hf(core_of(tiny, 3), tiny.config).config.d_in == 128


@torch.no_grad()
def test_ablation_still_equals_zeroing_the_heads_slice_of_o_proj_input():
    model = zamba2_with_lora()
    x = tiny_inputs()
    before = model(**x).logits
    for layer in LAYERS:
        o_proj = core_of(model, layer).o_proj
        with headscope.ablate(model, heads=[(layer, 2)]):
            ablated = model(**x).logits
        with head_zeroed_at(o_proj, 2, 4):
            reference = model(**x).logits
        assert (ablated - before).abs().max() > 1e-3
        assert (ablated - reference).abs().max() <= 1e-4
    assert torch.equal(before, model(**x).logits)
    assert not route.routed_models()


def test_the_ov_table_is_refused_in_one_line_and_analyze_notes_it():
    """o_proj's output reaches the residual stream only through the block's MLP, a linear layer
    and the next Mamba mixer: there is no W_O W_U path to score."""
    from headscope.probes.kinds import TextProbe

    loaded = Loaded.from_model(zamba2_with_lora(), char_tokenizer(), "tiny-zamba2-lora")
    reason = assert_ov_refused(loaded, "OV copying is not available for zamba2: a head's output reaches the residual "
                                       "stream only through")
    analysis = headscope.analyze(loaded, detectors=["previous_token"], probes=[TextProbe(n_examples=2, seq_len=16)],
                                 explorer_examples=1)
    assert f"OV copying not computed: {reason}" in analysis.meta["notes"] and "ov" not in analysis.tables
    assert tuple(sorted(set(analysis.scores.layer))) == LAYERS
