"""Hybrids (attention in some layers only, beside Mamba, linear attention or convolutions) and
vision-language models (layer, head and vocabulary counts in `config.text_config`), as tiny
random-init models (tests/support/tiny.py, kinds "hybrid" and "composite"), found without an
adapter: headscope inside the model changes nothing, its patterns are the model's eager ones,
layers keep the model's numbers, ablation equals removing the head at the output projection's
input and restores the model, and `analyze` runs end to end and renders."""
import pytest
import torch

import headscope
from headscope.hf import route
from headscope.hf.adapters import Rotary, adapter_for, attention_blocks, core_modules, discovered_cores, text_config
from headscope.hf.from_hf import rotary_tables
from tests.support.contracts import (assert_hook_contract, assert_ov_refused, eager_weights, head_meaned_at,
                                     head_zeroed_at, run_eager, with_adapter_changed)
from headscope.hf.hooks import hook_names
from headscope.loading.loader import Loaded
from headscope.probes.kinds import NeedleProbe, RepeatedProbe, TextProbe
from headscope.probes.treebank import TreebankProbe
from headscope.report import render_html
from tests.support.planted import char_tokenizer
from tests.support.tiny import (COMPOSITE_ATTENTION, COMPOSITE_FAMILIES, VERIFIED_COMPOSITES, HYBRID_ATTENTION, HYBRID_FAMILIES, tiny_config,
                                tiny_image_inputs, tiny_inputs, tiny_mllama, tiny_model)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Hybrids with an adapter of their own (from_hf, verify, the OV table but qwen3_next's, whose output
# gate sits inside the OV circuit, and zamba2's, whose attention output reaches the residual only through
# its block's MLP and the next Mamba mixer): all of them. zamba2's LoRA and joined input: tests/hf/test_zamba2.py.
ADAPTED_HYBRIDS = [f for f in HYBRID_FAMILIES if adapter_for(tiny_config(f, "hybrid")) is not None]
CASES = [(f, "hybrid") for f in HYBRID_FAMILIES] + [(f, "composite") for f in COMPOSITE_FAMILIES]
OUT = {"lfm2": "out_proj", "lfm2_moe": "out_proj", "lfm2_vl": "out_proj"}  # the output projection's name inside the attention module (default o_proj)


def _attention_layers(family, kind, model):
    if kind == "hybrid":
        return HYBRID_ATTENTION[family]
    return COMPOSITE_ATTENTION.get(family, tuple(range(model.config.text_config.num_hidden_layers)))


def _eager_patterns(model, x) -> dict[int, torch.Tensor]:
    """The weights each attention module's own eager path returns, by the model's layer number."""
    return eager_weights(model, dict(core_modules(model)), x)


@pytest.mark.parametrize("family, kind", CASES)
@torch.no_grad()
def test_capture_keeps_outputs_and_patterns_match_eager_in_the_models_layers(family, kind):
    model = tiny_model(family, kind=kind)
    x = tiny_inputs()
    valid = x["attention_mask"].bool()
    layers = _attention_layers(family, kind, model)
    before = model(**x).logits
    with headscope.capture(model) as cap:
        captured = model(**x).logits
    assert (before - captured).abs()[valid].max() <= 1e-4
    assert tuple(sorted(cap.patterns)) == layers  # the model's own numbers: hybrids skip the other layers
    eager = _eager_patterns(model, x)
    assert tuple(sorted(eager)) == layers
    for layer in layers:
        assert cap.patterns[layer].shape == eager[layer].shape == (2, 4, 11, 11)
        assert (cap.patterns[layer] - eager[layer]).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5
    assert hook_names(model)[0] == f"layers.{layers[0]}.attn.hook_q"


@pytest.mark.parametrize("family, kind", CASES)
@torch.no_grad()
def test_ablation_is_removing_the_head_at_the_output_projection_and_restores(family, kind):
    """The reference zeroes head h's slice of the output projection's input (a pre-hook on it),
    independently of headscope's kernel; the model is restored bit for bit."""
    model = tiny_model(family, kind=kind)
    x = tiny_inputs()
    layer, head = _attention_layers(family, kind, model)[-1], 1
    core = dict(core_modules(model))[layer]
    out = core.get_submodule(OUT.get(family, "o_proj"))
    before = model(**x).logits
    with headscope.ablate(model, heads=[(layer, head)]):
        ablated = model(**x).logits
    with head_zeroed_at(out, head, text_config(model.config).num_attention_heads):
        reference = model(**x).logits
    assert (ablated - before).abs().max() > 1e-3
    assert (ablated - reference).abs().max() <= 1e-4
    assert torch.equal(before, model(**x).logits)
    assert not route.routed_models()


@pytest.mark.parametrize("family, kind", [("jamba", "hybrid"), ("qwen3_next", "hybrid")])
def test_a_layer_without_attention_is_refused_in_one_line(family, kind):
    model = tiny_model(family, kind=kind)
    missing = next(l for l in range(4) if l not in HYBRID_ATTENTION[family])
    for call in (lambda: headscope.capture(model, layers=[missing]), lambda: headscope.ablate(model, heads=[(missing, 0)])):
        with pytest.raises(headscope.HeadscopeError, match=f"layer {missing} has no attention") as err:
            with call():
                pass
        assert "\n" not in str(err.value)
    assert not route.routed_models()


@pytest.mark.parametrize("family, kind", [(f, "composite") for f in COMPOSITE_FAMILIES]
                         + [(f, "hybrid") for f in HYBRID_FAMILIES])
def test_analyze_runs_end_to_end_and_renders(family, kind):
    """A vision-language model is analysed as its text decoder with text-only probes; a hybrid's
    tables hold its attention layers under their own numbers, the others are noted."""
    model = tiny_model(family, kind=kind)
    loaded = Loaded.from_model(model, char_tokenizer(), f"tiny-{family}")
    layers = _attention_layers(family, kind, model)
    assert loaded.attention_layers == layers and loaded.n_heads == 4
    probes = [TextProbe(n_examples=4, seq_len=32), RepeatedProbe(n_examples=4, repeat_len=8, repeats=3)]
    analysis = headscope.analyze(loaded, detectors=["previous_token", "induction", "sink"], probes=probes,
                                 explorer_examples=1)
    assert tuple(sorted(set(analysis.scores.layer))) == layers
    assert len(analysis.scores) == 3 * len(layers) * 4
    assert analysis.scores.score.notna().all()
    assert analysis.n_layers == loaded.n_layers
    without = sorted(set(range(loaded.n_layers)) - set(layers))
    notes = " ".join(analysis.meta.get("notes", []))
    assert (f"layers {', '.join(map(str, without))} have no attention" in notes) == bool(without)
    adapter = adapter_for(model.config)  # the OV table reads W_V and W_O through the text decoder's adapter
    gated = f"OV copying not computed: OV copying is not available for layer {layers[0]}: a sigmoid output gate"
    assert (gated in notes) == bool(adapter and adapter.output_gate)  # no input-free OV circuit through a gate
    assert ("ov" in analysis.tables) == (adapter is not None and not adapter.output_gate and not adapter.no_ov)
    page = render_html(analysis, plotlyjs="cdn")
    assert f"tiny-{family}" in page


@pytest.mark.parametrize("family", COMPOSITE_FAMILIES)
def test_a_saved_vision_language_model_loads_as_a_causal_text_decoder(family, tmp_path):
    """`load` on a vision-language checkpoint folder (architectures: ...ForConditionalGeneration):
    the whole model, causal, with the text config's counts; its text decoder is what runs."""
    model = tiny_model(family, kind="composite")
    model.save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    loaded = headscope.load(str(tmp_path), device="cpu")
    assert type(loaded.model) is type(model)
    assert loaded.causal and (loaded.n_layers, loaded.n_heads) == (3, 4)
    assert loaded.attention_layers == _attention_layers(family, "composite", model)  # qwen3_5's: 1, 2
    ids = torch.randint(3, 99, (1, 9))
    with torch.no_grad():
        assert loaded.body(input_ids=ids).last_hidden_state.shape == (1, 9, 64)


@pytest.mark.parametrize("full", [False, True], ids=["mllama-text", "mllama"])
@torch.no_grad()
def test_a_cross_attention_layer_that_never_runs_is_reported_and_refused(full):
    """mllama without an image (its text model, or the whole vision-language model): layer 1
    (cross-attention) never runs. capture says so (`not_run`), ablating or hooking it is an
    error, and the other layers are as eager."""
    model = tiny_mllama(full)
    x = tiny_inputs()
    valid = x["attention_mask"].bool()
    before = model(**x).logits
    with headscope.capture(model) as cap:
        captured = model(**x).logits
    assert (before - captured).abs()[valid].max() <= 1e-4
    assert sorted(cap.patterns) == [0, 2] and cap.not_run == [1]
    eager = _eager_patterns(model, x)
    assert sorted(eager) == [0, 2]
    for layer in (0, 2):
        assert (cap.patterns[layer] - eager[layer]).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5
    for enter in (lambda: headscope.ablate(model, heads=[(1, 0)]),
                  lambda: headscope.model_hooks(model, {"layers.1.attn.hook_z": lambda z, hook: z * 0})):
        with pytest.raises(headscope.HeadscopeError, match="layer 1 did nothing: its attention never ran") as err:
            with enter():
                model(**x)
        assert "\n" not in str(err.value)
    assert not route.routed_models()
    assert torch.equal(before, model(**x).logits)
    with headscope.ablate(model, heads=[(2, 0)]):  # a layer that runs: ablation acts, no error
        assert (model(**x).logits - before).abs().max() > 1e-3


@pytest.mark.parametrize("full", [False, True], ids=["mllama-text", "mllama"])
def test_analyze_skips_a_layer_that_never_ran_with_a_note(full):
    loaded = Loaded.from_model(tiny_mllama(full), char_tokenizer(), "tiny-mllama-text")
    assert loaded.attention_layers == (0, 1, 2)
    probes = [TextProbe(n_examples=4, seq_len=32), RepeatedProbe(n_examples=4, repeat_len=8, repeats=3)]
    analysis = headscope.analyze(loaded, detectors=["previous_token", "induction"], probes=probes, explorer_examples=1)
    assert sorted(set(analysis.scores.layer)) == [0, 2]
    assert analysis.scores.score.notna().all()
    notes = analysis.meta["notes"]
    assert any(n.startswith("not run: the attention of layer 1 never ran on the text probe") for n in notes)
    assert any(n.startswith("not run: the attention of layer 1 never ran on the repeated probe") for n in notes)
    assert "tiny-mllama-text" in render_html(analysis, plotlyjs="cdn")


def test_a_hybrids_syntactic_rows_carry_the_models_layer_numbers():
    """The syntactic detector (its own cross-fitted table) on jamba: rows for layers 1 and 3 only."""
    model = tiny_model("jamba", kind="hybrid")
    model.config.max_position_embeddings = 512  # the bundled treebank's sentences (character tokens)
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-jamba")
    analysis = headscope.analyze(loaded, detectors=["syntactic"], probes=[TreebankProbe(n_sentences=60)],
                                 explorer_examples=0)
    assert sorted(set(analysis.scores.layer)) == [1, 3]
    assert sorted(set(analysis.tables["syntax"].layer)) == [1, 3]
    kinds = set(analysis.tables["syntax"].baseline_kind)
    assert all(k.split()[1].split(".")[0] in ("1", "3") for k in kinds if k.startswith("control "))


def test_a_hybrids_retrieval_rows_carry_the_models_layer_numbers():
    """The retrieval detector (its own forward passes over needle prompts) on qwen3_next: layer 2 only."""
    model = tiny_model("qwen3_next", kind="hybrid")
    model.config.max_position_embeddings = 512  # needle prompts of character tokens
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-qwen3-next")
    analysis = headscope.analyze(loaded, detectors=["retrieval"], probes=[NeedleProbe(lengths=(320,), depths=(0.5,))],
                                 explorer_examples=0)
    assert sorted(set(analysis.scores.layer)) == [2]
    assert sorted(set(analysis.tables["retrieval"].layer)) == [2]


@pytest.mark.parametrize("family", VERIFIED_COMPOSITES)
@torch.no_grad()
def test_a_vision_language_models_text_decoder_has_its_familys_adapter(family):
    """gemma3's text decoder is gemma3_text, llava's a llama, qwen3_5's qwen3_5_text (attention in
    layers 1 and 2): their adapters give from_hf, verify and hook_result, and point at the modules
    discovery finds."""
    model = tiny_model(family, kind="composite")
    x = tiny_inputs()
    assert [core for _, core in core_modules(model)] == discovered_cores(model)
    table = headscope.verify(model, x)
    assert tuple(table.layer) == _attention_layers(family, "composite", model)
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5
    assert_hook_contract(model)


def _qwen_image_inputs() -> dict:
    """qwen2_5_vl's image inputs with the token types its processor gives (1 at the image tokens):
    without them the model gives every token one position on all three rotary axes."""
    x = tiny_image_inputs("qwen2_5_vl")
    return dict(x, mm_token_type_ids=(x["input_ids"] == 98).long())


def _mrope_tables(config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary `(cos, sin)` `[batch, pos, d_head]` built here from positions `[3, batch, pos]`
    (temporal, height, width): frequency j of a head's half takes the position of the axis whose
    mrope_section it falls in; rotate-half layout, so the half is repeated."""
    d_head = config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, d_head, 2).float() / d_head)  # (D/2,)
    section = config.rope_parameters["mrope_section"]
    axis = torch.repeat_interleave(torch.arange(3), torch.tensor(section))  # (D/2,): 0, 0, 1, 1, 1, 2, 2, 2
    angles = positions.float()[..., None] * inv_freq  # (3, B, T, D/2)
    chosen = angles.gather(0, axis.expand(1, *angles.shape[1:3], -1))[0]  # (B, T, D/2)
    full = torch.cat([chosen, chosen], dim=-1)  # (B, T, D)
    return full.cos(), full.sin()


@torch.no_grad()
def test_qwen2_5_vls_text_decoder_verifies_with_an_image_whose_positions_differ_per_axis():
    """With an image the three rotary axes (temporal, height, width) hold different positions at the
    image tokens; verify agrees with each layer's own eager weights there too."""
    model = tiny_model("qwen2_5_vl", kind="composite")
    x = _qwen_image_inputs()
    seen = {}
    handle = model.model.language_model.rotary_emb.register_forward_hook(lambda m, a, out: seen.update(positions=a[1]))
    try:
        table = headscope.verify(model, x)
    finally:
        handle.remove()
    positions = seen["positions"]  # (3, B, T)
    assert positions.shape == (3, 2, 11) and not torch.equal(positions[1], positions[2])
    assert list(table.layer) == [0, 1, 2]
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
@torch.no_grad()
def test_qwen3_vls_text_decoder_verifies_with_an_image_and_needs_its_qk_norms(family, monkeypatch):
    """Qwen3-VL's text attention (per-head q/k RMSNorm, multimodal rotary) with an image, its three
    rotary axes holding different positions at the image tokens: verify agrees; the adapter read
    without the q/k norms fails by far."""
    model = tiny_model(family, kind="composite")
    x = tiny_image_inputs(family)
    table = headscope.verify(model, x)
    assert list(table.layer) == [0, 1, 2]
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    with_adapter_changed(monkeypatch, model, qk_norm=None)
    assert headscope.verify(model, x).max_abs_diff_pattern.max() > 1e-3


@pytest.mark.parametrize("family, other", [("glm4v", Rotary()), ("glm4v_moe", Rotary(interleaved=True))])
@torch.no_grad()
def test_glm4v_text_decoders_rotary_pairs(family, other, monkeypatch):
    """GLM-4V's text attention rotates half of each head on interleaved pairs (2i, 2i + 1), GLM-4.5V's
    on rotate-half pairs, both by the image's three position axes: verify agrees with an image; each
    read with the other's pairs fails."""
    model = tiny_model(family, kind="composite")
    x = tiny_image_inputs(family)
    table = headscope.verify(model, x)
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    with_adapter_changed(monkeypatch, model, rotary=other)
    assert headscope.verify(model, x).max_abs_diff_pattern.max() > 1e-3


@pytest.mark.parametrize("image", [False, True], ids=["text", "image"])
@torch.no_grad()
def test_from_hf_fed_a_qwen2_5_vl_text_layers_inputs_reproduces_it(image):
    """Layer 2's module from_hf builds, fed the layer's hidden states and mask and multimodal rotary
    tables built here from the model's 3-axis positions, gives the layer's output and eager weights;
    rotary_tables reads the same tables from what the model passed; with an image, one position per
    token on every axis (the module's own rotary) no longer gives the layer's pattern."""
    model = tiny_model("qwen2_5_vl", kind="composite")
    x = _qwen_image_inputs() if image else tiny_inputs()
    core = model.model.language_model.layers[2].self_attn
    seen = {}
    handles = [core.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True),
               core.register_forward_hook(lambda m, a, out: seen.update(output=out[0], weights=out[1])),
               model.model.language_model.rotary_emb.register_forward_hook(lambda m, a, out: seen.update(positions=a[1]))]
    run_eager(model, x, handles)
    mine = headscope.MultiHeadAttention.from_hf(core, model.config)
    assert (mine.n_heads, mine.config.n_kv_heads, mine.config.rotary_dim, mine.config.qkv_bias) == (4, 2, 16, True)
    cos, sin = _mrope_tables(model.config.text_config, seen["positions"])
    passed = rotary_tables(mine, model.config, seen["position_embeddings"])
    assert (passed[0] - cos).abs().max() <= 1e-6 and (passed[1] - sin).abs().max() <= 1e-6
    out, pattern = mine(seen["hidden_states"], seen["attention_mask"], rotary=(cos, sin), return_pattern=True)
    assert (out - seen["output"]).abs().max() <= 1e-4
    assert (pattern - seen["weights"]).abs().max() <= 1e-5
    _, one_axis = mine(seen["hidden_states"], seen["attention_mask"], return_pattern=True)  # positions 0.., every axis
    moved = (one_axis - seen["weights"]).abs().max()
    assert moved > 1e-3 if image else moved <= 1e-5


def test_a_model_without_attention_is_refused_in_one_line():
    import transformers as tf

    config = tf.AutoConfig.for_model("mamba", vocab_size=99, hidden_size=32, num_hidden_layers=2, state_size=8)
    model = tf.AutoModelForCausalLM.from_config(config)
    with pytest.raises(headscope.HeadscopeError, match="has no module calling transformers' attention interface") as err:
        with headscope.capture(model):
            pass
    assert "\n" not in str(err.value)
    assert not route.routed_models()


@torch.no_grad()
def test_mllamas_cross_attention_layer_is_a_cross_site_of_the_text_stack():
    """mllama's adapter: layer 1 is the text stack's cross-attention site (the module discovery
    finds, whose forward takes `cross_attention_states`), layers 0 and 2 its self-attention;
    `sites="text.self"` leaves layer 1 out, so nothing is reported as not run."""
    from headscope.hf.sites import select, sites

    model = tiny_mllama(False)
    assert [(s.stack, s.kind, s.layer) for s in sites(model)] == [("text", "self", 0), ("text", "cross", 1),
                                                                  ("text", "self", 2)]
    assert select(model, "text.cross").layers == [1] and select(model).layers == [0, 1, 2]
    assert [l for l, _ in attention_blocks(model)] == [0, 2]
    assert [id(c) for _, c in core_modules(model)] == [id(c) for c in discovered_cores(model)]
    with headscope.capture(model, sites="text.self") as cap:
        model(**tiny_inputs())
    assert sorted(cap.patterns) == [0, 2] and cap.not_run == []


def _mllama_image_inputs(full: bool) -> dict:
    """Inputs with an image: the whole model's pixels (tests/support/tiny.py), or for the text model
    alone 5 random image features per example and its additive cross-attention mask `[batch, 1,
    query, feature]`, the second example's last two features masked for every token."""
    if full:
        return tiny_image_inputs("mllama")
    g = torch.Generator().manual_seed(3)
    mask = torch.zeros(2, 1, 11, 5)
    mask[1, :, :, 3:] = torch.finfo(torch.float32).min
    return dict(tiny_inputs(), cross_attention_states=torch.randn(2, 5, 64, generator=g), cross_attention_mask=mask)


@pytest.mark.parametrize("full", [False, True], ids=["mllama-text", "mllama"])
@torch.no_grad()
def test_mllamas_text_attention_verifies_self_without_and_cross_with_an_image(full):
    """Without an image, verify compares the self-attention layers (text.self) and refuses the
    default group in one line (its cross-attention layer never ran); with one, every layer of the
    text stack and the cross group alone, against each module's own eager weights."""
    model = tiny_mllama(full)
    table = headscope.verify(model, tiny_inputs(), sites="text.self")
    assert list(table.layer) == [0, 2]
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    with pytest.raises(headscope.HeadscopeError, match=r"layer 1 \(.*cross_attn\) never ran on these inputs") as err:
        headscope.verify(model, tiny_inputs())
    assert "\n" not in str(err.value)
    x = _mllama_image_inputs(full)
    for group, layers in ((None, [0, 1, 2]), ("text.cross", [1])):
        table = headscope.verify(model, x, sites=group)
        assert list(table.layer) == layers
        assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    assert_hook_contract(model)


@pytest.mark.parametrize("full", [False, True], ids=["mllama-text", "mllama"])
@torch.no_grad()
def test_from_hf_fed_mllamas_cross_attention_layers_inputs_reproduces_it(full):
    """Layer 1's cross_attn through from_hf (its q/k RMSNorms, no rotary; the self-attention layers
    rotate and have no norms),
    fed the layer's hidden states, cross-attention mask and the image's features as `context`,
    gives the layer's output and eager weights `[batch, head, query, feature]`; without the norms
    the pattern is no longer the layer's."""
    model = tiny_mllama(full)
    stack = model.model.language_model if full else model.model
    core = stack.layers[1].cross_attn
    seen = {}
    handles = [core.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True),
               core.register_forward_hook(lambda m, a, out: seen.update(output=out[0], weights=out[1]))]
    run_eager(model, _mllama_image_inputs(full), handles)
    mine = headscope.MultiHeadAttention.from_hf(core, model.config)
    own = headscope.MultiHeadAttention.from_hf(stack.layers[0].self_attn, model.config)
    assert mine.config.qk_norm and not own.config.qk_norm
    # the self-attention layers rotate; the cross-attention layer never gets rotary tables, so has no rotary
    assert (own.config.rotary_dim, mine.config.rotary_dim) == (16, 0)
    context = seen["cross_attention_states"]
    out, pattern = mine(seen["hidden_states"], seen["attention_mask"], context=context, return_pattern=True)
    assert pattern.shape == seen["weights"].shape == (2, 4, 11, context.shape[1])
    assert (out - seen["output"]).abs().max() <= 1e-4
    assert (pattern - seen["weights"]).abs().max() <= 1e-5
    mine.q_norm, mine.k_norm = torch.nn.Identity(), torch.nn.Identity()
    _, unnormed = mine(seen["hidden_states"], seen["attention_mask"], context=context, return_pattern=True)
    assert (unnormed - seen["weights"]).abs().max() > 1e-3


