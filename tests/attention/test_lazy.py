"""LazyPattern: entries and row statistics from the fused kernel's log-sum-exp equal the same
reductions of the full pattern, on the fused (CPU flash), FlexAttention and blockwise paths, and analyze's lazy
path gives the maps path's scores without computing a map."""
import pytest
import torch

import headscope
import headscope.attention.lazy as lazy_module
from headscope import detectors
from headscope.attention.kernel import attention
from headscope.attention.lazy import lazy_attention
from headscope.hf.adapters import head_sizes
from headscope.analysis.analyze import analyze
from headscope.probes.base import ProbeBatch
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from tests.support.attention_cases import EXTRAS, FP32, MASKS, alibi, assert_lazy_is_the_pattern, qkv
from tests.support.tiny import ODD_FAMILIES, tiny_inputs, tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(params=["fused", "fused with the entropy", "blockwise", "flex"])
def path(request):
    """`lazy_attention` keywords of each path: the fused CPU kernel (alone, or computing the row
    entropy in the same call where it can), query blocks, or FlexAttention (CUDA's fused kernel;
    on the CPU torch runs the same score_mod and block mask uncompiled)."""
    if request.param == "fused with the entropy":
        return dict(entropy=True)
    if request.param == "blockwise":
        return dict(fused=False, block_bytes=4 * 2 * 6 * 40 * 7)  # 7 query rows per block of qkv()'s shape
    if request.param == "flex":
        return dict(kernel="flex")
    assert lazy_module.fused_lse_available(torch.device("cpu"))
    return {}


@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_lazy_entries_equal_the_full_pattern(path, mask_kind):
    q, k, v = qkv()
    b, h, t, _ = q.shape
    mask, is_causal, real = MASKS[mask_kind](b, h, t)
    z, lazy = lazy_attention(q, k, v, mask=mask, is_causal=is_causal, **path)
    z_ref, pattern = attention(q, k, v, mask=mask, is_causal=is_causal, need_pattern=True)
    rows = real  # (B, T): rows of queries that see at least one real key (padded rows carry no meaning)
    assert lazy.shape == tuple(pattern.shape)
    targets = assert_lazy_is_the_pattern(z, lazy, z_ref, pattern, rows, offsets=(-3, -1, 0, 1, 2), keys=(0, 7))
    assert lazy.mass(targets).sum() > 1.0  # the targets hold real attention, not only zeros


def test_grouped_keys_go_to_the_fused_kernel_uncopied_or_repeated_with_the_same_numbers(monkeypatch):
    """aten's CPU kernel reads grouped keys and values itself on this torch; where it could not,
    they are repeated per query head, and every number is the same either way."""
    assert lazy_module.cpu_flash_groups_heads()
    q, k, v = qkv()  # 6 query heads, 2 key/value heads
    assert k.shape[1] < q.shape[1]
    grouped_z, grouped = lazy_attention(q, k, v, is_causal=True)
    grouped_entropy = grouped.entropy()  # its fused pass, keys as values, grouped too
    monkeypatch.setattr(lazy_module, "cpu_flash_groups_heads", lambda: False)
    repeated_z, repeated = lazy_attention(q, k, v, is_causal=True)
    assert grouped.kernel == repeated.kernel == "cpu-flash"
    assert torch.equal(grouped_z, repeated_z) and torch.equal(grouped.lse, repeated.lse)
    assert torch.equal(grouped_entropy, repeated.entropy())


@pytest.mark.parametrize("path_kind", ["fused", "fused with the entropy"])
def test_q_and_k_laid_out_token_by_token_give_the_same_numbers(path_kind):
    """A layer's projections leave q and k token by token in memory (`[batch, token, head, d]`
    viewed as `[batch, head, token, d]`); the diagonals and the entropy read them in that order.
    Every number equals that of the same tensors laid out head by head, and the pattern's."""
    q, k, v = qkv()
    token_major = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    assert lazy_module._token_major(token_major[0]) and not lazy_module._token_major(q)
    keywords = dict(is_causal=True, entropy=path_kind == "fused with the entropy")
    _, heads_first = lazy_attention(q, k, v, **keywords)
    _, tokens_first = lazy_attention(*token_major, **keywords)
    _, pattern = attention(q, k, v, is_causal=True, need_pattern=True)
    for offset in (-3, -1, 0):
        assert torch.equal(tokens_first.diagonal(offset), heads_first.diagonal(offset))
        torch.testing.assert_close(tokens_first.diagonal(offset), pattern.diagonal(offset, -2, -1), **FP32)
    assert torch.equal(tokens_first.entropy(), heads_first.entropy())
    exact = -(pattern * pattern.clamp_min(1e-30).log()).sum(-1)
    torch.testing.assert_close(tokens_first.entropy(), exact, **FP32)


