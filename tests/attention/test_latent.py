"""MultiHeadAttention with a latent (multi-head latent attention) against a reference written from DeepSeek-V2's
formulas (arXiv 2405.04434, §2.1): one head at a time, RMSNorm by hand, rotary as complex
multiplication, a sink logit as one more entry of the softmax that no value follows, the output gate as
z_h * sigmoid(x W_gate,h^T) (none of headscope's own rotary or kernel code)."""
import pytest
import torch

from headscope.attention import LatentRanks, MultiHeadAttention

NOPE, ROPE, D_VALUE = 6, 4, 5


def _rms(x, gain, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def _rotate(x, positions, base, interleaved):
    """x `[pos, d]` rotated as complex pairs: (2i, 2i + 1) interleaved, else (i, i + d/2)."""
    d = x.shape[-1]
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (T, d/2)
    turn = torch.polar(torch.ones_like(angles), angles)
    if interleaved:
        pairs = torch.view_as_complex(x.double().reshape(-1, d // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn).reshape(-1, d).to(x.dtype)
    pairs = torch.complex(x[:, :d // 2].double(), x[:, d // 2:].double()) * turn
    return torch.cat([pairs.real, pairs.imag], dim=-1).to(x.dtype)


def _reference(m, x, mask=None):
    """Output `[B, T, d_model]` and pattern `[B, H, T, T]` of `m` on x, from the formulas."""
    cfg, lat = m.config, m.latent
    B, T, _ = x.shape
    H, nope, rope, dv, r = cfg.n_heads, lat.d_nope, lat.ranks.d_rope, cfg.d_value, lat.ranks.kv_rank
    regroup = (lambda t: torch.cat([t[:, 0::2], t[:, 1::2]], -1)) if lat.ranks.regroup else (lambda t: t)
    turn = (lambda t: _rotate(t, pos, cfg.rotary_base, cfg.rotary_interleaved)) if cfg.rotary_dim else (lambda t: t)
    rotate = lambda t: turn(regroup(t))
    pos = torch.arange(T)
    outs, patterns = [], []
    for b in range(B):
        xb = x[b]  # (T, d_in)
        if lat.W_q is not None:
            q_all = xb @ lat.W_q.weight.T + (lat.W_q.bias if lat.W_q.bias is not None else 0)
        else:
            c_q = _rms(xb @ lat.W_q_down.weight.T + (lat.W_q_down.bias if lat.W_q_down.bias is not None else 0),
                       lat.q_norm.weight, lat.q_norm.eps)
            q_all = c_q @ lat.W_q_up.weight.T
        down = xb @ lat.W_kv_down.weight.T + (lat.W_kv_down.bias if lat.W_kv_down.bias is not None else 0)
        c_kv = _rms(down[:, :r], lat.kv_norm.weight, lat.kv_norm.eps)  # (T, r)
        k_rot = rotate(down[:, r:])  # (T, rope), shared
        kv_all = c_kv @ lat.W_kv_up.weight.T  # (T, H * (nope + dv))
        z = []
        head_patterns = []
        for h in range(H):
            q_h = q_all[:, h * (nope + rope):(h + 1) * (nope + rope)]
            q_h = torch.cat([q_h[:, :nope], rotate(q_h[:, nope:])], -1)
            kv_h = kv_all[:, h * (nope + dv):(h + 1) * (nope + dv)]
            k_h = torch.cat([kv_h[:, :nope], k_rot], -1)
            v_h = kv_h[:, nope:]
            scores = (q_h @ k_h.T) * cfg.scale
            allowed = torch.ones(T, T, dtype=torch.bool)
            if cfg.causal:
                allowed = torch.tril(allowed)
            if mask is not None:
                allowed = allowed & mask[b][None, :]
            scores = scores.masked_fill(~allowed, float("-inf"))
            if m.sinks is not None:  # softmax over [scores | sink], the sink's share dropped
                a = torch.cat([scores, m.sinks[h].expand(T, 1)], -1).softmax(-1)[:, :T]
            else:
                a = scores.softmax(-1)
            head_patterns.append(a)
            z_h = a @ v_h  # (T, dv)
            if m.W_gate is not None:  # this head's dv gate rows, per element
                gate = xb @ m.W_gate.weight.T + (m.W_gate.bias if m.W_gate.bias is not None else 0)
                z_h = z_h * torch.sigmoid(gate[:, h * dv:(h + 1) * dv])
            z.append(z_h)
        out = torch.cat(z, -1) @ m.W_o.weight.T + (m.W_o.bias if m.W_o.bias is not None else 0)
        outs.append(out)
        patterns.append(torch.stack(head_patterns))
    return torch.stack(outs), torch.stack(patterns)


def _module(seed=0, q_rank=12, rotary=True, regroup=False, **options):
    torch.manual_seed(seed)
    ranks = LatentRanks(kv_rank=8, d_rope=ROPE, q_rank=q_rank, regroup=regroup)
    m = MultiHeadAttention(32, 4, d_head=NOPE + ROPE, d_value=D_VALUE, rotary_dim=ROPE if rotary else 0, latent=ranks,
                           **options).eval()
    with torch.no_grad():  # gains away from 1, so a kernel that skips a latent norm fails
        for norm in (m.latent.q_norm, m.latent.kv_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
        if m.sinks is not None:  # sink logits that differ by head, as large as the scores
            m.sinks.normal_(0.0, 1.0)
    return m


@pytest.mark.parametrize("options", [dict(), dict(q_rank=None), dict(rotary_interleaved=True), dict(bias=True),
                                     dict(causal=False), dict(rotary=False), dict(regroup=True), dict(sinks=True),
                                     dict(output_gate=True), dict(sinks=True, output_gate=True, bias=True)],
                         ids=["q-latent", "q-full-rank", "interleaved", "biases", "bidirectional", "no-rotary", "regroup",
                              "sinks", "output-gate", "sinks-gate-biases"])
@torch.no_grad()
def test_latent_attention_matches_the_formulas(options):
    m = _module(**options)
    x = torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    ref_out, ref_pattern = _reference(m, x, mask)
    out, pattern = m(x, mask, return_pattern=True)  # the explicit path
    fast = m(x, mask)  # SDPA
    assert pattern.shape == (2, 4, 7, 7)
    real = mask[:, :, None]  # padded query rows mean nothing
    assert (out - ref_out).abs().masked_select(real).max() <= 1e-5
    assert (fast - ref_out).abs().masked_select(real).max() <= 1e-5
    assert (pattern - ref_pattern).abs().masked_select(mask[:, None, :, None]).max() <= 1e-6


@torch.no_grad()
def test_latent_hooks_have_their_declared_shapes_and_edits_act():
    m = _module()
    x = torch.randn(2, 7, 32)
    seen = {}

    def keep(name):
        def hook(t, hook_point=None):
            seen[name] = t.shape
        return hook

    names = ["hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z", "hook_result"]
    with m.hooks({n: keep(n) for n in names}):
        m(x)
    D = NOPE + ROPE
    assert seen == {"hook_q": (2, 4, 7, D), "hook_k": (2, 4, 7, D), "hook_v": (2, 4, 7, 5),
                    "hook_scores": (2, 4, 7, 7), "hook_pattern": (2, 4, 7, 7), "hook_z": (2, 7, 4, 5),
                    "hook_result": (2, 7, 4, 32)}
    # the rotary key is one for all heads: its dims of hook_k agree across heads, the others do not
    keys = {}
    with m.hooks({"hook_k": lambda t, hook_point=None: keys.setdefault("k", t.clone())}):
        m(x)
    k = keys["k"]
    assert torch.equal(k[:, 0, :, NOPE:], k[:, 3, :, NOPE:])
    assert not torch.allclose(k[:, 0, :, :NOPE], k[:, 3, :, :NOPE])

    results = []
    with m.hooks({"hook_result": lambda t, hook_point=None: results.append(t.clone())}):
        full = m(x)

    def drop_head_2(z, hook_point=None):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    with m.hooks({"hook_z": drop_head_2}):
        dropped = m(x)
    assert (full - results[0][:, :, 2] - dropped).abs().max() <= 1e-5  # removing head 2's z removes its result
    assert (full - dropped).abs().max() > 1e-3


@pytest.mark.parametrize("regroup", [False, True])
@torch.no_grad()
def test_input_weights_are_the_linear_maps_to_q_k_v(regroup):
    """With the latent norms' per-token scale taken away (gain-only norms) and no rotation
    (every position 0), q, k and v are exactly x times `input_weights()`."""

    class GainOnly(torch.nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.weight = norm.weight

        def forward(self, x):
            return x * self.weight

    m = _module(regroup=regroup)
    m.latent.q_norm, m.latent.kv_norm = GainOnly(m.latent.q_norm), GainOnly(m.latent.kv_norm)
    x = torch.randn(1, 5, 32)
    seen = {}
    hooks = {n: (lambda name: lambda t, hook_point=None: seen.setdefault(name, t))(n)
             for n in ("hook_q", "hook_k", "hook_v")}
    with m.hooks(hooks):
        m(x, positions=torch.zeros(5, dtype=torch.long))
    w_q, w_k, w_v = m.input_weights()
    H = 4
    for name, w in (("hook_q", w_q), ("hook_k", w_k), ("hook_v", w_v)):
        expected = (x[0] @ w.T).view(5, H, -1).transpose(0, 1)  # (H, T, d)
        assert (seen[name][0] - expected).abs().max() <= 1e-5, name


def test_plain_module_reads_its_projections_and_value_size():
    m = MultiHeadAttention(24, 4, 2, d_head=6, d_value=3)
    assert [w.shape for w in m.input_weights()] == [(24, 24), (12, 24), (6, 24)]
    out, pattern = m(torch.randn(2, 5, 24), return_pattern=True)
    assert out.shape == (2, 5, 24) and m.W_o.in_features == 12
    assert pattern.shape == (2, 4, 5, 5)


def test_latent_sizes_that_do_not_fit_are_refused():
    ranks = LatentRanks(kv_rank=8, d_rope=4)
    with pytest.raises(ValueError, match="key per head"):
        MultiHeadAttention(32, 4, 2, d_head=10, latent=ranks)
    with pytest.raises(ValueError, match="rotates its d_rope=4"):
        MultiHeadAttention(32, 4, d_head=10, rotary_dim=2, latent=ranks)
    for option in (dict(qk_norm=True), dict(v_norm=True), dict(clip=1.0)):  # the latent path has none of them
        with pytest.raises(ValueError, match="no q/k or value norm or clip"):
            MultiHeadAttention(32, 4, d_head=10, latent=ranks, **option)


@torch.no_grad()
def test_regrouped_pairs_rotate_as_interleaved_ones():
    """Regrouping the pairs then rotating halves gives the scores of rotating the pairs in place:
    the same module's pattern either way (its q and k differ only by the order of their dims)."""
    regrouped, interleaved = _module(regroup=True), _module(rotary_interleaved=True)
    x = torch.randn(2, 7, 32)
    assert torch.allclose(regrouped(x, return_pattern=True)[1], interleaved(x, return_pattern=True)[1], atol=1e-6)
    assert not torch.allclose(_module()(x, return_pattern=True)[1], interleaved(x, return_pattern=True)[1], atol=1e-4)