def test_hybrids_with_and_without_an_adapter():
    assert set(ADAPTED_HYBRIDS) == set(HYBRID_FAMILIES) and "zamba2" in ADAPTED_HYBRIDS


@pytest.mark.parametrize("family", ADAPTED_HYBRIDS)
@torch.no_grad()
def test_a_hybrids_adapter_finds_the_attention_layers_and_verifies_them(family):
    """The adapter's blocks are the modules discovery finds (the model's layer numbers, other
    mixers under the same path skipped), and headscope's module loaded with each block's weights
    gives the model's output and eager pattern."""
    model = tiny_model(family, kind="hybrid")
    assert [l for l, _ in attention_blocks(model)] == list(HYBRID_ATTENTION[family])
    assert [id(c) for _, c in core_modules(model)] == [id(c) for c in discovered_cores(model)]
    table = headscope.verify(model, tiny_inputs())
    assert tuple(table.layer) == HYBRID_ATTENTION[family]
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5


@torch.no_grad()
def test_granitemoehybrid_takes_rotary_only_when_its_config_asks():
    from transformers import AutoModelForCausalLM

    config = tiny_config("granitemoehybrid", "hybrid")
    assert config.position_embedding_type is None  # the default: no positional encoding in attention
    config.position_embedding_type = "rope"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    _, block = attention_blocks(model)[0]
    assert headscope.MultiHeadAttention.from_hf(block, model.config).config.rotary_dim > 0
    table = headscope.verify(model, tiny_inputs())
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5