@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("mask_kind", ["causal", "padded bool", "additive bias"])
def test_lazy_entries_with_softcap_and_sinks(path, mask_kind, extra):
    """Soft-capped scores (computed in query blocks) and sink logits (in the row lse, dropped from
    the pattern): z, entries and entropy equal the explicit path's, rows sum to less than 1."""
    q, k, v = qkv()
    b, h, t, _ = q.shape
    mask, is_causal, rows = MASKS[mask_kind](b, h, t)
    z, lazy = lazy_attention(q, k, v, mask=mask, is_causal=is_causal, **EXTRAS[extra], **path)
    z_ref, pattern = attention(q, k, v, mask=mask, is_causal=is_causal, need_pattern=True, **EXTRAS[extra])
    _, plain = attention(q, k, v, mask=mask, is_causal=is_causal, need_pattern=True)
    assert (pattern - plain).abs().max() > 0.1  # the extra changes the pattern a lot
    assert_lazy_is_the_pattern(z, lazy, z_ref, pattern, rows)
    sinks = EXTRAS[extra].get("sinks")
    sink_share = (sinks.view(1, -1, 1) - lazy.lse).exp() if sinks is not None else torch.zeros_like(lazy.lse)  # (B, H, Tq)
    missing = (1 - pattern.sum(-1)).transpose(1, 2)[rows]  # (n rows, H): what the keys did not get
    torch.testing.assert_close(missing, sink_share.transpose(1, 2)[rows], **FP32)
    if sinks is not None:
        assert missing.max() > 0.1  # the sinks take real mass


def test_keywords_choose_the_path_and_the_block_size(monkeypatch):
    """fused=False computes the row log-sum-exp in query blocks of `block_bytes`; the default
    takes the fused kernel and no block at all."""
    q, k, v = qkv()  # 40 queries
    blocks = []
    original = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda x, *a, **kw: blocks.append(x.shape[2]) or original(x, *a, **kw))
    _, fused = lazy_attention(q, k, v, is_causal=True)
    assert blocks == []
    _, blockwise = lazy_attention(q, k, v, is_causal=True, fused=False, block_bytes=4 * 2 * 6 * 40 * 7)
    assert blocks == [7, 7, 7, 7, 7, 5]
    torch.testing.assert_close(blockwise.lse, fused.lse, **FP32)


def test_fused_entropy_falls_back_for_an_additive_bias(monkeypatch):
    """The keys-as-values identity needs a mask of 0 or hidden; a bias takes the exact blockwise path."""
    q, k, v = qkv()
    mask = alibi(q.shape[1], q.shape[2])
    _, lazy = lazy_attention(q, k, v, mask=mask)
    calls = []
    original = lazy_module._blockwise_stats
    monkeypatch.setattr(lazy_module, "_blockwise_stats", lambda *a, **kw: calls.append(kw) or original(*a, **kw))
    lazy.entropy()
    assert calls == [{"entropy": True}]


