"""headscope.attention.MultiHeadAttention on its own: paths, reference math, hooks, devices."""
import math

import pytest
import torch

from headscope.attention import MultiHeadAttention
from headscope.errors import HeadscopeError
from headscope.attention.hook_points import hook_points

HOOK_SHAPES = {  # declared shapes for B=2, T=7, H=6, Hkv=2, D=5, d_model=20
    "hook_q": (2, 6, 7, 5), "hook_k": (2, 2, 7, 5), "hook_v": (2, 2, 7, 5),
    "hook_scores": (2, 6, 7, 7), "hook_pattern": (2, 6, 7, 7), "hook_z": (2, 7, 6, 5),
    "hook_result": (2, 7, 6, 20),
}

CONFIGS = [
    dict(d_model=24, n_heads=4),
    dict(d_model=20, n_heads=6, n_kv_heads=2, d_head=5, bias=True),
    dict(d_model=20, n_heads=6, n_kv_heads=1, d_head=6, rotary_dim=6),
    dict(d_model=20, n_heads=3, d_head=8, rotary_dim=4, causal=False, bias=True, out_bias=False),
    dict(d_model=20, n_heads=3, d_head=8, scale=0.3),
]


def _module(seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(**kw).eval()


def _padding(batch=2, length=7):
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, -2:] = False
    return mask


@pytest.mark.parametrize("kw", CONFIGS)
@pytest.mark.parametrize("masked", [False, True])
def test_fast_path_equals_explicit_path(kw, masked):
    m = _module(**kw)
    x = torch.randn(2, 7, kw["d_model"])
    mask = _padding() if masked else None
    fast = m(x, mask)
    explicit, pattern = m(x, mask, return_pattern=True)
    assert pattern.shape == (2, kw["n_heads"], 7, 7)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=0)
    # Rows of the pattern are distributions.
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, kw["n_heads"], 7), atol=1e-5, rtol=0)


def _textbook(x, m, causal):
    """Concat(head_1..head_h) W_O with head_i = softmax(Q_i K_i^T / sqrt(d)) V_i, written out."""
    heads = []
    d = m.config.d_head
    for i in range(m.config.n_heads):
        rows = slice(i * d, (i + 1) * d)
        q = x @ m.W_q.weight[rows].T
        k = x @ m.W_k.weight[rows].T
        v = x @ m.W_v.weight[rows].T
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        if causal:
            t = x.shape[1]
            scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v)
    return torch.cat(heads, dim=-1) @ m.W_o.weight.T


@pytest.mark.parametrize("causal", [True, False])
def test_equals_textbook_reference(causal):
    m = _module(d_model=32, n_heads=4, causal=causal)
    x = torch.randn(3, 9, 32)
    torch.testing.assert_close(m(x), _textbook(x, m, causal), atol=1e-5, rtol=0)


def test_padding_mask_hides_keys_and_additive_mask_agrees():
    m = _module(d_model=20, n_heads=3, d_head=8, causal=False)
    x = torch.randn(2, 7, 20)
    mask = _padding()
    _, pattern = m(x, mask, return_pattern=True)
    assert pattern[1, :, :, -2:].abs().max() == 0
    additive = torch.zeros(2, 1, 1, 7).masked_fill(~mask[:, None, None, :], torch.finfo(torch.float32).min)
    torch.testing.assert_close(m(x, additive), m(x, mask), atol=1e-5, rtol=0)
    # Padding keys change nothing for the real tokens of example 1.
    out_short = m(x[1:, :5])
    torch.testing.assert_close(m(x, mask)[1, :5], out_short[0], atol=1e-5, rtol=0)


