"""Every family on transformers' attention interface, as tiny random-init models
(tests/support/tiny.py, kind="interface"): headscope inside the model changes nothing, its patterns are the model's eager ones, the lazy and
head-group paths score as the maps do, ablation acts and restores, and from_hf/verify agree with
the model wherever the family table says they are available."""
import dataclasses
from pathlib import Path

import pytest
import torch

import headscope
from headscope import detectors
import headscope.attention.lazy as lazy_module
from headscope.attention import MultiHeadAttention
from headscope.hf import route
from headscope.hf.adapters import adapter_for, attention_blocks, core_modules, discovered_cores
from headscope.hf.families import OTHER, OUTSIDE_INTERFACE, family_markdown, family_table
from headscope.hf.from_hf import rotary_tables
from headscope.hf.verify import _named_inputs
from headscope.probes.base import ProbeBatch
from tests.support.tiny import (COMPOSITE_FAMILIES, ENCODER_DECODER_FAMILIES, ENCODERS, HYBRID_FAMILIES,
                                INTERFACE_FAMILIES, TEXT_DECODERS, VERIFIED_COMPOSITES, tiny_config, tiny_inputs, tiny_model, output_of)
from tests.support.contracts import assert_hook_contract, head_zeroed_at, run_under, with_adapter_changed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VERIFIED = [f for f in INTERFACE_FAMILIES if not adapter_for(tiny_config(f, kind="interface")).no_from_hf]


def _eager_patterns(model, x):
    """The model's eager attention weights by layer; where they leave the sink out
    (`Adapter.weights_before_sinks`: granite_swa), times each row's sink share (`_sink_shares`)."""
    default = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        weights = model(**x, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(default)
    adapter = adapter_for(model.config)
    if adapter is None or not adapter.weights_before_sinks:
        return weights
    shares = _sink_shares(model, x)
    return tuple(w * shares[layer] for layer, w in enumerate(weights))


def _sink_shares(model, x):
    """{layer: [B, H, T, 1]} the share of each query's attention that a sink logit s_h in the softmax
    leaves the keys, sum_j e^(l_j) / (sum_j e^(l_j) + e^(s_h)) = sigmoid(logsumexp(l) - s_h), written out
    here from the scores l = q k^T * scaling + mask of the q, k and eager mask each core hands its
    attention function and the core's own `sinks` (the model's eager output is then run as it is)."""
    import sys
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    seen = {}

    def record(module, query, key, value, attention_mask, scaling=None, **kwargs):
        key_h = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)  # (B, H, S, D)
        scores = query.float() @ key_h.float().transpose(-1, -2) * scaling + attention_mask.float()  # (B, H, T, S)
        seen[id(module)] = torch.sigmoid(torch.logsumexp(scores, -1, keepdim=True) - module.sinks.view(1, -1, 1, 1))
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register("headscope-test-sinks", record)
    AttentionMaskInterface.register("headscope-test-sinks", eager_mask)
    run_under(model, x, "headscope-test-sinks")
    return {layer: seen[id(core)] for layer, core in core_modules(model)}


@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
@torch.no_grad()
def test_capture_keeps_outputs_and_patterns_match_eager(family):
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    valid = x["attention_mask"].bool()  # (B, T): padded positions carry no meaning
    default = model.config._attn_implementation
    before = output_of(model(**x))
    with headscope.capture(model) as cap:
        captured = output_of(model(**x))
    assert model.config._attn_implementation == default  # eager for gemma2 and gpt_oss, sdpa elsewhere
    assert (before - captured).abs()[valid].max() <= 1e-4
    eager = _eager_patterns(model, x)
    assert len(cap.patterns) == len(eager) == 2
    for layer, theirs in enumerate(eager):
        mine = cap.patterns[layer]
        assert mine.shape == theirs.shape == (2, 4, 11, 11)
        assert (mine - theirs).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5  # real query rows


