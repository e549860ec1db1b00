"""headscope inside and alongside tiny random-init Hugging Face models of every supported family."""
import pytest
import torch

import headscope
from headscope.attention import MultiHeadAttention
from headscope.hf.adapters import attention_blocks
from tests.support.tiny import ODD_FAMILIES, tiny_inputs, tiny_model
from tests.support.contracts import assert_hook_contract

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _out(output):
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def _valid_positions(x):
    return x["attention_mask"].bool()  # (B, T): padded positions carry no meaning


@pytest.fixture(params=ODD_FAMILIES)
def family(request):
    return request.param


@torch.no_grad()
def test_capture_keeps_logits_and_patterns_match_eager(family):
    model = tiny_model(family)
    x = tiny_inputs()
    default = _out(model(**x))
    with headscope.capture(model) as cap:
        captured = _out(model(**x))
    valid = _valid_positions(x)
    assert (default - captured).abs()[valid].max() <= 1e-4
    model.set_attn_implementation("eager")
    eager = model(**x, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    n_heads = model.config.num_attention_heads
    for layer, theirs in enumerate(eager):
        mine = cap.patterns[layer]
        assert mine.shape == (2, n_heads, 11, 11)
        diff = (mine - theirs).abs().permute(0, 2, 1, 3)[valid]  # real query rows only
        assert diff.max() <= 1e-5


@torch.no_grad()
def test_capture_layers_heads_and_reducer(family):
    model = tiny_model(family)
    x = tiny_inputs()
    with headscope.capture(model) as full:
        model(**x)
    with headscope.capture(model, layers=[1], heads=[0, 2], dtype=torch.float16) as part:
        model(**x)
    assert set(part.patterns) == {1}
    assert part.patterns[1].dtype == torch.float16
    torch.testing.assert_close(part.patterns[1].float(), full.patterns[1][:, [0, 2]], atol=1e-3, rtol=0)

    def max_weight(layer, pattern, mask):  # a small statistic instead of the map
        return pattern.amax(dim=-1).mean(dim=(0, 2))

    with headscope.capture(model, reduce=max_weight) as red:
        model(**x)
        model(**x)
    assert not red.patterns and len(red.results[0]) == 2
    torch.testing.assert_close(red.results[0][0], max_weight(0, full.patterns[0], None))


@torch.no_grad()
def test_verify_agrees_on_every_layer(family):
    model = tiny_model(family)
    table = headscope.verify(model, tiny_inputs())
    assert list(table.layer) == [0, 1]
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5
    assert model.config._attn_implementation == "sdpa"


@torch.no_grad()
def test_verify_notices_a_wrong_weight(family):
    model = tiny_model(family)
    _, block = attention_blocks(model)[1]
    original = MultiHeadAttention.from_hf
    def broken(block_, config, layer=None):
        m = original(block_, config, layer)
        if block_ is block:
            m.W_k.weight.mul_(1.5)
        return m
    MultiHeadAttention.from_hf = broken
    try:
        table = headscope.verify(model, tiny_inputs())
    finally:
        MultiHeadAttention.from_hf = original
    assert table.max_abs_diff_pattern[0] <= 1e-5
    assert table.max_abs_diff_pattern[1] > 1e-3


def test_from_hf_hooks_fire_once_with_declared_shapes(family):
    """Contract test of each adapter: every hook exists and fires once with its shape."""
    assert_hook_contract(tiny_model(family))


@torch.no_grad()
def test_ablate_changes_output_and_restores_bit_identical(family):
    model = tiny_model(family)
    x = tiny_inputs()
    before = _out(model(**x))
    for mode in ("zero", "mean"):
        with headscope.ablate(model, heads=[(0, 1), (1, 2)], mode=mode):
            ablated = _out(model(**x))
        assert (ablated - before).abs().max() > 1e-3
    after = _out(model(**x))
    assert torch.equal(before, after)
    assert model.config._attn_implementation == "sdpa"


@torch.no_grad()
def test_zero_ablation_equals_removing_the_heads_columns(family):
    """Ablation must hit exactly the chosen head: compare with editing W_O by hand."""
    model = tiny_model(family)
    x = tiny_inputs(batch=1, pad=False)
    _, block = attention_blocks(model)[1]
    d = MultiHeadAttention.from_hf(block, model.config).config.d_head
    with headscope.ablate(model, heads=[(1, 2)]):
        ablated = _out(model(**x))
    # The same by hand: zero the columns of W_O that read head 2.
    from headscope.hf.adapters import adapter_for, out_projection
    weight = out_projection(model, block).weight
    saved = weight.detach().clone()
    cols = slice(2 * d, 3 * d)
    if adapter_for(model.config).out_is_conv1d:
        weight[cols, :] = 0  # transformers' Conv1D stores (in, out)
    else:
        weight[:, cols] = 0
    try:
        by_hand = _out(model(**x))
    finally:
        weight.copy_(saved)
    torch.testing.assert_close(ablated, by_hand, atol=1e-5, rtol=0)


def test_context_restores_model_after_an_exception(family):
    model = tiny_model(family)
    with pytest.raises(ValueError):
        with headscope.capture(model):
            with headscope.ablate(model, heads=[(0, 0)]):
                raise ValueError("boom")
    assert model.config._attn_implementation == "sdpa"
    from headscope.hf import route
    assert not route.routed_models()


def test_nested_sessions_restore_once(family):
    model = tiny_model(family)
    x = tiny_inputs()
    with torch.no_grad(), headscope.capture(model) as cap:
        with headscope.ablate(model, heads=[(0, 0)]):
            model(**x)
        assert model.config._attn_implementation == "headscope"
    assert model.config._attn_implementation == "sdpa"
    assert len(cap.patterns) == 2


def test_bad_layer_head_and_mode():
    model = tiny_model("llama")
    with pytest.raises(headscope.HeadscopeError, match="layer 5 is out of range"):
        with headscope.capture(model, layers=[5]):
            pass
    with pytest.raises(headscope.HeadscopeError, match="head 9 is out of range"):
        with headscope.ablate(model, heads=[(0, 9)]):
            pass
    with pytest.raises(headscope.HeadscopeError, match="unknown ablation mode"):
        with headscope.ablate(model, heads=[(0, 0)], mode="noise"):
            pass
    assert model.config._attn_implementation == "sdpa"


def test_unsupported_architecture_is_named():
    import transformers as tf

    model = tf.GPTNeoForCausalLM(tf.GPTNeoConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                                                 attention_types=[[["global"], 2]]))
    with pytest.raises(headscope.HeadscopeError, match=r"\(gpt_neo\) does not send attention through.*_can_set_attn"):
        with headscope.capture(model):
            pass


@torch.no_grad()
def test_reducer_in_head_groups_matches_whole_layer(family):
    """chunk_heads: the layer's map is never whole, yet reducers and outputs agree."""
    model = tiny_model(family)
    x = tiny_inputs()
    reduce = lambda layer, p, mask: {"max": p.amax(-1).mean(-1), "first": p[..., 0].sum(-1)}  # (B, H) each
    with headscope.capture(model, reduce=reduce) as whole:
        out_whole = _out(model(**x))
    with headscope.capture(model, reduce=reduce, chunk_heads=2) as grouped:
        out_grouped = _out(model(**x))
    valid = _valid_positions(x)
    assert (out_whole - out_grouped).abs()[valid].max() <= 1e-5
    for layer, results in whole.results.items():
        for key in ("max", "first"):
            torch.testing.assert_close(grouped.results[layer][0][key], results[0][key], atol=1e-6, rtol=0)
    with pytest.raises(headscope.HeadscopeError, match="chunk_heads needs a reducer"):
        with headscope.capture(model, chunk_heads=2):
            pass
