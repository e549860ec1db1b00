"""The compiled FlexAttention kernel is compiled a bounded number of times: new lengths and batch
sizes reuse a kernel with dynamic shapes instead of recompiling until torch gives up and runs the
scores densely. On the CPU, where inductor has no log-sum-exp output, torch.compile's backend is
one that counts the graphs it is handed and runs them as traced; dynamo's guards and
recompilations are the same whatever backend compiles the graphs."""
import pytest
import torch

from headscope.attention import flex
from headscope.errors import HeadscopeError
from headscope.attention import lazy as lazy_module
from headscope.attention.lazy import lazy_attention


@pytest.fixture
def compiled_graphs(monkeypatch):
    """The graphs torch.compile hands its backend; the lazy path takes the compiled kernel here."""
    graphs = []

    def counting(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    monkeypatch.setattr(flex, "_BACKEND", counting)
    monkeypatch.setattr(lazy_module, "flex_available", lambda device: True)
    flex._compiled_flex.cache_clear()
    yield graphs
    flex._compiled_flex.cache_clear()
    torch._dynamo.reset()


def _batches(generator, lengths, batch_sizes, n_heads=4, n_kv=2, d=16):
    for n_tokens in lengths:
        for batch in batch_sizes:
            q = torch.randn(batch, n_heads, n_tokens, d, generator=generator)
            k, v = (torch.randn(batch, n_kv, n_tokens, d, generator=generator) for _ in range(2))
            yield q, k, v


def test_new_lengths_and_batch_sizes_reuse_the_compiled_kernel(compiled_graphs):
    # Twelve lengths (one key block and several) and three batch sizes, as a treebank's batches
    # give: kernels compiled for fixed shapes would pass torch's 8 recompilations in the first probe.
    lengths = (40, 56, 64, 72, 96, 104, 130, 136, 160, 200, 256, 300)
    for q, k, v in _batches(torch.Generator().manual_seed(0), lengths, (2, 1, 3)):
        z, lse = flex.flex_stats(q, k, v, None, True, 0.25)
        z_ref, lse_ref = flex.flex_stats(q, k, v, None, True, 0.25, compiled=False)
        torch.testing.assert_close(z, z_ref)
        torch.testing.assert_close(lse, lse_ref)
    graphs = len(compiled_graphs)
    # The first shape, then kernels dynamic in the sizes; a batch of one and a single key block
    # apart (torch specialises sizes of one): 7 on torch 2.13, for 36 shapes.
    assert graphs <= 12
    for q, k, v in _batches(torch.Generator().manual_seed(1), (48, 88, 144, 280, 320), (1, 2, 5)):
        flex.flex_stats(q, k, v, None, True, 0.25)
    assert len(compiled_graphs) == graphs  # nothing new compiles


def test_an_analysis_in_bf16_with_its_fp32_entropy_stays_within_the_limit(compiled_graphs):
    """z in the model's dtype, the entropy's fp32 pass, padded and unpadded batches of many
    lengths: within `RECOMPILE_LIMIT`, past torch's default of 8, every call compiled."""
    generator = torch.Generator().manual_seed(2)
    for q, k, v in _batches(generator, (24, 40, 64, 100, 136, 180, 250), (3, 1)):
        batch, _, n_tokens, _ = q.shape
        mask = torch.zeros(batch, 1, n_tokens, n_tokens)
        mask[-1, ..., : n_tokens // 3] = torch.finfo(mask.dtype).min  # the last sequence left-padded
        mask = mask + torch.full((n_tokens, n_tokens), torch.finfo(mask.dtype).min).triu(1)
        for padded in (mask, None):
            bf16 = [x.to(torch.bfloat16) for x in (q, k, v)]
            _, lazy = lazy_attention(*bf16, mask=None if padded is None else padded.to(torch.bfloat16),
                                     is_causal=padded is None, kernel="flex")
            lazy.entropy()
    assert 8 < len(compiled_graphs) <= flex.RECOMPILE_LIMIT  # 20 on torch 2.13


def test_past_the_limit_a_call_raises_instead_of_running_densely(compiled_graphs, monkeypatch):
    monkeypatch.setattr(flex, "RECOMPILE_LIMIT", 1)
    generator = torch.Generator().manual_seed(3)
    q, k, v = next(_batches(generator, (40,), (2,)))
    with torch._dynamo.config.patch(recompile_limit=1):
        flex.flex_stats(q, k, v, None, True, 0.25)
        with pytest.raises(HeadscopeError, match="compiled 1 times"):
            flex.flex_stats(q[:1], k[:1], v[:1], None, True, 0.25)
    assert len(compiled_graphs) == 1


def test_heads_narrower_than_the_kernels_tiles_take_the_blockwise_path(compiled_graphs):
    """DeepSeek-V3's shape at tiny sizes (queries and keys of 24 dims, values of 12): the compiled
    kernel needs 16 at least, so the blockwise path runs, with the same entries."""
    generator = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 4, 30, 24, generator=generator), torch.randn(2, 4, 30, 24, generator=generator)
    v = torch.randn(2, 4, 30, 12, generator=generator)
    z, lazy = lazy_attention(q, k, v, is_causal=True, kernel="flex")
    z_ref, reference = lazy_attention(q, k, v, is_causal=True, kernel="blockwise")
    assert lazy.kernel == "blockwise" and not compiled_graphs
    torch.testing.assert_close(z, z_ref)
    torch.testing.assert_close(lazy.entropy(), reference.entropy())
