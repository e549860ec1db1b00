"""Encoder-decoders (bart, whisper, the bart-like marian, mbart, m2m_100, pegasus, blenderbot,
blenderbot-small and plbart, t5, mt5 as ...ForConditionalGeneration, tests/support/tiny.py, kind
"encoder_decoder") and their three groups of attention sites: the encoder's self-attention
(the default), the decoder's causal self-attention and its cross-attention over the encoder's
output. For every group: headscope inside the model changes nothing, its patterns are the
model's eager ones (`encoder_attentions`, `decoder_attentions`, `cross_attentions`), ablation
equals zeroing the head's slice of the output projection's input and restores the model, a
group that never ran is an error to ablate, hook or verify, and `verify` and `from_hf` agree with
every site (outputs 1e-4, patterns 1e-5 of the model's eager attentions)."""
import pytest
import torch

import headscope
from headscope.attention import MultiHeadAttention
from headscope.hf import route
from headscope.hf.verify import _named_inputs
from headscope.hf.sites import select, sites
from headscope.loading.loader import Loaded
from tests.support.contracts import head_zeroed_at, run_eager, with_adapter_changed
from tests.support.planted import char_tokenizer
from tests.support.tiny import ENCODER_DECODER_FAMILIES, tiny_model, tiny_seq2seq_inputs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

GROUPS = ("encoder", "decoder.self", "decoder.cross")
EAGER = {"encoder": "encoder_attentions", "decoder.self": "decoder_attentions", "decoder.cross": "cross_attentions"}
T5_LIKE = ("t5", "mt5", "umt5")  # the others are bart's attention (whisper's k_proj has no bias)
OUT = {f: "o" if f in T5_LIKE else "out_proj" for f in ENCODER_DECODER_FAMILIES}  # output projection inside the site
KEYS = {f: "k" if f in T5_LIKE else "k_proj" for f in ENCODER_DECODER_FAMILIES}  # key projection
CASES = [(family, group) for family in ENCODER_DECODER_FAMILIES for group in GROUPS]


def _heads(family, group, model) -> int:
    """The group's head count, from the config (bart, whisper: 4 in the encoder, 2 in the decoder)."""
    config = model.config
    if family in T5_LIKE:
        return config.num_heads
    return config.encoder_attention_heads if group == "encoder" else config.decoder_attention_heads


def _query_rows(family, group, x) -> torch.Tensor:
    """`[batch, query]` True on the rows that mean something: the encoder's unpadded positions;
    every decoder position (no decoder padding)."""
    if group == "encoder" and "attention_mask" in x:
        return x["attention_mask"].bool()
    return torch.ones(2, x["decoder_input_ids"].shape[1] if group != "encoder" else 6, dtype=torch.bool)


def _eager(model, x, group):
    default = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return getattr(model(**x, output_attentions=True), EAGER[group])
    finally:
        model.set_attn_implementation(default)


@pytest.mark.parametrize("family", ENCODER_DECODER_FAMILIES)
def test_sites_are_named_by_module_path_kind_and_stack(family):
    model = tiny_model(family, kind="encoder_decoder")
    found = sites(model)
    assert headscope.sites(model) == found and all(isinstance(s, headscope.Site) for s in found)
    assert [(s.stack, s.kind, s.layer) for s in found] == [
        ("encoder", "self", 0), ("encoder", "self", 1),
        ("decoder", "self", 0), ("decoder", "cross", 0), ("decoder", "self", 1), ("decoder", "cross", 1)]
    modules = dict(model.named_modules())
    assert all(s.name in modules for s in found)
    assert {s.name.rsplit(".", 1)[1] for s in found if s.kind == "cross"} <= {"encoder_attn", "EncDecAttention"}
    assert select(model).sites == select(model, "encoder").sites  # the default is the encoder
    for group in GROUPS:
        assert select(model, group).n_heads == _heads(family, group, model)


