"""`headscope.geometry` on hybrids (attention in some layers only, tests/support/tiny.py kind
"hybrid"): every table holds the attention layers under the model's own numbers, and each number
equals what the dense computation gives on the same heads, recomputed here from captured
patterns and from the layer's own module; the tables round-trip through their CSV folder; the
report and `headscope geometry` work on a hybrid (zamba2 with per-layer LoRA too); a model without an
adapter is refused."""
import numpy as np
import pytest
import torch

import headscope
from headscope.attention import MultiHeadAttention
from headscope.hf.adapters import adapter_for, attention_blocks
from headscope.head_geometry.importance import head_importance, probe_loss
from headscope.head_geometry.run import attention_modules, write_geometry
from headscope.head_geometry.similarity import DivergenceAccumulator, row_js
from headscope.head_geometry.subspaces import head_bases, subspace_tables
from headscope.head_geometry.geometry_result import read_geometry_tables
from headscope.loading.loader import Loaded
from headscope.probes.base import text_probe
from tests.support.planted import char_tokenizer
from tests.support.tiny import HYBRID_ATTENTION, HYBRID_FAMILIES, tiny_config, tiny_model, zamba2_with_lora

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = [f for f in HYBRID_FAMILIES if adapter_for(tiny_config(f, "hybrid")) is not None]  # all of them adapted
PROBE = dict(n_examples=3, seq_len=16)
BATCH = 2


def hybrid(family) -> Loaded:
    return Loaded.from_model(tiny_model(family, kind="hybrid"), char_tokenizer(), f"tiny-{family}")


@pytest.fixture(scope="module", params=FAMILIES)
def measured(request):
    loaded = hybrid(request.param)
    result = headscope.geometry(loaded, batch_size=BATCH, pruning_steps=4, seeds=(0,), **PROBE)
    return request.param, loaded, result


def captured_patterns(loaded):
    """Per batch of the geometry's probe: ({layer: pattern (B, H, Tq, Tk)}, allowed (B, Tq, Tk))."""
    probe = text_probe(loaded.tokenizer, PROBE["n_examples"], PROBE["seq_len"])
    out = []
    for batch in probe.batches(BATCH, loaded.causal, loaded.device):
        with torch.no_grad(), headscope.capture(loaded.model) as cap:
            loaded.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long())
        out.append(({layer: p.clone() for layer, p in cap.patterns.items()}, batch.key_allowed()))
    return out


def test_the_tables_hold_exactly_the_attention_layers(measured):
    family, loaded, result = measured
    layers = HYBRID_ATTENTION[family]
    n = len(layers) * loaded.n_heads
    assert result.layers == layers and result.shape == (len(layers), loaded.n_heads)
    assert list(zip(result.heads.layer, result.heads["head"])) == [(l, h) for l in layers for h in range(4)]
    assert tuple(sorted(set(result.pairs.layer))) == layers and len(result.pairs) == len(layers) * 6
    assert result.divergence.shape == (n, n)
    assert result.heads.importance.notna().all() and result.heads.importance_normalized.notna().all()
    assert sorted(set(result.curve.removed)) == [round(i * n / 4) for i in range(5)]  # attention heads only


@torch.no_grad()
def test_the_divergence_is_the_dense_computation_on_the_same_heads(measured):
    """Within a layer: the mean row JS of two heads' captured patterns (row_js over the rows that
    see at least two keys, renormalised); the whole matrix: a dense accumulator fed the same
    patterns as layers 0, 1."""
    family, loaded, result = measured
    layers = HYBRID_ATTENTION[family]
    batches = captured_patterns(loaded)
    dense = DivergenceAccumulator(len(layers), loaded.n_heads, result.settings["top_k"])
    sums = {layer: torch.zeros(4, 4, dtype=torch.float64) for layer in layers}
    rows = 0
    for patterns, allowed in batches:
        assert tuple(sorted(patterns)) == layers
        counted = allowed.sum(-1) >= 2  # (B, Tq)
        for i, layer in enumerate(layers):
            dense.add_layer(i, patterns[layer], allowed)
            p = patterns[layer].float().masked_fill(~allowed[:, None], 0)
            p = (p / p.sum(-1, keepdim=True)).permute(1, 0, 2, 3)[:, counted]  # (H, R, Tk)
            sums[layer] += row_js(p[:, None], p[None]).sum(-1).double()  # (H, H)
        dense.end_batch()
        rows += int(counted.sum())
    for i, layer in enumerate(layers):
        block = result.divergence[i * 4:(i + 1) * 4, i * 4:(i + 1) * 4]
        assert block == pytest.approx((sums[layer] / rows).numpy(), abs=1e-6)
    assert result.divergence == pytest.approx(dense.divergence().numpy(), abs=1e-6)
    assert result.approximation_error == pytest.approx(dense.approximation_error(), abs=1e-9)
    js = result.pairs.set_index(["layer", "head_a", "head_b"]).js
    for i, layer in enumerate(layers):
        assert js[(layer, 0, 3)] == pytest.approx(result.divergence[i * 4, i * 4 + 3])