def test_the_entropy_asked_for_up_front_comes_from_the_same_kernel_call(monkeypatch):
    """entropy=True: one call of the CPU kernel gives z, the lse and the row entropy (the keys join
    the values), the same numbers as the two calls it replaces; none is made when it is read."""
    q, k, v = qkv()  # grouped: 6 query heads, 2 key/value heads
    b, h, t, _ = q.shape
    calls = []
    original = lazy_module._cpu_flash
    monkeypatch.setattr(lazy_module, "_cpu_flash", lambda *a: calls.append(a[2].shape[-1]) or original(*a))
    for mask_kind in ("causal", "padded bool"):
        mask, is_causal, _ = MASKS[mask_kind](b, h, t)
        calls.clear()
        z_two, two = lazy_attention(q, k, v, mask=mask, is_causal=is_causal)
        entropy_two = two.entropy()
        assert calls == [v.shape[-1], k.shape[-1]]  # z, then the keys as values
        calls.clear()
        z_one, one = lazy_attention(q, k, v, mask=mask, is_causal=is_causal, entropy=True)
        entropy_one = one.entropy()
        assert calls == [v.shape[-1] + k.shape[-1]]  # one call, the values widened by the keys
        torch.testing.assert_close(z_one, z_two, **FP32)
        torch.testing.assert_close(one.lse, two.lse, **FP32)
        torch.testing.assert_close(entropy_one, entropy_two, **FP32)
    calls.clear()
    _, biased = lazy_attention(q, k, v, mask=alibi(h, t), entropy=True)  # a bias: not 0-or-hidden, computed when read
    assert calls == [v.shape[-1]] and biased._entropy is None


def test_analyze_asks_for_the_entropy_only_where_uniform_reads_it(planted, monkeypatch):
    """Each layer of the text probe (uniform's) makes one kernel call, the entropy in it; the
    repeated probe's layers compute none."""
    widths = []
    original = lazy_module._cpu_flash
    monkeypatch.setattr(lazy_module, "_cpu_flash", lambda *a: widths.append(a[2].shape[-1]) or original(*a))
    analyze(planted, detectors=["uniform", "induction"], probes=[TextProbe(4, 24), RepeatedProbe(4, 6, 3)],
            explorer_examples=0, control=None, ov=False)
    d_head = head_sizes(planted.model.config)[3]
    layers = planted.n_layers
    assert widths == [2 * d_head] * layers + [d_head] * layers  # text: z and the keys together; repeated: z


def _lazy_detectors(causal):
    return [d for d in detectors.REGISTRY.values() if d.lazy and not (causal and d.bidirectional_only)]


@pytest.mark.parametrize("family", ODD_FAMILIES)
@torch.no_grad()
def test_every_lazy_detector_scores_a_model_as_on_its_maps(family):
    """Inside each tiny model (GQA, rotary, fused qkv, padding): per-example scores of every
    lazy detector from the LazyPattern equal those from the full pattern."""
    model = tiny_model(family)
    x = tiny_inputs(batch=3, length=23)
    ids = x["input_ids"].clone()
    ids[:, 12:] = ids[:, 1:12]  # a repeat, so the copy detectors have targets
    x["input_ids"] = ids
    causal = family != "bert"
    batch = ProbeBatch(ids, x["attention_mask"].bool(), causal, 1)
    dets = _lazy_detectors(causal)
    reduce = lambda layer, pattern, mask: {d.name: d.score(pattern, batch) for d in dets}
    with headscope.capture(model, reduce=reduce) as maps:
        model(**x)
    with headscope.capture(model, reduce=reduce, lazy=True) as lazy:
        model(**x)
    for layer, results in maps.results.items():
        for name, ref in results[0].items():
            torch.testing.assert_close(lazy.results[layer][0][name], ref, atol=1e-5, rtol=0, equal_nan=True)
            assert not ref.isnan().all()


def test_lazy_capture_needs_a_reducer():
    model = tiny_model("gpt2")
    with pytest.raises(headscope.HeadscopeError, match="lazy=True needs a reducer"):
        with headscope.capture(model, lazy=True):
            pass


def test_entropy_in_the_call_needs_the_lazy_path():
    model = tiny_model("gpt2")
    with pytest.raises(headscope.HeadscopeError, match="entropy=True .* needs lazy=True"):
        with headscope.capture(model, reduce=lambda layer, pattern, mask: None, entropy=True):
            pass