def _lazy_detectors(causal):
    return [d for d in detectors.REGISTRY.values() if d.lazy and not (causal and d.bidirectional_only)]


@pytest.mark.parametrize("kernel", ["default", "flex"])
@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
@torch.no_grad()
def test_lazy_and_head_groups_score_as_the_maps(family, kernel, monkeypatch):
    """analyze's two other paths: the LazyPattern and head groups of 2. The LazyPattern from the
    CPU's kernel (fused, or query blocks for soft-capped scores) and from FlexAttention, the
    kernel CUDA takes (run here uncompiled): soft-caps, sinks, sliding windows and position
    biases all go through its score_mod and masks."""
    if kernel == "flex":
        monkeypatch.setattr(lazy_module, "lse_kernel", lambda device, softcap=None, fused=True: "flex")
    model = tiny_model(family, kind="interface")
    x = tiny_inputs(length=17)
    ids = x["input_ids"].clone()
    ids[:, 9:] = ids[:, 1:9]  # a repeat, so the copy detectors have targets
    x["input_ids"] = ids
    causal = family not in ENCODERS
    batch = ProbeBatch(ids, x["attention_mask"].bool(), causal, 1)
    dets = _lazy_detectors(causal)
    reduce = lambda layer, pattern, mask: {d.name: d.score(pattern, batch) for d in dets}  # {name: (B, H)}
    with headscope.capture(model, reduce=reduce) as maps:
        whole = output_of(model(**x))
    with headscope.capture(model, reduce=reduce, lazy=True) as lazy:
        lazy_out = output_of(model(**x))
    with headscope.capture(model, reduce=reduce, chunk_heads=2) as groups:
        group_out = output_of(model(**x))
    valid = x["attention_mask"].bool()
    assert (whole - lazy_out).abs()[valid].max() <= 1e-4
    assert (whole - group_out).abs()[valid].max() <= 1e-5
    if kernel == "flex":
        assert all("lse:flex" in lazy.extras[layer] for layer in maps.results)
    for layer, results in maps.results.items():
        for name, ref in results[0].items():
            assert not ref.isnan().all()
            torch.testing.assert_close(lazy.results[layer][0][name], ref, atol=1e-5, rtol=0, equal_nan=True)
            torch.testing.assert_close(groups.results[layer][0][name], ref, atol=1e-5, rtol=0, equal_nan=True)


@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
@torch.no_grad()
def test_ablate_changes_the_output_and_restores_it(family):
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    default = model.config._attn_implementation
    before = output_of(model(**x))
    with headscope.ablate(model, heads=[(0, 1), (1, 2)]):
        ablated = output_of(model(**x))
    assert (ablated - before).abs().max() > 1e-3
    assert torch.equal(before, output_of(model(**x)))
    assert model.config._attn_implementation == default
    assert not route.routed_models()


@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
@torch.no_grad()
def test_ablation_is_zeroing_the_heads_slice_of_the_output_projections_input(family):
    """The reference, independent of headscope's kernel: a pre-hook on the adapter's output
    projection zeroes head h's slice of its input. Where a norm mixes the heads before it
    (bitnet's attn_sub_norm), zeroing at the attention function's output would differ."""
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    layer, head = 1, 2
    n_heads = model.config.num_attention_heads if hasattr(model.config, "num_attention_heads") else 4
    out = dict(attention_blocks(model))[layer].get_submodule(adapter_for(model.config).out)
    before = output_of(model(**x))
    with headscope.ablate(model, heads=[(layer, head)]):
        ablated = output_of(model(**x))

    with head_zeroed_at(out, head, n_heads):
        reference = output_of(model(**x))
    assert (ablated - before).abs().max() > 1e-3
    assert (ablated - reference).abs().max() <= 1e-4
    assert torch.equal(before, output_of(model(**x)))
    assert not route.routed_models()