def test_a_layers_overlaps_are_those_of_its_module_alone(measured):
    family, loaded, result = measured
    for layer, block in attention_blocks(loaded.model):
        pairs, heads = subspace_tables([MultiHeadAttention.from_hf(block, loaded.model.config)])
        mine = result.pairs[result.pairs.layer == layer].reset_index(drop=True)
        columns = [c for c in pairs.columns if c != "layer"]
        assert mine[columns].equals(pairs[columns])
        ranks = result.heads[result.heads.layer == layer].reset_index(drop=True)
        assert ranks[["qk_effective_rank", "ov_effective_rank"]].equals(heads[["qk_effective_rank", "ov_effective_rank"]])


def test_importance_has_rows_for_attention_layers_only_and_pruning_ablates_them(measured):
    family, loaded, result = measured
    probe = text_probe(loaded.tokenizer, PROBE["n_examples"], PROBE["seq_len"])
    scores = head_importance(loaded, probe, BATCH)
    assert scores.shape == (len(HYBRID_ATTENTION[family]), 4)
    assert result.heads.importance.to_numpy() == pytest.approx(scores.ravel(), rel=1e-6)
    everything = [(l, h) for l in HYBRID_ATTENTION[family] for h in range(4)]
    last = result.curve[(result.curve.order == "importance") & (result.curve.removed == len(everything))].loss.iloc[0]
    assert last == pytest.approx(probe_loss(loaded, probe, BATCH, everything), rel=1e-6)


def test_the_folder_reads_back_to_the_same_result(measured, tmp_path):
    family, loaded, result = measured
    written = write_geometry(result, tmp_path)
    assert (tmp_path / "geometry.html").stat().st_size > 0 and len(written) == 6
    back = read_geometry_tables(tmp_path)
    assert back.layers == result.layers
    assert back.divergence == pytest.approx(result.divergence, abs=1e-12)
    assert back.heads.equals(result.heads)
    import pandas as pd

    similarity = pd.read_csv(tmp_path / "similarity.csv")
    assert set(similarity.layer_a) | set(similarity.layer_b) == set(HYBRID_ATTENTION[family])


def test_the_accumulator_numbers_heads_by_their_layers_position_and_needs_every_layer():
    pattern = torch.rand(1, 2, 4, 4).tril()  # (B, H, Tq, Tk)
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()[None]
    acc = DivergenceAccumulator((1, 3), 2, top_k=4)
    acc.add_layer(3, pattern.flip(1), allowed)
    acc.add_layer(1, pattern, allowed)
    acc.end_batch()
    js = acc.divergence().numpy()  # layer 1's heads are 0, 1; layer 3's 2, 3 (3's head 0 is 1's head 1)
    assert js.shape == (4, 4) and js[1, 2] == pytest.approx(0, abs=1e-6) and js[0, 3] == pytest.approx(0, abs=1e-6)
    with pytest.raises(headscope.HeadscopeError, match="layer 2 is not one of the accumulator's layers 1, 3"):
        acc.add_layer(2, pattern, allowed)
    acc.add_layer(1, pattern, allowed)
    with pytest.raises(headscope.HeadscopeError, match="layers 3 gave no pattern in this batch"):
        acc.end_batch()


def test_zamba2s_layers_share_a_block_but_each_has_its_own_loras_subspaces():
    """With per-layer LoRA on q, k, v (tests/support/tiny.py's `zamba2_with_lora`), each layer's
    overlaps and ranks are those of its own module (the shared weights plus its LoRA), q, k, v bases live in the
    2 * hidden input, and the chance column is the mean over roles of d_head over their widths."""
    loaded = Loaded.from_model(zamba2_with_lora(), char_tokenizer(), "tiny-zamba2-lora")
    result = headscope.geometry(loaded, batch_size=BATCH, pruning_steps=2, seeds=(0,), **PROBE)
    assert result.layers == (1, 3)
    modules = dict(attention_modules(loaded.model))
    assert (modules[1].W_q.weight - modules[3].W_q.weight).abs().max() > 0.1
    for layer, module in modules.items():
        pairs, heads = subspace_tables([module])
        mine = result.pairs[result.pairs.layer == layer].reset_index(drop=True)
        columns = [c for c in pairs.columns if c != "layer"]
        assert mine[columns].equals(pairs[columns])
        assert head_bases(module)["q"][0].shape[0] == 128 and head_bases(module)["o"][0].shape[0] == 64
    assert result.pairs.chance.to_numpy() == pytest.approx(np.full(12, (3 * 32 / 128 + 32 / 64) / 4))
    ones = result.heads[result.heads.layer == 1].qk_effective_rank.to_numpy()
    threes = result.heads[result.heads.layer == 3].qk_effective_rank.to_numpy()
    assert np.abs(ones - threes).max() > 1e-3  # the layers' own LoRA, not the shared block's weights alone


def test_a_model_without_an_adapter_is_refused_in_one_line():
    import transformers as tf

    config = tf.AutoConfig.for_model("jetmoe", vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, kv_channels=16, intermediate_size=48, num_local_experts=4,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    loaded = Loaded.from_model(tf.AutoModelForCausalLM.from_config(config).eval(), char_tokenizer(), "tiny-jetmoe")
    with pytest.raises(headscope.HeadscopeError, match="'jetmoe' has no headscope adapter") as err:
        headscope.geometry(loaded, **PROBE)
    assert "\n" not in str(err.value)
