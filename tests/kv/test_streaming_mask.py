"""Streaming heads through headscope's kernel against an independent reference: eager attention
(tests/support/kv_reference.py) with the same per-head mask built by hand, on tiny models of three
families."""
import pytest
import torch

from headscope.attention.streaming import KeyWindow, restricted_mask, windowed_attention
from headscope.attention.kernel import attention
from headscope.hf.streaming import stream_heads
from headscope.hf.adapters import head_sizes
from headscope.errors import HeadscopeError
from tests.support.kv_reference import reference_attention
from tests.support.tiny import output_of, tiny_inputs, tiny_model

SINK, RECENT = 1, 3
STREAMING = {0: [1], 1: [0]}  # layer -> key/value heads that stream


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral"])  # MHA; GQA (4 query, 2 kv heads); sliding window 4
def test_streaming_heads_equal_eager_with_a_hand_built_mask(family):
    model = tiny_model(family, kind="interface")
    inputs = tiny_inputs(batch=2, length=11)
    heads = [(layer, h) for layer, kv in STREAMING.items() for h in kv]
    with torch.no_grad():
        with stream_heads(model, heads, SINK, RECENT):
            ours = output_of(model(**inputs))
        with reference_attention(model, STREAMING, SINK, RECENT):
            reference = output_of(model(**inputs))
        plain = output_of(model(**inputs))
    valid = inputs["attention_mask"].bool()  # padded positions are not compared
    assert torch.allclose(ours[valid], reference[valid], atol=1e-5, rtol=0)
    assert (ours[valid] - plain[valid]).abs().max() > 1e-3  # the restriction changed something


def test_windowed_attention_equals_the_explicit_path_with_the_restricted_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 37, 8), torch.randn(2, 3, 37, 8), torch.randn(2, 3, 37, 8)
    window = KeyWindow((0, 2), sink=3, recent=5)
    blocked = windowed_attention(q, k, v, window, is_causal=True, block=7)
    dense_mask = restricted_mask(window, None, 6, 3, 37, 37, True)
    dense, _ = attention(q, k, v, mask=dense_mask, need_pattern=True)
    assert torch.allclose(blocked, dense, atol=1e-5, rtol=0)
    plain, _ = attention(q, k, v, is_causal=True)
    assert torch.equal(blocked[:, 2:4], plain[:, 2:4])  # kv head 1 (query heads 2, 3) is not restricted


def test_queries_aligned_to_the_end_keep_the_last_keys():
    # Two queries at the end of ten keys (a cache): positions 8 and 9.
    kept = KeyWindow((0,), sink=2, recent=3).kept(2, 10)
    assert kept.tolist() == [[True, True, False, False, False, False, True, True, True, False],
                             [True, True, False, False, False, False, False, True, True, True]]


def test_a_watched_pattern_sees_the_restriction():
    from headscope.hf.capture import capture

    model = tiny_model("llama", kind="interface")
    inputs = tiny_inputs(batch=1, length=11)
    with torch.no_grad(), stream_heads(model, [(0, 1)], SINK, RECENT), capture(model, layers=[0]) as cap:
        model(**inputs)
    pattern = cap.patterns[0][0]  # (H, T, T)
    assert torch.equal(pattern[2:] > 0, KeyWindow((0,), SINK, RECENT).kept(11, 11).tril().expand(2, 11, 11))
    assert (pattern[:2] > 0).sum() > (pattern[2:] > 0).sum()


def test_bad_streaming_heads_are_one_line_errors():
    model = tiny_model("llama", kind="interface")
    n_kv = head_sizes(model.config)[2]
    with pytest.raises(HeadscopeError, match="out of range"):
        with stream_heads(model, [(0, n_kv)], 1, 2):
            pass
    with pytest.raises(HeadscopeError, match="recent must be an integer of at least 1, got 0"):
        with stream_heads(model, [(0, 0)], 1, 0):
            pass
    with pytest.raises(HeadscopeError, match="sink must be an integer of at least 0, got -1"):
        with stream_heads(model, [(0, 0)], -1, 2):
            pass