@torch.no_grad()
def test_bitnet_zeroing_at_the_attention_output_would_differ(monkeypatch):
    """The check above has teeth: with z edited at the attention function's output (before
    attn_sub_norm), bitnet's ablation moves away from the o_proj-input reference."""
    model = tiny_model("bitnet", kind="interface")
    x = tiny_inputs()
    with headscope.ablate(model, heads=[(1, 2)]):
        right = output_of(model(**x))
    monkeypatch.setattr(route, "z_at_out", lambda model: [])
    with headscope.ablate(model, heads=[(1, 2)]):
        wrong = output_of(model(**x))
    assert (right - wrong).abs().max() > 1e-2


def _interface_inputs(model, x):
    """What each core module hands the attention function: {id(core): (query, key)} after the
    model's own q/k norm and rotary; recorded by a registered attention function."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    seen = {}

    def record(module, query, key, value, attention_mask, **kwargs):  # then headscope's kernel (softcap, sinks)
        seen[id(module)] = (query, key)  # the mask by its name: afmoe passes it as a keyword
        return route._headscope_attention(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("headscope-test-record", record)
    AttentionMaskInterface.register("headscope-test-record", sdpa_mask)
    run_under(model, x, "headscope-test-record")
    return seen


@pytest.mark.parametrize("family", VERIFIED)
@torch.no_grad()
def test_verify_agrees_and_hook_q_k_are_what_the_model_attends_with(family):
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    table = headscope.verify(model, x)
    assert list(table.layer) == [0, 1]
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5
    # hook_q / hook_k equal the q and k the model hands its attention function (after norms, rotary).
    seen = _interface_inputs(model, x)
    received = {}
    cores = dict(core_modules(model))

    def keep(layer):
        def hook(module, args, kwargs):
            received[layer] = _named_inputs(module, args, kwargs)
        return hook

    hooks = [core.register_forward_pre_hook(keep(layer), with_kwargs=True) for layer, core in cores.items()]
    try:
        model(**x)
    finally:
        for h in hooks:
            h.remove()
    for layer, block in attention_blocks(model):
        mine = MultiHeadAttention.from_hf(block, model.config)
        got_in = received[layer]
        tables = rotary_tables(mine, model.config, got_in.get("position_embeddings"))
        got = {}
        with mine.hooks({"hook_q": lambda t, h: got.setdefault("q", t), "hook_k": lambda t, h: got.setdefault("k", t)}):
            mine(got_in["hidden_states"], rotary=tables)
        query, key = seen[id(cores[layer])]
        torch.testing.assert_close(got["q"], query, atol=1e-5, rtol=0)
        torch.testing.assert_close(got["k"], key, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family, told", [(f, False) for f in sorted(set(INTERFACE_FAMILIES) - set(VERIFIED))]
                         + [("llama", True)])
def test_from_hf_and_verify_refuse_in_one_line(family, told, monkeypatch):
    """Families whose adapter says why from_hf is not available (`no_from_hf`), and llama's adapter
    told so here (whatever rows the table refuses today)."""
    model = tiny_model(family, kind="interface")
    if told:
        with_adapter_changed(monkeypatch, model, no_from_hf="from_hf and verify are not available for llama (a "
                                                           "test's adapter); capture, ablate and analyze work")
    _, block = attention_blocks(model)[0]
    calls = (lambda: MultiHeadAttention.from_hf(block, model.config), lambda: headscope.verify(model, tiny_inputs()))
    for call in calls:
        with pytest.raises(headscope.HeadscopeError, match="not available for .*capture.* work") as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", VERIFIED)
def test_from_hf_hooks_fire_once_with_declared_shapes(family):
    """Contract test of each adapter: every hook exists and fires once with its shape."""
    assert_hook_contract(tiny_model(family, kind="interface"))


@pytest.mark.parametrize("family, what", [("gemma2", "softcap"), ("gpt_oss", "sinks")])
@torch.no_grad()
def test_a_kernel_ignoring_softcap_or_sinks_would_fail(family, what, monkeypatch):
    """The matrix's soft-capping and sinks are strong enough to matter: dropping either from the
    kernel moves outputs and patterns far past the tolerances above."""
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    valid = x["attention_mask"].bool()
    before = output_of(model(**x))
    original = route._extras

    def without(module, kwargs):
        softcap, sinks, bias = original(module, kwargs)
        return (None, sinks, bias) if what == "softcap" else (softcap, None, bias)

    monkeypatch.setattr(route, "_extras", without)
    with headscope.capture(model) as cap:
        ignored = output_of(model(**x))
    eager = _eager_patterns(model, x)
    assert (before - ignored).abs()[valid].max() > 1e-2
    assert max((cap.patterns[l] - e).abs().max() for l, e in enumerate(eager)) > 1e-2


@pytest.mark.parametrize("family, change", [("glm", dict(tables="layout")), ("ernie4_5", dict(tables="layout")),
                                            ("exaone4", dict(switch=None)), ("cohere2", dict(switch=None)),
                                            ("cohere2_moe", dict(force=None)), ("nanochat", dict(backwards=False)),
                                            ("llama4_text", dict(switch=None))])
@torch.no_grad()
def test_a_rotary_read_otherwise_would_fail_verify(family, change, monkeypatch):
    """The matrix's rotary layouts and NoPE layers matter: reading glm's and ernie's tables as
    rotate-half ones (not one angle per interleaved pair from their first half), or rotating
    exaone4's and cohere2's full-attention layers or llama4's NoPE layer, or not rotating cohere2_moe's
    dense prefix layer (force_rope), or rotating nanochat's pairs forwards, moves verify's patterns far
    past its tolerance."""
    model = tiny_model(family, kind="interface")
    rotary = adapter_for(model.config).rotary
    with_adapter_changed(monkeypatch, model, rotary=dataclasses.replace(rotary, **change))
    assert headscope.verify(model, tiny_inputs()).max_abs_diff_pattern.max() > 1e-3


@torch.no_grad()
def test_exaone4_without_a_window_rotates_every_layer():
    """exaone4's full-attention layers are NoPE only beside sliding ones: without a sliding_window
    every layer has rotary (`Rotary.switch_if_set`), and verify agrees."""
    import transformers as tf

    config = tiny_config("exaone4", kind="interface")
    config.sliding_window, config.layer_types = None, ["full_attention", "full_attention"]
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    assert [MultiHeadAttention.from_hf(block, config).config.rotary_dim for _, block in attention_blocks(model)] == [16, 16]
    table = headscope.verify(model, tiny_inputs())
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5


@torch.no_grad()
def test_gpt_oss_pattern_rows_sum_to_less_than_one():
    model = tiny_model("gpt_oss", kind="interface")
    x = tiny_inputs()
    with headscope.capture(model) as cap:
        model(**x)
    sums = cap.patterns[0].sum(-1)[0]  # (H, T), first example (no padding)
    assert (sums < 0.999).all() and (sums > 0).all()
    assert cap.extras[0] == {"sinks"} and cap.extras[1] == {"sinks"}


@pytest.mark.parametrize("family", ["granite_swa", "granitemoe_swa"])
@torch.no_grad()
def test_granite_swas_eager_weights_leave_the_sink_out_and_the_reference_puts_it_back(family):
    """Their eager attention returns softmax weights over the keys alone (rows sum to 1) and scales its
    output by the sink's share; headscope's patterns hold the sink (rows sum to less than 1): equal to
    the eager weights times the share `_sink_shares` writes out, and far from the eager weights as they are."""
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    valid = x["attention_mask"].bool()
    with headscope.capture(model) as cap:
        model(**x)
    default = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        raw = model(**x, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(default)
    shares = _sink_shares(model, x)
    for layer, weights in enumerate(raw):
        rows = lambda t: t.permute(0, 2, 1, 3)[valid]  # (real queries, H, T)
        assert (rows(weights).sum(-1) - 1).abs().max() <= 1e-5
        sums = rows(cap.patterns[layer]).sum(-1)  # (real queries, H)
        assert sums.max() < 1 - 1e-4 and sums.min() < 0.9
        assert (rows(cap.patterns[layer]) - rows(weights * shares[layer])).abs().max() <= 1e-5
        assert (rows(cap.patterns[layer]) - rows(weights)).abs().max() > 1e-2


@pytest.mark.parametrize("family", INTERFACE_FAMILIES)
def test_adapter_cores_are_the_modules_calling_the_interface(family):
    """Each adapter points at exactly the modules whose forward calls the attention interface
    (T5's adapter: the encoder's self-attention, the first of them)."""
    model = tiny_model(family, kind="interface")
    mine = [core for _, core in core_modules(model)]
    found = discovered_cores(model)
    assert mine == found[:len(mine)] and len(mine) == model.config.num_hidden_layers
    assert len(found) == len(mine)  # the T5 matrix model is the encoder alone


@torch.no_grad()
def test_a_family_without_adapter_is_captured_by_discovery():
    """jetmoe has no adapter (its query heads are routed experts, `headscope.hf.families`): capture finds its attention modules; from_hf says it needs an adapter."""
    import transformers as tf

    config = tf.AutoConfig.for_model("jetmoe", vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, kv_channels=16, intermediate_size=48, num_local_experts=4,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    assert adapter_for(config) is None
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    x = tiny_inputs()
    before = model(**x).logits
    with headscope.capture(model) as cap:
        captured = model(**x).logits
    valid = x["attention_mask"].bool()
    assert (before - captured).abs()[valid].max() <= 1e-4
    eager = _eager_patterns(model, x)
    assert max((cap.patterns[l] - e).abs().permute(0, 2, 1, 3)[valid].max() for l, e in enumerate(eager)) <= 1e-5
    with pytest.raises(headscope.HeadscopeError, match="'jetmoe' has no headscope adapter.*capture, ablate and analyze"):
        headscope.verify(model, x)


@pytest.mark.parametrize("family", OUTSIDE_INTERFACE)
def test_models_outside_the_interface_are_refused_naming_why(family):
    import transformers as tf

    extra = {"gpt_neo": dict(attention_types=[[["global"], 2]], num_layers=2, num_heads=4)}.get(family, {})
    config = tf.AutoConfig.for_model(family, vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     **extra)
    model = tf.AutoModel.from_config(config)
    why = r"does not send attention through .*_can_set_attn_implementation\(\) is False"
    with pytest.raises(headscope.HeadscopeError, match=why) as err:
        with headscope.capture(model):
            pass
    assert "\n" not in str(err.value)
    assert model.config._attn_implementation != route.IMPLEMENTATION


@torch.no_grad()
def test_t5_encoder_decoder_captures_encoder_self_attention():
    """Full T5: layers are the encoder's self-attention; decoder self- and cross-attention run
    through the kernel (with their position bias) uncaptured, and the logits do not move."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(tiny_config("t5", kind="interface")).eval()
    x = tiny_inputs()
    x["decoder_input_ids"] = x["input_ids"][:, :7]
    before = model(**x).logits
    with headscope.capture(model) as cap:
        captured = model(**x).logits
    assert (before - captured).abs().max() <= 1e-4
    assert sorted(cap.patterns) == [0, 1]
    valid = x["attention_mask"].bool()
    model.set_attn_implementation("eager")
    encoder = model(**x, output_attentions=True).encoder_attentions
    model.set_attn_implementation("sdpa")
    assert len(encoder) == 2
    for layer, theirs in enumerate(encoder):
        assert (cap.patterns[layer] - theirs).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5
    with headscope.ablate(model, heads=[(0, 0)]):
        assert (model(**x).logits - before).abs().max() > 1e-4