def _einsum_reference(x, m, allowed, context=None):
    """GQA attention written out with einsum (no rotary): queries from x, keys and values from
    `context` (cross-attention) or x; `allowed` `[batch, query, key]` the keys each query may
    see; z = softmax(q k^T * scale) v per head, times sigmoid(x W_gate^T + b) per element where
    the module has an output gate, then z W_O^T + b. Returns `(output, pattern, z)`."""
    c = m.config
    source = x if context is None else context
    B, T, S = x.shape[0], x.shape[1], source.shape[1]
    q = (x @ m.W_q.weight.T + m.W_q.bias).view(B, T, c.n_heads, c.d_head)
    k = (source @ m.W_k.weight.T + m.W_k.bias).view(B, S, c.n_kv_heads, c.d_head)
    v = (source @ m.W_v.weight.T + m.W_v.bias).view(B, S, c.n_kv_heads, c.d_head)
    share = c.n_heads // c.n_kv_heads
    k, v = k.repeat_interleave(share, dim=2), v.repeat_interleave(share, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * c.scale
    pattern = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
    z = torch.einsum("bhts,bshd->bthd", pattern, v)  # (B, T, H, D)
    if m.W_gate is not None:
        z = z * torch.sigmoid(x @ m.W_gate.weight.T + m.W_gate.bias).view(B, T, c.n_heads, c.d_head)
    return z.reshape(B, T, -1) @ m.W_o.weight.T + m.W_o.bias, pattern, z


@pytest.mark.parametrize("causal", [True, False])
def test_cross_attention_over_a_context_equals_einsum_reference(causal):
    """With `context`, keys and values come from it (9 positions, the second example's last 3
    padded) and queries from x (5 positions); `causal` and rotary do not apply across the two."""
    m = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=5, bias=True, causal=causal, rotary_dim=4)
    x, context = torch.randn(2, 5, 20), torch.randn(2, 9, 20)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, -3:] = False
    expected, expected_pattern, _ = _einsum_reference(x, m, key_mask[:, None, :].expand(2, 5, 9), context)
    out, pattern = m(x, key_mask, context=context, return_pattern=True)
    assert pattern.shape == (2, 6, 5, 9)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(pattern, expected_pattern, atol=1e-6, rtol=0)
    torch.testing.assert_close(m(x, key_mask, context=context), expected, atol=1e-5, rtol=0)  # fast path
    seen = {}

    def shape_of(name):
        def record(value, hook):
            seen[name] = tuple(value.shape)
        return record

    with m.hooks({n: shape_of(n) for n in ("hook_q", "hook_k", "hook_v", "hook_scores", "hook_z")}):
        m(x, key_mask, context=context)
    assert seen == {"hook_q": (2, 6, 5, 5), "hook_k": (2, 2, 9, 5), "hook_v": (2, 2, 9, 5),
                    "hook_scores": (2, 6, 5, 9), "hook_z": (2, 5, 6, 5)}


def test_rotary_from_positions_equals_given_tables():
    from headscope.attention.rotary import rotary_cos_sin

    m = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=6, rotary_dim=4)
    x = torch.randn(2, 7, 20)
    cos, sin = rotary_cos_sin(torch.arange(7), 4)
    torch.testing.assert_close(m(x), m(x, rotary=(cos, sin)), atol=0, rtol=0)
    # Rotary makes scores depend on relative position only: shifting all positions keeps output.
    torch.testing.assert_close(m(x, positions=torch.arange(7) + 13), m(x), atol=1e-5, rtol=0)


