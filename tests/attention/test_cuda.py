"""The lazy path on a CUDA GPU: FlexAttention compiled by Triton gives the full maps' entries in
fp32 (1e-5) and stays within the documented bound in bf16; headscope's kernel inside a model in
bf16 gives the model's own output. Skipped without a GPU (benchmarks/gpu.sh runs them on one).

Bounds (docs/gpu.md): fp32 entries, z and entropy 1e-5 as on the CPU; bf16 entries and entropy
1e-3 (the softmax statistics are fp32, the products bf16), in bf16 a model's outputs as
far from its float32 outputs as the model's own bf16 attention is, plus 3e-2 (Gemma 2's logits
reach 24, where bf16 values lie 0.125 apart: two bf16 runs differ by more than any fixed bound).
"""
import copy

import pytest
import torch

import headscope
from headscope.attention.kernel import attention
from headscope.attention.lazy import lazy_attention, lse_kernel
from tests.support.attention_cases import EXTRAS, MASKS, assert_lazy_is_the_pattern, qkv
from tests.support.tiny import tiny_inputs, tiny_model, output_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _every_expert(model):
    """The model with every token routed to every expert (gpt_oss's top-k router). Top-k routing
    is a step in its logits: on the tiny gpt_oss, noise of one bf16 spacing in the attention
    outputs moves the logits by up to 0.087 (a token sent to another expert), against 0.005 with
    every expert taken, whatever attention kernel ran."""
    for module in model.modules():
        if hasattr(module, "top_k") and hasattr(module, "num_experts"):
            module.top_k = module.num_experts
    return model


def _to_cuda(*tensors, dtype=None):
    return [t if t is None else t.to("cuda", dtype or t.dtype) for t in tensors]


def test_cuda_takes_the_flex_kernel():
    assert lse_kernel("cuda") == "flex" and lse_kernel("cuda", softcap=30.0) == "flex"


@pytest.mark.parametrize("extra", ["none", *EXTRAS])
@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_flex_entries_equal_the_full_pattern_in_fp32(mask_kind, extra):
    q, k, v = _to_cuda(*qkv())
    b, h, t, _ = q.shape
    mask, is_causal, rows = MASKS[mask_kind](b, h, t)
    mask, rows = _to_cuda(mask, rows)
    extras = {name: value.cuda() if torch.is_tensor(value) else value for name, value in EXTRAS.get(extra, {}).items()}
    z, lazy = lazy_attention(q, k, v, mask=mask, is_causal=is_causal, **extras)
    assert lazy.kernel == "flex"
    z_ref, pattern = attention(q, k, v, mask=mask, is_causal=is_causal, need_pattern=True, **extras)
    assert_lazy_is_the_pattern(z, lazy, z_ref, pattern, rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flex_entries_in_half_precision_stay_within_the_bound(dtype):
    q, k, v = _to_cuda(*qkv(), dtype=dtype)
    z, lazy = lazy_attention(q, k, v, is_causal=True)
    _, pattern = attention(q, k, v, is_causal=True, need_pattern=True)  # fp32 softmax of the same q, k
    assert lazy.lse.dtype == torch.float32
    half = dict(atol=1e-3, rtol=0)
    torch.testing.assert_close(lazy.diagonal(-1), pattern.diagonal(offset=-1, dim1=-2, dim2=-1), **half)
    torch.testing.assert_close(lazy.column(0), pattern[..., 0], **half)
    torch.testing.assert_close(lazy.entropy(), -torch.special.xlogy(pattern, pattern).sum(-1), **half)


@pytest.mark.parametrize("family", ["llama", "gemma2", "mistral", "gpt_oss", "t5", "bert", "deepseek_v3"])
@torch.no_grad()
def test_headscope_inside_a_model_in_bf16_on_cuda(family):
    """Capture (maps) and the lazy path inside a tiny model in bf16 on the GPU: the model's own
    output within the bf16 bound (deepseek_v3: q/k heads of 24 dims, values of 12)."""
    model = _every_expert(copy.deepcopy(tiny_model(family, kind="interface"))).to("cuda")
    x = {name: value.cuda() for name, value in tiny_inputs().items()}
    valid = x["attention_mask"].bool()
    exact = output_of(model(**x)).float()  # float32: what each bf16 run is measured against
    model.to(torch.bfloat16)
    before = output_of(model(**x)).float()
    with headscope.capture(model):
        captured = output_of(model(**x)).float()
    with headscope.capture(model, reduce=lambda layer, pattern, mask: pattern.diagonal(-1).sum(), lazy=True) as lazy:
        lazy_out = output_of(model(**x)).float()
    own = (before - exact).abs()[valid].max()
    assert (captured - exact).abs()[valid].max() <= own + 3e-2
    assert (lazy_out - exact).abs()[valid].max() <= own + 3e-2
    # deepseek_v3's values are 12 wide, under the compiled kernel's 16: the blockwise path runs.
    kernel = "lse:blockwise" if family == "deepseek_v3" else "lse:flex"
    assert all(kernel in extras for extras in lazy.extras.values())


@torch.no_grad()
def test_flex_compiles_once_for_many_lengths_and_batch_sizes():
    """Batches of several lengths and sizes in bf16, with the entropy's fp32 pass: every call runs
    the compiled kernel (past the compile limit a call raises instead of running densely), and the
    entries stay within the bf16 bound of the full pattern."""
    generator = torch.Generator().manual_seed(5)
    for n_tokens in (40, 300, 520):
        for batch in (2, 1):
            q = torch.randn(batch, 4, n_tokens, 16, generator=generator)
            k, v = (torch.randn(batch, 2, n_tokens, 16, generator=generator) for _ in range(2))
            q, k, v = _to_cuda(q, k, v, dtype=torch.bfloat16)
            _, lazy = lazy_attention(q, k, v, is_causal=True)
            _, pattern = attention(q, k, v, is_causal=True, need_pattern=True)
            half = dict(atol=1e-3, rtol=0)
            torch.testing.assert_close(lazy.diagonal(-1), pattern.diagonal(offset=-1, dim1=-2, dim2=-1), **half)
            torch.testing.assert_close(lazy.entropy(), -torch.special.xlogy(pattern, pattern).sum(-1), **half)