@pytest.mark.parametrize("family, group", CASES)
@torch.no_grad()
def test_capture_keeps_outputs_and_patterns_match_eager(family, group):
    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    default = model.config._attn_implementation
    before = model(**x).logits
    with headscope.capture(model, sites=group) as cap:
        captured = model(**x).logits
    assert model.config._attn_implementation == default
    assert (before - captured).abs().max() <= 1e-4
    assert sorted(cap.patterns) == [0, 1] and cap.not_run == []
    assert [s.group for s in cap.sites.values()] == [group if "." in group else group + ".self"] * 2
    eager = _eager(model, x, group)
    rows = _query_rows(family, group, x)
    n_query = rows.shape[1]
    n_key = n_query if group != "decoder.cross" else (6 if family == "whisper" else 11)
    for layer, theirs in enumerate(eager):
        mine = cap.patterns[layer]
        assert mine.shape == theirs.shape == (2, _heads(family, group, model), n_query, n_key)
        assert (mine - theirs).abs().permute(0, 2, 1, 3)[rows].max() <= 1e-5
    if group == "decoder.cross" and family != "whisper":  # the encoder's padding mask holds in cross-attention
        assert cap.patterns[0][1, :, :, -3:].abs().max() == 0
    assert not route.routed_models()


@pytest.mark.parametrize("family, group", CASES)
@torch.no_grad()
def test_ablation_is_zeroing_the_heads_slice_of_the_output_projections_input(family, group):
    """The reference, independent of headscope: a pre-hook on the site's own output projection
    (found by the site's module path) zeroes head h's slice of its input."""
    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    layer, head = 1, 1
    site = select(model, group).sites[layer]
    out = model.get_submodule(site.name).get_submodule(OUT[family])
    n_heads = _heads(family, group, model)
    before = model(**x).logits
    with headscope.ablate(model, heads=[(layer, head)], sites=group):
        ablated = model(**x).logits

    with head_zeroed_at(out, head, n_heads):
        reference = model(**x).logits
    assert (ablated - before).abs().max() > 1e-3
    assert (ablated - reference).abs().max() <= 1e-4
    assert torch.equal(before, model(**x).logits)
    assert not route.routed_models()


@pytest.mark.parametrize("family", ENCODER_DECODER_FAMILIES)
@pytest.mark.parametrize("group", ["decoder.self", "decoder.cross"])
@torch.no_grad()
def test_decoder_sites_that_never_ran_are_reported_and_refused(family, group):
    """Only the encoder runs: capture reports the decoder's sites as not run; ablating or
    hooking them is one line, never a silent no-op."""
    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    encoder_inputs = {k: v for k, v in x.items() if not k.startswith("decoder_")}
    with headscope.capture(model, sites=group) as cap:
        model.get_encoder()(**encoder_inputs)
    assert cap.patterns == {} and cap.not_run == [0, 1]
    for enter in (lambda: headscope.ablate(model, heads=[(0, 0)], sites=group),
                  lambda: headscope.model_hooks(model, {"layers.0.attn.hook_z": lambda z, hook: z * 0}, sites=group)):
        with pytest.raises(headscope.HeadscopeError, match=f"{group} layer 0 did nothing: its attention never ran") as err:
            with enter():
                model.get_encoder()(**encoder_inputs)
        assert "\n" not in str(err.value)
    assert not route.routed_models()


@torch.no_grad()
def test_a_group_the_model_lacks_or_one_with_two_sites_per_layer_is_refused():
    model = tiny_model("bart", kind="encoder_decoder")
    for group, message in (("decoder", "'decoder' holds several attention sites per layer"),
                           ("vision", "has no 'vision' attention sites; it has: encoder, encoder.self, decoder.self")):
        with pytest.raises(headscope.HeadscopeError, match=message) as err:
            with headscope.capture(model, sites=group):
                pass
        assert "\n" not in str(err.value)
    with pytest.raises(headscope.HeadscopeError, match="decoder.cross layer 2 is out of range: the decoder.cross sites'"):
        with headscope.ablate(model, heads=[(2, 0)], sites="decoder.cross"):
            pass
    assert not route.routed_models()