def test_output_gate_equals_einsum_reference_and_hook_z_is_the_gated_z():
    """z * sigmoid(W_gate x) per element before W_O, on the fast and the explicit path; hook_z
    holds the gated z (W_O's input), and zeroing a head there removes exactly its W_O columns."""
    m = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=5, bias=True, output_gate=True)
    assert m.config.output_gate and m.W_gate.weight.shape == (30, 20)
    x, mask = torch.randn(2, 7, 20), _padding()
    causal = mask[:, None, :] & torch.ones(7, 7, dtype=torch.bool).tril()
    expected, _, expected_z = _einsum_reference(x, m, causal)
    torch.testing.assert_close(m(x, mask), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(m(x, mask, return_pattern=True)[0], expected, atol=1e-5, rtol=0)
    seen = {}
    with m.hooks({"hook_z": lambda z, hook: seen.setdefault("z", z.clone())}):
        m(x, mask)
    torch.testing.assert_close(seen["z"], expected_z, atol=1e-6, rtol=0)
    with m.hooks({"hook_result": lambda r, hook: seen.setdefault("result", r.clone())}):
        torch.testing.assert_close(m(x, mask), expected, atol=1e-5, rtol=0)
    w_o = m.W_o.weight.view(20, 6, 5)
    torch.testing.assert_close(seen["result"], torch.einsum("bthd,mhd->bthm", expected_z, w_o), atol=1e-5, rtol=0)

    def zero_head_2(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    without = expected - torch.einsum("btd,md->btm", expected_z[:, :, 2], w_o[:, 2])
    with m.hooks({"hook_z": zero_head_2}):
        torch.testing.assert_close(m(x, mask), without, atol=1e-5, rtol=0)


def _wide_reference(x, m, mask):
    """GQA attention whose projections read a wider input than W_O writes, with einsum: q, k, v
    from x `[B, T, d_in]` (no biases, no rotary), z W_O^T `[B, T, d_model]`."""
    c = m.config
    B, T = x.shape[:2]
    q = torch.einsum("bti,ni->btn", x, m.W_q.weight).view(B, T, c.n_heads, c.d_head)
    k = torch.einsum("bti,ni->btn", x, m.W_k.weight).view(B, T, c.n_kv_heads, c.d_head)
    v = torch.einsum("bti,ni->btn", x, m.W_v.weight).view(B, T, c.n_kv_heads, c.d_head)
    share = c.n_heads // c.n_kv_heads
    k, v = k.repeat_interleave(share, dim=2), v.repeat_interleave(share, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * c.scale
    allowed = mask[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()
    pattern = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    z = torch.einsum("bhts,bshd->bthd", pattern, v)  # (B, T, H, D)
    return torch.einsum("btn,mn->btm", z.reshape(B, T, -1), m.W_o.weight), pattern


def test_an_input_wider_than_the_output_equals_einsum_reference():
    """`d_in`: W_q, W_k, W_v read 2 * d_model (zamba2's hidden state joined to the embeddings),
    W_O writes d_model; fast and explicit paths and every hook's shape agree with it."""
    m = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=5, d_in=40, scale=0.4)
    assert (m.config.d_in, m.config.d_model) == (40, 20)
    assert m.W_q.weight.shape == (30, 40) and m.W_k.weight.shape == m.W_v.weight.shape == (10, 40)
    assert m.W_o.weight.shape == (20, 30)
    x, mask = torch.randn(2, 7, 40), _padding()
    expected, pattern = _wide_reference(x, m, mask)
    torch.testing.assert_close(m(x, mask), expected, atol=1e-5, rtol=0)
    out, mine = m(x, mask, return_pattern=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(mine, pattern, atol=1e-6, rtol=0)
    seen = {}
    with m.hooks({n: (lambda n: lambda t, hook: seen.__setitem__(n, tuple(t.shape)))(n) for n in HOOK_SHAPES}):
        torch.testing.assert_close(m(x, mask), expected, atol=1e-5, rtol=0)
    assert seen == HOOK_SHAPES
    assert _module(d_model=20, n_heads=4).config.d_in == 20  # by default the projections read d_model


def _rms_normed(z, gain, eps):
    """A hand-written RMSNorm over all heads' features: z `[B, T, H, D]` -> gain * z / rms(z)."""
    flat = z.flatten(2)  # (B, T, H * D)
    return (gain * flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + eps)).view_as(z)


def test_a_norm_over_all_heads_before_w_o_equals_einsum_reference_and_hook_z_is_the_normed_z():
    """`pre_out_norm`: W_O RMSNorm(Concat(heads)) (bitnet's attn_sub_norm), on the fast and the
    explicit path; hook_z and hook_result hold the normed z (W_O's input), and zeroing a head
    there removes exactly its W_O columns' share of the output."""
    m = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=5, pre_out_norm=True)
    assert m.config.pre_out_norm and m.pre_out_norm.weight.shape == (30,)
    with torch.no_grad():
        m.pre_out_norm.weight.copy_(torch.rand(30) * 2 + 0.2)  # a gain that a module ignoring it fails
    eps = torch.finfo(torch.float32).eps  # nn.RMSNorm's default
    x, mask = torch.randn(2, 7, 20), _padding()
    c = m.config
    q = torch.einsum("bti,ni->btn", x, m.W_q.weight).view(2, 7, 6, 5)
    k = torch.einsum("bti,ni->btn", x, m.W_k.weight).view(2, 7, 2, 5).repeat_interleave(3, dim=2)
    v = torch.einsum("bti,ni->btn", x, m.W_v.weight).view(2, 7, 2, 5).repeat_interleave(3, dim=2)
    allowed = mask[:, None, None, :] & torch.ones(7, 7, dtype=torch.bool).tril()
    scores = torch.einsum("bthd,bshd->bhts", q, k) * c.scale
    pattern = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    z = _rms_normed(torch.einsum("bhts,bshd->bthd", pattern, v), m.pre_out_norm.weight, eps)  # (B, T, H, D)
    w_o = m.W_o.weight.view(20, 6, 5)
    expected = torch.einsum("bthd,mhd->btm", z, w_o)
    torch.testing.assert_close(m(x, mask), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(m(x, mask, return_pattern=True)[0], expected, atol=1e-5, rtol=0)
    seen = {}
    with m.hooks({"hook_z": lambda t, hook: seen.setdefault("z", t.clone()),
                  "hook_result": lambda t, hook: seen.setdefault("result", t.clone())}):
        torch.testing.assert_close(m(x, mask), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(seen["z"], z, atol=1e-6, rtol=0)
    torch.testing.assert_close(seen["result"], torch.einsum("bthd,mhd->bthm", z, w_o), atol=1e-5, rtol=0)
    unnormed = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=5)  # same seed, same weights, no norm
    assert (unnormed(x, mask) - expected).abs().max() > 1e-2  # the norm matters at this scale

    def zero_head_2(t, hook):
        t = t.clone()
        t[:, :, 2] = 0
        return t

    without = expected - torch.einsum("btd,md->btm", z[:, :, 2], w_o[:, 2])
    with m.hooks({"hook_z": zero_head_2}):
        torch.testing.assert_close(m(x, mask), without, atol=1e-5, rtol=0)


def test_without_an_output_gate_there_is_no_gate_projection():
    m = _module(d_model=20, n_heads=4)
    assert m.W_gate is None and not m.config.output_gate
    assert m.pre_out_norm is None and not m.config.pre_out_norm


def test_every_hook_fires_once_with_declared_shape():
    m = _module(d_model=20, n_heads=6, n_kv_heads=2, d_head=5, rotary_dim=4)
    assert set(hook_points(m)) == set(HOOK_SHAPES)
    seen = {}

    def record(name):
        def fn(value, hook):
            seen.setdefault(name, []).append(tuple(value.shape))
        return fn

    x = torch.randn(2, 7, 20)
    with m.hooks({name: record(name) for name in HOOK_SHAPES}):
        hooked = m(x)
    assert {k: v for k, v in seen.items()} == {k: [s] for k, s in HOOK_SHAPES.items()}
    # hook_result's sum over heads (plus bias) is the normal output.
    torch.testing.assert_close(hooked, m(x), atol=1e-5, rtol=0)


def test_hooks_replace_values_and_are_always_removed():
    m = _module(d_model=20, n_heads=4, d_head=5)
    x = torch.randn(2, 7, 20)
    base = m(x)

    def kill_head_2(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    with m.hooks({"hook_z": kill_head_2}):
        edited = m(x)
    # Zeroing head 2's z equals removing its columns of W_o.
    w = m.W_o.weight.detach().clone()
    w[:, 10:15] = 0
    z_full = {}
    with m.hooks({"hook_z": lambda z, h: z_full.setdefault("z", z)}):
        m(x)
    expected = z_full["z"].reshape(2, 7, 20) @ w.T
    torch.testing.assert_close(edited, expected, atol=1e-5, rtol=0)
    assert not any(p.hooked for p in m.modules() if hasattr(p, "hooked"))
    with pytest.raises(RuntimeError):
        with m.hooks({"hook_pattern": lambda p, h: p}):
            raise RuntimeError("boom")
    assert not any(p.hooked for p in m.modules() if hasattr(p, "hooked"))
    assert torch.equal(m(x), base)


def test_pattern_hook_edits_output():
    m = _module(d_model=20, n_heads=4, d_head=5, causal=True)
    x = torch.randn(1, 6, 20)

    def attend_to_first(p, hook):
        out = torch.zeros_like(p)
        out[..., 0] = 1.0
        return out

    with m.hooks({"hook_pattern": attend_to_first}):
        out = m(x)
    v = (x @ m.W_v.weight.T)[:, :1]  # value of position 0, all heads
    expected = v.expand(1, 6, 20) @ m.W_o.weight.T
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_unknown_hook_name_is_a_clear_error():
    m = _module(d_model=20, n_heads=4, d_head=5)
    with pytest.raises(HeadscopeError, match="hook_pattern"):
        with m.hooks({"hook_attn": lambda v, h: v}):
            pass


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="multiple"):
        MultiHeadAttention(20, 6, n_kv_heads=4, d_head=5)
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(20, 6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_pattern_is_fp32_and_close(dtype):
    m32 = _module(d_model=32, n_heads=4)
    m = _module(d_model=32, n_heads=4).to(dtype)
    x = torch.randn(2, 9, 32)
    out, pattern = m(x.to(dtype), return_pattern=True)
    assert pattern.dtype == torch.float32 and out.dtype == dtype
    ref, ref_pattern = m32(x, return_pattern=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(pattern, ref_pattern, atol=tol, rtol=0)
    torch.testing.assert_close(out.float(), ref, atol=5 * tol, rtol=0)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_cuda_fast_path_equals_explicit_and_cpu(dtype, tol):
    m = _module(d_model=64, n_heads=8, n_kv_heads=2, rotary_dim=8)
    x = torch.randn(2, 33, 64)
    ref = m(x)
    mc = m.to("cuda", dtype)
    fast = mc(x.to("cuda", dtype))
    explicit, pattern = mc(x.to("cuda", dtype), return_pattern=True)
    assert pattern.device.type == "cuda" and pattern.dtype == torch.float32
    torch.testing.assert_close(fast.float(), explicit.float(), atol=tol, rtol=0)
    torch.testing.assert_close(fast.float().cpu(), ref, atol=tol * 3, rtol=0)
