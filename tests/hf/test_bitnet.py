"""bitnet's adapter: an RMSNorm over all heads' outputs (`attn_sub_norm`) between the attention
function and o_proj, copied by from_hf as `MultiHeadAttention.pre_out_norm`.

A tiny bitnet (`gained_model`; tests/support/tiny.py's keeps the norm's gain at its init, ones)
with the gain moved off ones, so a module that drops or misplaces the gain shows. The references
are the model's own: its eager patterns (inside `verify`), what each o_proj received and produced
on the inputs its attention module received, and o_proj's and v_proj's own weights for the OV
circuit. A quantized checkpoint's layers (transformers' `AutoBitLinear`, `BitLinear`) round their
inputs as they run, which no weight matrix reproduces: from_hf and verify refuse them."""
import pytest
import torch
from torch import nn

import headscope
from headscope.attention import MultiHeadAttention
from headscope.head_geometry.ov_circuit import head_ov_weights, ov_scores
from headscope.hf.adapters import attention_blocks
from headscope.hf.from_hf import call_arguments
from headscope.hf.verify import _named_inputs
from tests.support.tiny import tiny_config, tiny_inputs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def gained_model(seed: int = 0):
    """Tiny bitnet (2 layers, 4 heads of 16, GQA 2) whose attn_sub_norm gains are random, not ones."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(tiny_config("bitnet", kind="interface"))
    with torch.no_grad():
        for _, block in attention_blocks(model):
            block.attn_sub_norm.weight.copy_(torch.rand(block.attn_sub_norm.weight.shape) * 2 + 0.2)
    return model.eval()


@torch.no_grad()
def test_verify_agrees_with_the_models_eager_attention():
    model = gained_model()
    table = headscope.verify(model, tiny_inputs())
    assert list(table.layer) == [0, 1]
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5


@torch.no_grad()
def test_from_hf_fed_a_layers_inputs_reproduces_its_o_proj_input_and_output():
    """hook_z is what o_proj received (after attn_sub_norm), and the module's output is what o_proj
    produced; the same module without the norm is far off, so the check has teeth."""
    model = gained_model()
    layer, block = attention_blocks(model)[1]
    seen = {}
    handles = [
        block.register_forward_pre_hook(lambda m, a, kw: seen.update(received=_named_inputs(m, a, kw)),
                                        with_kwargs=True),
        block.register_forward_hook(lambda m, a, out: seen.update(returned=out)),
        block.o_proj.register_forward_pre_hook(lambda m, a: seen.update(z=a[0].clone())),
        block.o_proj.register_forward_hook(lambda m, a, out: seen.update(out=out.clone())),
    ]
    try:
        model(**tiny_inputs())
    finally:
        for h in handles:
            h.remove()
    mine = MultiHeadAttention.from_hf(block, model.config, layer)
    assert mine.config.pre_out_norm and mine.pre_out_norm is not block.attn_sub_norm  # a copy
    torch.testing.assert_close(mine.pre_out_norm.weight, block.attn_sub_norm.weight, atol=0, rtol=0)
    kwargs = call_arguments(mine, model.config, seen["received"], seen["returned"])
    got = {}
    with mine.hooks({"hook_z": lambda t, hook: got.setdefault("z", t.clone())}):
        out = mine(**kwargs)
    B, T, H, D = got["z"].shape
    assert (H, D) == (4, 16)
    torch.testing.assert_close(got["z"].reshape(B, T, H * D), seen["z"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out, seen["out"], atol=1e-5, rtol=0)
    mine.pre_out_norm = nn.Identity()
    assert (mine(**kwargs) - seen["out"]).abs().max() > 1e-2


def _quantized(model, kind: str):
    """The model with layer 0's q_proj replaced by a quantized checkpoint's layer of `kind`."""
    from transformers.integrations.bitnet import AutoBitLinear, BitLinear

    block = attention_blocks(model)[0][1]
    q = block.q_proj
    if kind == "AutoBitLinear":  # keeps a float weight, but quantizes its input (and online, weight) per call
        layer = AutoBitLinear(q.in_features, q.out_features, bias=False, online_quant=True)
        with torch.no_grad():
            layer.weight.copy_(q.weight)
    else:  # ternary weights packed four to a uint8
        layer = BitLinear(q.in_features, q.out_features, bias=False, dtype=q.weight.dtype)
    block.q_proj = layer
    return model, block


@pytest.mark.parametrize("kind", ["AutoBitLinear", "BitLinear"])
def test_a_quantized_checkpoints_layers_are_refused_in_one_line(kind):
    model, block = _quantized(gained_model(), kind)
    calls = (lambda: MultiHeadAttention.from_hf(block, model.config), lambda: headscope.verify(model, tiny_inputs()))
    for call in calls:
        with pytest.raises(headscope.HeadscopeError, match=f"q_proj \\({kind}\\) is not a plain linear layer") as err:
            call()
        assert "\n" not in str(err.value)


def test_ov_weights_fold_the_sub_norms_gain_into_w_o():
    """W_O of head h is diag(g) W_O's rows of h, read here from o_proj and attn_sub_norm directly;
    W_V is v_proj's rows of the head's key/value head (GQA: 2 query heads per kv head)."""
    model = gained_model()
    blocks = dict(attention_blocks(model))
    rows = list(head_ov_weights(model))
    assert [(layer, head) for layer, head, _, _ in rows] == [(l, h) for l in (0, 1) for h in range(4)]
    for layer, head, W_V, W_O in rows:
        block = blocks[layer]
        gain = block.attn_sub_norm.weight.detach()
        folded = (block.o_proj.weight.detach() * gain).T  # (H * D, d_model), x @ W
        kv = head // 2
        torch.testing.assert_close(W_O, folded[head * 16:(head + 1) * 16], atol=1e-6, rtol=0)
        torch.testing.assert_close(W_V, block.v_proj.weight.detach().T[:, kv * 16:(kv + 1) * 16], atol=0, rtol=0)
        unfolded = block.o_proj.weight.detach().T[head * 16:(head + 1) * 16]
        assert (W_O - unfolded).abs().max() > 1e-2


def test_ov_scores_ignore_the_left_out_per_token_scale():
    """The norm's per-token scale 1 / rms(z), left out of the OV table, is one positive number for
    the whole circuit: copy_top1 and positive_eig_share do not change under it."""
    torch.manual_seed(0)
    W_E, W_V, W_O, W_U = torch.randn(99, 32), torch.randn(32, 8), torch.randn(8, 32), torch.randn(32, 99)
    plain = ov_scores(W_E, W_V, W_O, W_U)
    for scale in (0.05, 3.7):
        scaled = ov_scores(W_E, W_V, W_O * scale, W_U)
        assert scaled[0] == pytest.approx(plain[0], abs=1e-12)
        assert scaled[1] == pytest.approx(plain[1], abs=1e-6)
    assert 0.0 < plain[1] < 1.0
