"""Recent flagship families beyond the family matrix (tests/support/tiny.py): weights large enough
for each part of their attention to matter, verify against the model's eager attention at the
matrix's tolerances, and a mutation per feature: the adapter read without it fails verify by far."""
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

import headscope
from headscope.hf import adapters
from headscope.hf.adapters import adapter_for, attention_blocks
from tests.support.tiny import HYBRID_ATTENTION, tiny_config, tiny_inputs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _model(family, kind, seed=0, init=0.3, **extra):
    """The family's tiny config of `kind` with `extra` set and weights of std `init`; norm weights
    drawn off their init (1, or 0 where the norm multiplies by 1 + weight) so a skipped norm shows."""
    config = tiny_config(family, kind=kind)
    for name, value in dict(initializer_range=init, **extra).items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.add_(torch.randn(param.shape, generator=generator) * 0.5)
    return model


def _verified(model, x=None):
    table = headscope.verify(model, tiny_inputs() if x is None else x)
    return table.max_abs_diff_output.max(), table.max_abs_diff_pattern.max()


def _without(monkeypatch, model, **change):
    """The model's adapter replaced in ADAPTERS by a copy with `change`."""
    adapter = adapter_for(model.config)
    wrong = dataclasses.replace(adapter, **change)
    monkeypatch.setattr(adapters, "ADAPTERS", tuple(wrong if a is adapter else a for a in adapters.ADAPTERS))


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text"])
@torch.no_grad()
def test_qwen3_5s_gated_attention_verifies_and_needs_its_gate(family, monkeypatch):
    model = _model(family, "hybrid")
    output, pattern = _verified(model)
    assert output <= 1e-4 and pattern <= 1e-5
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert mine.output_gate and mine.qk_norm and mine.rotary_dim == 4  # head_dim 16 * partial_rotary_factor 0.25
    _without(monkeypatch, model, output_gate=False)
    assert _verified(model)[0] > 1e-2  # the same pattern, an output without the gate far off


@torch.no_grad()
def test_kimi_linears_latent_attention_verifies_with_its_shared_key_unrotated(monkeypatch):
    """Multi-head latent attention without rotary: from_hf gives rotary_dim 0, the shared key part
    joins every head's key unrotated; rotating it (a rotary read into the adapter) fails verify."""
    model = _model("kimi_linear", "hybrid")
    x = tiny_inputs(length=13)
    output, pattern = _verified(model, x)
    assert output <= 1e-5 and pattern <= 1e-5
    assert [l for l, _ in attention_blocks(model)] == list(HYBRID_ATTENTION["kimi_linear"])
    mine = headscope.MultiHeadAttention.from_hf(attention_blocks(model)[0][1], model.config).config
    assert (mine.d_head, mine.d_value, mine.rotary_dim, mine.latent.d_rope) == (24, 12, 0, 8)
    _without(monkeypatch, model, rotary=adapters.Rotary())
    assert _verified(model, x)[1] > 1e-3
