"""Norm gains found by what the norms do, and folded into the OV circuit."""
import pytest
import torch

from headscope.loading.loader import Loaded
from headscope.head_geometry.norm_gains import measured_gain, norm_gains
from headscope.head_geometry.ov_circuit import ov_copying, ov_scores
from tests.support.tiny import tiny_config, tiny_model

NORMS = {  # where each family keeps them (the test may name them; the library does not)
    "llama": (lambda m, i: m.model.layers[i].input_layernorm, lambda m: m.model.norm),
    "gpt2": (lambda m, i: m.transformer.h[i].ln_1, lambda m: m.transformer.ln_f),
    "gemma": (lambda m, i: m.model.layers[i].input_layernorm, lambda m: m.model.norm),
}
# What each family's norm multiplies by (transformers' modeling files): Gemma's RMSNorm computes
# x / rms(x) * (1 + weight), the others x / scale(x) * weight.
GAIN = {"llama": lambda w: w, "gpt2": lambda w: w, "gemma": lambda w: 1.0 + w}


def _with_random_gains(family):
    if family == "gemma":  # not among the odd kind's families: a fresh model of its interface config
        import transformers as tf

        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(tiny_config("gemma", "interface")).eval()
    else:
        model = tiny_model(family)
    layer_norm, final_norm = NORMS[family]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for norm in [layer_norm(model, i) for i in range(2)] + [final_norm(model)]:
            norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=g))
    return model


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma"])
def test_norm_gains_are_the_attention_input_and_final_norms(family):
    model = _with_random_gains(family)
    layer_norm, final_norm = NORMS[family]
    gains, final = norm_gains(model)
    for layer in range(2):
        assert torch.equal(gains[layer], GAIN[family](layer_norm(model, layer).weight))
    assert torch.equal(final, GAIN[family](final_norm(model).weight))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma"])
@torch.no_grad()
def test_the_measured_gain_is_what_the_norm_multiplies_by(family):
    """A norm's output on a zero-mean unit-RMS input is that input times its gain (up to eps)."""
    model = _with_random_gains(family)
    norm = NORMS[family][0](model, 0)
    d = norm.weight.shape[0]
    assert torch.allclose(measured_gain(norm, d), GAIN[family](norm.weight).float(), rtol=1e-4, atol=1e-5)


def test_folded_ov_circuit_equals_the_hand_folded_matrices():
    model = _with_random_gains("llama")  # GQA: 6 query heads, 2 key/value heads, d_head 10
    loaded = Loaded(model=model, tokenizer=None, name="tiny llama", family="llama", causal=True)
    folded = ov_copying(loaded, fold_norms=True)
    plain = ov_copying(loaded)
    assert folded.attrs["folded"] == {"layers": 2, "final": True}
    W_E = model.get_input_embeddings().weight.detach().float()
    W_U = (model.model.norm.weight[:, None] * model.lm_head.weight.T).detach().float()
    for layer in range(2):
        attn = model.model.layers[layer].self_attn
        W_V = (model.model.layers[layer].input_layernorm.weight[:, None] * attn.v_proj.weight.T).detach().float()
        W_O = attn.o_proj.weight.T.detach().float()
        for head in range(6):
            kv = head // 3
            expected = ov_scores(W_E, W_V[:, kv * 10:(kv + 1) * 10], W_O[head * 10:(head + 1) * 10], W_U)
            row = folded[(folded.layer == layer) & (folded["head"] == head)].iloc[0]
            assert (row.copy_top1, row.positive_eig_share) == pytest.approx(expected, abs=1e-6)
    assert not plain.positive_eig_share.equals(folded.positive_eig_share)  # the gains do change the circuit


def test_gemmas_folded_ov_circuit_takes_its_norms_one_plus_weight():
    """Gemma's norms multiply by 1 + weight: the hand-folded matrices use that, and the OV
    table folded by headscope equals them (with the weight itself the shares differ)."""
    model = _with_random_gains("gemma")  # 4 query heads, 2 key/value heads, d_head 16
    loaded = Loaded(model=model, tokenizer=None, name="tiny gemma", family="gemma", causal=True)
    folded = ov_copying(loaded, fold_norms=True)
    W_E = model.get_input_embeddings().weight.detach().float()
    W_U = ((1.0 + model.model.norm.weight[:, None]) * model.lm_head.weight.T).detach().float()
    W_U_weight_only = (model.model.norm.weight[:, None] * model.lm_head.weight.T).detach().float()
    wrong = 0.0
    for layer in range(2):
        attn = model.model.layers[layer].self_attn
        gain = model.model.layers[layer].input_layernorm.weight[:, None]
        W_V = ((1.0 + gain) * attn.v_proj.weight.T).detach().float()
        W_V_weight_only = (gain * attn.v_proj.weight.T).detach().float()
        W_O = attn.o_proj.weight.T.detach().float()
        for head in range(4):
            kv = head // 2
            expected = ov_scores(W_E, W_V[:, kv * 16:(kv + 1) * 16], W_O[head * 16:(head + 1) * 16], W_U)
            row = folded[(folded.layer == layer) & (folded["head"] == head)].iloc[0]
            assert (row.copy_top1, row.positive_eig_share) == pytest.approx(expected, abs=1e-6)
            weight_only = ov_scores(W_E, W_V_weight_only[:, kv * 16:(kv + 1) * 16], W_O[head * 16:(head + 1) * 16],
                                    W_U_weight_only)
            wrong = max(wrong, abs(weight_only[1] - row.positive_eig_share))
    assert wrong > 1e-3  # the old reading (the weight as the gain) gives other shares