@torch.no_grad()
def test_hooks_cache_and_patch_address_cross_attention():
    """model_hooks, cache_activations and patch on bart's cross-attention: the pattern's keys are
    the encoder's positions, hook_result sums to the output projection, patching a head of one
    group leaves the table in that group's layers."""
    model = tiny_model("bart", kind="encoder_decoder")
    x = tiny_seq2seq_inputs("bart")
    before = model(**x).logits
    with headscope.cache_activations(model, ["layers.*.attn.hook_pattern", "layers.1.attn.hook_z"],
                                     sites="decoder.cross") as cache:
        model(**x)
    assert cache["layers.0.attn.hook_pattern"].shape == (2, 2, 7, 11)
    assert cache["layers.1.attn.hook_z"].shape == (2, 7, 2, 32)
    with headscope.model_hooks(model, {"layers.1.attn.hook_result": lambda r, hook: None}, sites="decoder.cross"):
        assert (model(**x).logits - before).abs().max() <= 1e-5
    corrupted = dict(x, input_ids=x["input_ids"].flip(1))
    metric = lambda logits: logits[:, -1, 5] - logits[:, -1, 6]
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-bart")
    table = headscope.patch(loaded, x, corrupted, metric, sites="decoder.cross")
    assert sorted(set(table.layer)) == [0, 1] and sorted(set(table["head"])) == [0, 1]
    assert table.effect.notna().all()
    assert not route.routed_models()


@pytest.mark.parametrize("family", [f for f in ENCODER_DECODER_FAMILIES if f != "whisper"])
def test_analyze_runs_the_encoder_of_a_token_family(family):
    """analyze's default sites are the encoder's (token ids): its two layers, its 4 heads, rows named
    by the encoder's modules."""
    from headscope.probes.kinds import TextProbe

    loaded = Loaded.from_model(tiny_model(family, kind="encoder_decoder"), char_tokenizer(), f"tiny-{family}")
    assert not loaded.causal and loaded.attention_layers == (0, 1)
    analysis = headscope.analyze(loaded, detectors=["previous_token", "sink"], probes=[TextProbe(n_examples=4, seq_len=24)],
                                 explorer_examples=1)
    assert sorted(set(analysis.scores.layer)) == [0, 1] and len(analysis.scores) == 2 * 2 * 4
    assert set(analysis.scores.site) == {select(loaded.model, "encoder").sites[layer].name for layer in (0, 1)}
    assert analysis.scores.score.notna().all()


def test_whispers_encoder_is_refused_by_analyze_in_one_line():
    """whisper's encoder takes log-mel features, so analyze refuses it, naming the decoder's
    groups it runs at instead (tests/analysis/test_whisper_decoder_sites.py)."""
    from headscope.probes.kinds import TextProbe

    whisper = Loaded.from_model(tiny_model("whisper", kind="encoder_decoder"), char_tokenizer(), "tiny-whisper")
    with pytest.raises(headscope.HeadscopeError, match="analyze of whisper's encoder is not available .*"
                                                       "sites='decoder.self' or 'decoder.cross'") as err:
        headscope.analyze(whisper, detectors=["sink"], probes=[TextProbe(n_examples=2, seq_len=8)])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", ENCODER_DECODER_FAMILIES)
def test_family_table_names_the_groups_each_model_has(family):
    from headscope.hf.families import family_table
    from headscope.hf.sites import group_names

    row = next(r for r in family_table() if r.model_type == family)
    model = tiny_model(family, kind="encoder_decoder")
    assert row.sites.split(", ") == list(GROUPS)
    assert set(GROUPS) <= set(group_names(sites(model)))
    assert row.analyze == (family != "whisper")  # at the default group, the encoder
    assert row.analyze_sites == ("decoder.self, decoder.cross (silent audio)" if family == "whisper" else "")