def test_analyze_lazy_equals_maps_and_computes_no_map(planted, monkeypatch):
    names = [d.name for d in _lazy_detectors(causal=True)]
    small = dict(detectors=names, probes=[TextProbe(8, 40), RepeatedProbe(8, 10, 4)], explorer_examples=0)
    maps = analyze(planted, lazy=False, **small)

    def no_map(*args, **kwargs):
        raise AssertionError("the lazy path computed a map")

    monkeypatch.setattr("headscope.hf.route.attention", no_map)
    lazy = analyze(planted, **small)
    torch.testing.assert_close(torch.tensor(lazy.scores.score.values), torch.tensor(maps.scores.score.values), atol=1e-5, rtol=0)
    for column in ("ci_low", "ci_high"):
        torch.testing.assert_close(torch.tensor(lazy.scores[column].values), torch.tensor(maps.scores[column].values),
                                   atol=1e-5, rtol=0)
    assert lazy.labels.label.tolist() == maps.labels.label.tolist()
    assert {p["patterns"] for p in lazy.meta["probes"].values()} == {"lazy"}
    assert {p["patterns"] for p in maps.meta["probes"].values()} == {"maps"}
    assert (lazy.labels.label != "none").sum() >= 6  # the planted heads are found on this path too
    assert {p["lse"] for p in lazy.meta["probes"].values()} == {"cpu-flash"}
    assert not any("lse" in p for p in maps.meta["probes"].values())


def test_the_kernel_is_chosen_per_device(monkeypatch):
    assert lazy_module.lse_kernel("cpu") == "cpu-flash"
    assert lazy_module.lse_kernel("cpu", softcap=30.0) == "blockwise"  # aten's CPU kernel has no soft-cap
    assert lazy_module.lse_kernel("cpu", fused=False) == "blockwise"
    monkeypatch.setattr(lazy_module, "flex_available", lambda device: True)  # what CUDA with Triton reports
    assert lazy_module.lse_kernel("cuda", softcap=30.0) == "flex"
    assert lazy_module.lse_kernel("cuda", fused=False) == "blockwise"
    with pytest.raises(ValueError, match="unknown kernel"):
        lazy_attention(*qkv(), kernel="bogus")


def test_analyze_on_the_flex_kernel_equals_maps_and_says_so(planted, monkeypatch):
    """The path CUDA takes (FlexAttention; here uncompiled on the CPU) through a whole analysis:
    the maps path's scores, and meta names the kernel."""
    names = [d.name for d in _lazy_detectors(causal=True)]
    small = dict(detectors=names, probes=[TextProbe(8, 40), RepeatedProbe(8, 10, 4)], explorer_examples=0)
    maps = analyze(planted, lazy=False, **small)
    monkeypatch.setattr(lazy_module, "lse_kernel", lambda device, softcap=None, fused=True: "flex")
    flex = analyze(planted, **small)
    torch.testing.assert_close(torch.tensor(flex.scores.score.values), torch.tensor(maps.scores.score.values),
                               atol=1e-5, rtol=0)
    assert flex.labels.label.tolist() == maps.labels.label.tolist()
    assert {p["lse"] for p in flex.meta["probes"].values()} == {"flex"}


def test_bf16_entries_stay_within_bf16_rounding(path):
    """In bf16 the kernel's log-sum-exp comes from bf16 products; entries and entropy must still
    match the explicit path (fp32 softmax of the same bf16 q, k) to bf16's resolution."""
    q, k, v = (x.to(torch.bfloat16) for x in qkv())
    z, lazy = lazy_attention(q, k, v, is_causal=True, **path)
    _, pattern = attention(q, k, v, is_causal=True, need_pattern=True)
    # The kernel's fp32 lse from bf16 products differs from an fp32 softmax by accumulation order
    # only (measured 5e-5 on the entries, 6e-7 on the entropy); 1e-3 is far below bf16's own 4e-3.
    bf16 = dict(atol=1e-3, rtol=0)
    torch.testing.assert_close(lazy.diagonal(-1), pattern.diagonal(offset=-1, dim1=-2, dim2=-1), **bf16)
    torch.testing.assert_close(lazy.column(0), pattern[..., 0], **bf16)
    torch.testing.assert_close(lazy.entropy(), -torch.special.xlogy(pattern, pattern).sum(-1), **bf16)