def test_family_table_is_the_matrix():
    """Every model type the table says works is in this file's matrix, the hybrid and
    vision-language one (tests/hf/test_hybrids_and_composites.py) or the encoder-decoder one
    (tests/hf/test_encoder_decoders.py), or is the discovery row; the matrix covers at least 25
    families, and the documentation's family page holds the table as generated (tools/docs_pages.py)."""
    rows = family_table()
    working = {r.model_type for r in rows if r.capture} - {OTHER}
    cross = {"mllama", "mllama_text_model"}  # tiny_mllama, in test_hybrids_and_composites.py (verify there too)
    alone = {"bart_causal_lm"}  # a decoder without its encoder, in test_decoder_alone.py
    inside = set(TEXT_DECODERS)  # text decoders only inside a vision-language model, tested in it
    assert working == (set(INTERFACE_FAMILIES) | set(HYBRID_FAMILIES) | set(COMPOSITE_FAMILIES) | cross
                       | set(ENCODER_DECODER_FAMILIES) | alone | inside)
    assert {r.model_type for r in rows if not r.analyze} == {"whisper"} | set(OUTSIDE_INTERFACE)  # default sites
    assert {r.model_type for r in rows if r.analyze_sites} == {"whisper"}  # its decoder's, the encoder fed silence
    assert len(INTERFACE_FAMILIES) >= 25
    adapted_hybrids = {f for f in HYBRID_FAMILIES if adapter_for(tiny_config(f, "hybrid")) is not None}
    assert {r.model_type for r in rows if r.verify} == (set(VERIFIED) | set(VERIFIED_COMPOSITES) | adapted_hybrids
                                                        | set(ENCODER_DECODER_FAMILIES) | alone | inside | cross)
    assert {r.model_type for r in rows if not r.capture} == set(OUTSIDE_INTERFACE)
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "families.md").read_text()
    assert family_markdown() in page