@pytest.mark.parametrize("family", ENCODER_DECODER_FAMILIES)
@torch.no_grad()
def test_lazy_and_head_group_paths_of_cross_attention_are_the_maps(family):
    """Cross-attention's rectangular rows (7 decoder queries over the encoder's keys) through
    the fused kernel's LazyPattern and through head groups of 1: the same column, entropy and
    argmax as the map."""
    from headscope.attention.pattern import as_pattern

    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    reduce = lambda layer, pattern, mask: {"column": as_pattern(pattern).column(0),
                                           "entropy": as_pattern(pattern).entropy(),
                                           "argmax": as_pattern(pattern).argmax().float()}
    with headscope.capture(model, sites="decoder.cross", reduce=reduce) as maps:
        model(**x)
    with headscope.capture(model, sites="decoder.cross", reduce=reduce, lazy=True) as lazy:
        model(**x)
    with headscope.capture(model, sites="decoder.cross", reduce=reduce, chunk_heads=1) as groups:
        model(**x)
    for layer in (0, 1):
        for name, ref in maps.results[layer][0].items():
            torch.testing.assert_close(lazy.results[layer][0][name], ref, atol=1e-5, rtol=0)
            torch.testing.assert_close(groups.results[layer][0][name], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family, group", CASES)
@torch.no_grad()
def test_verify_every_group_agrees_with_the_models_eager_attention(family, group):
    """verify at each group: one row per layer of the group, named by its module path, within
    1e-4 of each site's output projection and 1e-5 of the model's own eager patterns."""
    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    table = headscope.verify(model, x, sites=group)
    assert list(table.layer) == [0, 1]
    assert list(table.site) == [select(model, group).sites[layer].name for layer in (0, 1)]
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5
    print(f"{family} {group}: output {table.max_abs_diff_output.max():.2e}, "
          f"pattern {table.max_abs_diff_pattern.max():.2e}")
    assert not route.routed_models()


def _site_call(model, x, site):
    """What one site's attention module received (its forward's inputs by name) and returned,
    and what its output projection produced, on the model's eager path."""
    module = model.get_submodule(site.name)
    seen = {}
    handles = [module.register_forward_pre_hook(lambda m, a, kw: seen.update(_named_inputs(m, a, kw)),
                                                with_kwargs=True),
               module.register_forward_hook(lambda m, a, out: seen.update(returned=out))]
    run_eager(model, x, handles)
    return seen


@pytest.mark.parametrize("family, group", CASES)
@torch.no_grad()
def test_from_hf_module_reproduces_a_site_from_its_captured_inputs(family, group):
    """from_hf on layer 1's site, run by hand on what the site received (its hidden states, its
    mask, at cross-attention the encoder's output as `context`; T5: plus the relative position
    bias the site returned, which its first layer computed; UMT5: the bias the site's own
    `compute_bias` gives): the site's own output (out projection included) and the model's eager
    pattern. Without the bias the pattern is off."""
    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    site = select(model, group).sites[1]
    seen = _site_call(model, x, site)
    mine = MultiHeadAttention.from_hf(model.get_submodule(site.name), model.config)
    assert mine.config.n_heads == _heads(family, group, model)
    assert mine.config.causal == (group == "decoder.self")
    mask = seen.get("attention_mask", seen.get("mask"))
    context = seen.get("key_value_states", seen.get("encoder_hidden_states"))
    core = model.get_submodule(site.name)
    if family == "umt5":  # its own bias in every self-attention layer, none at cross-attention
        T, S = seen["hidden_states"].shape[1], (seen["hidden_states"] if context is None else context).shape[1]
        bias = core.compute_bias(T, S) if core.has_relative_attention_bias else None
    else:
        bias = seen["returned"][1] if family in T5_LIKE else None
    additive = mask if bias is None else (bias if mask is None else bias + mask)
    got = {}
    with mine.hooks({"hook_k": lambda k, hook: got.update(k=k)}):
        out, pattern = mine(seen["hidden_states"], additive, context=context, return_pattern=True)
    theirs = _eager(model, x, group)[1]
    assert (out - seen["returned"][0]).abs().max() <= 1e-4
    assert (pattern - theirs).abs().max() <= 1e-5
    source = seen["hidden_states"] if context is None else context
    keys = core.get_submodule(KEYS[family])(source)  # (B, S, H * D)
    assert (got["k"].transpose(1, 2).flatten(2) - keys).abs().max() <= 1e-5
    if bias is not None and group != "decoder.cross":  # cross-attention's bias is zero
        _, unbiased = mine(seen["hidden_states"], mask, context=context, return_pattern=True)
        assert (unbiased - theirs).abs().max() > 1e-3


@pytest.mark.parametrize("family", ENCODER_DECODER_FAMILIES)
@torch.no_grad()
def test_verify_refuses_in_one_line_a_group_that_never_ran_or_missing_inputs(family):
    """The encoder skipped (its output handed over as encoder_outputs): verify at the encoder's
    sites is one line, never an empty or stale table; whisper without input_features too."""
    model = tiny_model(family, kind="encoder_decoder")
    x = tiny_seq2seq_inputs(family)
    encoder_inputs = {k: v for k, v in x.items() if not k.startswith("decoder_")}
    skipped = {k: v for k, v in x.items() if k != "input_ids" and k != "input_features"}
    skipped["encoder_outputs"] = model.get_encoder()(**encoder_inputs)
    calls = [(lambda: headscope.verify(model, skipped, sites="encoder"), "layer 0 .*never ran on these inputs")]
    if family == "whisper":
        calls.append((lambda: headscope.verify(model, {"input_ids": x["decoder_input_ids"]}),
                      r"verify needs inputs=\{'input_features'"))
    for call, message in calls:
        with pytest.raises(headscope.HeadscopeError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    assert not route.routed_models()


@pytest.mark.parametrize("group", ["decoder.self", "decoder.cross"])
def test_verify_command_takes_sites_and_teacher_forces_the_decoder(group, monkeypatch):
    """`headscope verify MODEL --sites decoder.cross` on a tiny T5 (whose decoder runs only with
    decoder_input_ids): the group's two layers, each named, within the tolerance."""
    from typer.testing import CliRunner

    import headscope.cli

    model = tiny_model("t5", kind="encoder_decoder")
    monkeypatch.setattr(headscope.cli.loader, "load",
                        lambda *a, **kw: Loaded.from_model(model, char_tokenizer(), "tiny-t5"))
    result = CliRunner().invoke(headscope.cli.app, ["verify", "tiny-t5", "--sites", group])
    assert result.exit_code == 0, result.output
    assert f"OK: all 2 layers of the {group} sites within 0.0001" in result.output
    assert all(select(model, group).sites[layer].name in result.output for layer in (0, 1))


@torch.no_grad()
def test_umt5s_own_bias_in_every_layer_is_read_from_its_call(monkeypatch):
    """Every UMT5 self-attention layer computes a relative position bias of its own (T5 hands its
    first layer's on) and keeps it: verify reads it from the layer's call to its attention
    function. Layer 1's bias is not layer 0's, and without the biases every layer's pattern is off."""
    model = tiny_model("umt5", kind="encoder_decoder")
    x = tiny_seq2seq_inputs("umt5")
    cores = [model.get_submodule(site.name) for site in select(model, "encoder").sites.values()]
    first, second = (core.compute_bias(6, 6) for core in cores)
    assert (first - second).abs().max() > 1e-2
    for group in ("encoder", "decoder.self"):
        table = headscope.verify(model, x, sites=group)
        assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5
    with_adapter_changed(monkeypatch, model, bias_in_call=False)
    for group in ("encoder", "decoder.self"):
        assert (headscope.verify(model, x, sites=group).max_abs_diff_pattern > 1e-3).all()
