"""MultiHeadAttention's options from recent families, each against its formula written out here:
the query temperature (Llama 4; Ministral 3's offset), the values' norm (Gemma 4), the clip after the q/k norms
(OLMoE) and the q/k norms after rotary (HunYuan); the fast path equals the explicit one with each."""
import math

import pytest
import torch

from headscope.attention import MultiHeadAttention

B, T, D_MODEL, H, D = 2, 9, 20, 3, 8


def _module(**kw):
    torch.manual_seed(0)
    return MultiHeadAttention(D_MODEL, H, d_head=D, **kw).eval()


def _heads(t):
    return t.view(B, T, H, D)  # (B, T, H, D)


def _attend(m, q, k, v):
    """Causal softmax attention of `[B, T, H, D]` q, k, v, through W_O."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * m.config.scale
    scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    z = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)  # (B, T, H, D)
    return m.W_o(z.reshape(B, T, H * D))


def _hooked_q(m, x, **kw):
    seen = {}
    with m.hooks({"hook_q": lambda t, hook: seen.setdefault("q", t), "hook_v": lambda t, hook: seen.setdefault("v", t)}):
        out = m(x, **kw)
    return out, seen


@torch.no_grad()
def test_query_temperature_scales_each_position_as_llama4_does():
    floor_scale, attn_scale = 3.0, 0.7
    m = _module(query_temperature=(floor_scale, attn_scale))
    x = torch.randn(B, T, D_MODEL)
    t = torch.arange(T, dtype=torch.float32)
    temperature = 1 + attn_scale * torch.log(1 + torch.floor((t + 1) / floor_scale))  # 1, 1, 1.49, ...
    assert temperature[0] == 1 and temperature[-1] > 1.7
    q = _heads(m.W_q(x)) * temperature[None, :, None, None]
    reference = _attend(m, q, _heads(m.W_k(x)), _heads(m.W_v(x)))
    out, seen = _hooked_q(m, x)
    torch.testing.assert_close(seen["q"], q.transpose(1, 2), atol=1e-6, rtol=0)  # hook_q sees the tempered q
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(m(x, return_pattern=True)[0], out, atol=1e-5, rtol=0)
    shifted = torch.arange(T)[None].expand(B, T) + 5  # positions given per example: the temperature follows them
    later = 1 + attn_scale * torch.log(1 + torch.floor((shifted[0].float() + 1) / floor_scale))
    _, seen = _hooked_q(m, x, positions=shifted)
    torch.testing.assert_close(seen["q"], (_heads(m.W_q(x)) * later[None, :, None, None]).transpose(1, 2),
                               atol=1e-6, rtol=0)
    assert (_module()(x) - out).abs().max() > 1e-2  # without it, another output


@torch.no_grad()
def test_query_temperature_with_offset_0_scales_as_ministral3_does():
    floor_scale, attn_scale = 3.0, 0.7
    m = _module(query_temperature=(floor_scale, attn_scale, 0))
    assert m.config.query_temperature == (3.0, 0.7, 0.0)
    x = torch.randn(B, T, D_MODEL)
    t = torch.arange(T, dtype=torch.float32)
    temperature = 1 + attn_scale * torch.log(1 + torch.floor(t / floor_scale))  # 1, 1, 1, 1.49, ...
    assert temperature[2] == 1 and temperature[3] > 1.4
    q = _heads(m.W_q(x)) * temperature[None, :, None, None]
    out, seen = _hooked_q(m, x)
    torch.testing.assert_close(seen["q"], q.transpose(1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(out, _attend(m, q, _heads(m.W_k(x)), _heads(m.W_v(x))), atol=1e-5, rtol=0)
    llama4 = _module(query_temperature=(floor_scale, attn_scale))  # offset 1: another output
    assert (llama4(x) - out).abs().max() > 1e-3


@pytest.mark.parametrize("given", [(3.0,), (3.0, 0.7, 0.0, 1.0)])
def test_a_query_temperature_of_another_length_is_refused(given):
    with pytest.raises(ValueError, match="query_temperature is"):
        _module(query_temperature=given)


@torch.no_grad()
def test_v_norm_normalises_each_heads_values_without_a_gain():
    m = _module(v_norm=True)
    assert m.v_norm.weight is None
    x = torch.randn(B, T, D_MODEL) * 3
    v = _heads(m.W_v(x))
    v = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps)  # per head, per token
    out, seen = _hooked_q(m, x)
    torch.testing.assert_close(seen["v"], v.transpose(1, 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(out, _attend(m, _heads(m.W_q(x)), _heads(m.W_k(x)), v), atol=1e-5, rtol=0)
    torch.testing.assert_close(m(x, return_pattern=True)[0], out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("after", [False, True])
@torch.no_grad()
def test_the_clip_comes_before_or_after_the_qk_norms(after):
    clip = 0.4
    m = _module(qk_norm=True, clip=clip, clip_after_norm=after)
    x = torch.randn(B, T, D_MODEL) * 3
    project = {"q": (m.W_q, m.q_norm), "k": (m.W_k, m.k_norm)}
    if after:
        q, k = (_heads(norm(_heads(w(x)))).clamp(-clip, clip) for w, norm in project.values())
    else:
        q, k = (norm(_heads(w(x).clamp(-clip, clip))) for w, norm in project.values())
    v = _heads(m.W_v(x).clamp(-clip, clip))
    out, seen = _hooked_q(m, x)
    torch.testing.assert_close(seen["q"], q.transpose(1, 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(out, _attend(m, q, k, v), atol=1e-5, rtol=0)
    assert (seen["q"].abs().max() <= clip + 1e-7) == after  # after the norms nothing passes the clip
    other = _module(qk_norm=True, clip=clip, clip_after_norm=not after)
    assert (other(x) - out).abs().max() > 1e-2
    assert math.isclose(m.config.clip, clip)


def _rotate_half_by_hand(t, base=10000.0):
    """`[B, T, H, D]` rotated as rotate-half rotary does: pair (i, i + D/2) at position p turned by
    p * base ** (-2i / D), written with cos and sin of each angle."""
    half = D // 2
    angle = torch.arange(T, dtype=torch.float32)[:, None] * base ** (-torch.arange(half, dtype=torch.float32) * 2 / D)
    cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]  # (1, T, 1, D/2)
    first, second = t[..., :half], t[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@torch.no_grad()
def test_qk_norms_after_rotary_come_after_it():
    m = _module(qk_norm=True, rotary_dim=D, qk_norm_after_rotary=True)
    gains = torch.Generator().manual_seed(2)
    for norm in (m.q_norm, m.k_norm):
        norm.weight.copy_(torch.rand(D, generator=gains) + 0.5)  # a gain: before or after rotary differ
    x = torch.randn(B, T, D_MODEL)

    def rms(t, norm):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float32).eps) * norm.weight

    q = rms(_rotate_half_by_hand(_heads(m.W_q(x))), m.q_norm)
    k = rms(_rotate_half_by_hand(_heads(m.W_k(x))), m.k_norm)
    out, seen = _hooked_q(m, x)
    torch.testing.assert_close(seen["q"], q.transpose(1, 2), atol=1e-5, rtol=0)
    torch.testing.assert_close(out, _attend(m, q, k, _heads(m.W_v(x))), atol=1e-5, rtol=0)
    torch.testing.assert_close(m(x, return_pattern=True)[0], out, atol=1e-5, rtol=0)
    before = _module(qk_norm=True, rotary_dim=D)
    before.load_state_dict(m.state_dict())
    assert (before(x) - out).abs().max() > 1e-2  # the same norms before rotary: another output


@pytest.mark.parametrize("options", [dict(qk_norm_after_rotary=True),
                                     dict(qk_norm=True, clip=0.5, clip_after_norm=True, qk_norm_after_rotary=True)],
                         ids=["without-qk-norm", "with-a-clip-after-the-norms"])
def test_qk_norm_after_rotary_is_refused_where_it_means_nothing(options):
    with pytest.raises(ValueError, match="qk_norm_after_rotary"):
        _module(**options)