@pytest.mark.parametrize("family", ["jamba", "nemotron_h", "lfm2"])
def test_a_hybrids_ov_rows_are_its_attention_layers_read_from_the_weights(family):
    """OV eigenvalue shares under the model's layer numbers, each equal to the share computed in
    the test from that layer's own v and output projection weights."""
    from headscope.head_geometry.ov_circuit import ov_copying, ov_scores

    model = tiny_model(family, kind="hybrid")
    loaded = Loaded.from_model(model, char_tokenizer(), f"tiny-{family}")
    table = ov_copying(loaded, n_tokens=0)
    assert tuple(sorted(set(table.layer))) == HYBRID_ATTENTION[family]
    config = model.config
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_kv = config.num_attention_heads // config.num_key_value_heads
    out = OUT.get(family, "o_proj")
    W_E, W_U = model.get_input_embeddings().weight.float(), model.get_output_embeddings().weight.float().T
    for row in table.itertuples(index=False):
        block = attention_blocks(model)[[l for l, _ in attention_blocks(model)].index(row.layer)][1]
        kv = row.head // per_kv
        W_V = block.v_proj.weight[kv * d_head:(kv + 1) * d_head].float().T
        W_O = getattr(block, out).weight[:, row.head * d_head:(row.head + 1) * d_head].float().T
        _, share = ov_scores(W_E, W_V, W_O, W_U, rows=torch.zeros(0, dtype=torch.long))
        assert row.positive_eig_share == pytest.approx(share, abs=1e-6)