def test_models_families_command_prints_the_table():
    from typer.testing import CliRunner

    from headscope.cli import app

    result = CliRunner().invoke(app, ["models", "--families"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()[1:]
    rows = family_table()
    assert len(lines) == len(rows)
    for line, row in zip(lines, rows):
        assert line.startswith(row.model_type)
        assert line[len(row.model_type):].split()[:2] == ["yes" if row.capture else "no", "yes" if row.verify else "no"]
        analyze = row.analyze_sites or ("yes" if row.analyze else "no")  # whisper: the decoder's groups
        assert line[len(row.model_type):].split(maxsplit=2)[2].startswith(f"{analyze} ")
        assert f" {row.sites or '-'} " in line
        assert line.endswith(row.notes)


@pytest.mark.parametrize("family", ["t5", "mt5"])
def test_t5_and_mt5_for_conditional_generation_analyze_their_encoder(family):
    """The whole encoder-decoder (it took `Loaded.body` for the model and failed asking for
    decoder inputs): analyze runs the encoder, whose self-attention layers are the rows."""
    import transformers as tf

    from headscope.loading.loader import Loaded
    from headscope.probes.kinds import TextProbe
    from tests.support.planted import char_tokenizer

    torch.manual_seed(0)
    cls = tf.T5ForConditionalGeneration if family == "t5" else tf.MT5ForConditionalGeneration
    loaded = Loaded.from_model(cls(tiny_config(family, kind="interface")).eval(), char_tokenizer(), f"tiny-{family}")
    assert not loaded.causal
    analysis = headscope.analyze(loaded, detectors=["previous_token", "sink"], probes=[TextProbe(n_examples=4, seq_len=24)],
                                 explorer_examples=1)
    assert sorted(set(analysis.scores.layer)) == [0, 1] and len(analysis.scores) == 2 * 2 * 4
    assert analysis.scores.score.notna().all()
    from headscope.report import render_html

    assert f"tiny-{family}" in render_html(analysis, plotlyjs="cdn")