def _gated_model(seed=0):
    """qwen3_next with its q/k norm weights off zero (their init, where (1 + weight) is 1) and its
    gate rows scaled up (at init sigmoid(gate) is about 1/2 everywhere), so that a wrong norm
    convention, a missing gate or a mean taken on the wrong side of it shows."""
    model = tiny_model("qwen3_next", kind="hybrid", seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        q_proj = model.model.layers[2].self_attn.q_proj
        q_proj.weight.view(4, 2, 16, 64)[:, 1] *= 50  # (head, [query | gate], d_head, d_model)
    return model


@torch.no_grad()
def test_qwen3_nexts_gated_attention_verifies_against_its_own_eager_weights():
    model = _gated_model()
    x = tiny_inputs()
    table = headscope.verify(model, x)
    assert tuple(table.layer) == (2,)
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    core = dict(core_modules(model))[2]
    mine = headscope.MultiHeadAttention.from_hf(core, model.config).config
    assert mine.output_gate and mine.qk_norm and mine.rotary_dim == 4  # head_dim 16 * partial_rotary_factor 0.25
    assert_hook_contract(model)
    eager = _eager_patterns(model, x)[2]  # the reference verify's pattern column is measured against
    with headscope.capture(model) as cap:
        model(**x)
    valid = x["attention_mask"].bool()
    assert (cap.patterns[2] - eager).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5


@torch.no_grad()
def test_qwen3_nexts_from_hf_module_reproduces_the_layer_from_its_inputs():
    """The module from_hf builds, fed what the layer received (hidden states, its mask, the
    model's own rotary tables), gives what the layer returned; and its gate matters."""
    model = _gated_model()
    core = model.model.layers[2].self_attn
    seen = {}
    handles = [core.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True),
               core.register_forward_hook(lambda m, a, out: seen.update(output=out[0]))]
    try:
        model(**tiny_inputs())
    finally:
        for handle in handles:
            handle.remove()
    mine = headscope.MultiHeadAttention.from_hf(core, model.config)
    cos, sin = seen["position_embeddings"]  # (B, T, 4): the model's partial rotary, rotate-half layout
    args = dict(attention_mask=seen["attention_mask"], rotary=(cos, sin))
    out = mine(seen["hidden_states"], **args)
    assert (out - seen["output"]).abs().max() <= 1e-4
    mine.W_gate.weight.zero_()  # sigmoid(0) = 1/2 everywhere: no longer the layer
    assert (mine(seen["hidden_states"], **args) - seen["output"]).abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["zero", "mean"])
@torch.no_grad()
def test_qwen3_nexts_ablation_acts_at_o_projs_input_after_the_gate(mode):
    """Zero and mean ablation equal setting the head's slice of o_proj's input (the gated z) to 0
    or to its mean over batch and positions; hook_z is that input; the model is restored."""
    model = _gated_model()
    x = tiny_inputs()
    out = model.model.layers[2].self_attn.o_proj
    before = model(**x).logits
    with headscope.ablate(model, heads=[(2, 1)], mode=mode):
        ablated = model(**x).logits
    reference = head_zeroed_at if mode == "zero" else head_meaned_at
    with reference(out, 1, 4):
        expected = model(**x).logits
    assert (ablated - before).abs().max() > 1e-3
    assert (ablated - expected).abs().max() <= 1e-4
    assert torch.equal(before, model(**x).logits)
    seen = {}
    handle = out.register_forward_pre_hook(lambda m, a: seen.update(o_input=a[0].clone()))
    try:
        with headscope.model_hooks(model, {"layers.2.attn.hook_z": lambda z, hook: seen.update(z=z.clone())}):
            model(**x)
    finally:
        handle.remove()
    assert seen["z"].shape == (2, 11, 4, 16)
    assert torch.equal(seen["z"].flatten(2), seen["o_input"])
    assert not route.routed_models()


def test_qwen3_nexts_ov_table_is_refused_in_one_line():
    """Its gate, computed from the input, sits between W_V and W_O: no fixed OV circuit to score."""
    loaded = Loaded.from_model(tiny_model("qwen3_next", kind="hybrid"), char_tokenizer(), "tiny-qwen3-next")
    assert_ov_refused(loaded, "OV copying is not available for layer 2: a sigmoid output gate")
