"""BartForCausalLM: bart's decoder alone, a causal LM (`config.is_encoder_decoder` False), and the
ForCausalLM of the bart-like families (`FAMILIES`: the same decoder, the `bart_causal_lm` adapter).

Every layer holds causal self-attention (the default group, "text.self") and cross-attention
over `encoder_hidden_states` ("text.cross"), which a causal LM's forward is rarely given. The
references are the model's own: its default attention's logits, its eager `attentions`, and a
pre-hook zeroing a head's slice of the output projection's input. The encoder and decoder are
built with different depths and head counts, so a count read from the encoder's side of the
config shows."""
import pytest
import torch

import headscope
from headscope.detectors.registry import get
from headscope.hf import route
from headscope.hf.adapters import family_of
from headscope.hf.families import family_table
from headscope.hf.sites import select, sites
from headscope.loading.loader import Loaded
from headscope.probes.kinds import RepeatedProbe, TextProbe
from headscope.report import render_html
from tests.support.contracts import head_zeroed_at
from tests.support.planted import char_tokenizer
from tests.support.tiny import DECODER_HEADS, DECODER_LAYERS, tiny_decoder_alone

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")



# Every family whose ForCausalLM is bart's decoder alone (m2m_100 has none).
FAMILIES = ("bart", "marian", "pegasus", "blenderbot", "blenderbot-small", "mbart", "plbart")


def _inputs():
    torch.manual_seed(1)
    ids = torch.randint(3, 99, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask}


@torch.no_grad()
def _eager(model, x):
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        return model(**x, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)


@pytest.mark.parametrize("family", FAMILIES)
def test_its_sites_are_the_decoders_self_and_cross_attention(family):
    model = tiny_decoder_alone(family)
    assert type(model).__name__.endswith("ForCausalLM") and family_of(model.config) == "bart_causal_lm"
    found = sites(model)
    assert [(s.name, s.kind, s.stack, s.layer) for s in found[:2]] == [
        ("model.decoder.layers.0.self_attn", "self", "text", 0), ("model.decoder.layers.0.encoder_attn", "cross", "text", 0)]
    assert len(found) == 2 * DECODER_LAYERS
    default = select(model)
    assert (default.group, default.n_heads, default.layers) == ("text.self", DECODER_HEADS, [0, 1, 2])
    assert all(model.get_submodule(site.name) is model.model.decoder.layers[layer].self_attn
               for layer, site in default.sites.items())
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-bart-lm")
    assert (loaded.n_layers, loaded.n_heads, loaded.causal, loaded.site_kind) == (DECODER_LAYERS, DECODER_HEADS, True,
                                                                                   "causal")
    row = next(r for r in family_table() if r.model_type == "bart_causal_lm")
    assert (row.capture, row.verify, row.analyze, row.sites) == (True, True, True, "text.self, text.cross")


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_capture_keeps_the_output_and_gives_the_eager_maps_and_cross_attention_did_not_run(family):
    model = tiny_decoder_alone(family)
    x = _inputs()
    before = model(**x).logits
    with headscope.capture(model) as cap:
        routed = model(**x).logits
    reference = _eager(model, x)
    assert (routed - before).abs().max() <= 1e-4
    assert sorted(cap.patterns) == list(range(DECODER_LAYERS)) and cap.not_run == []
    valid = x["attention_mask"].bool()  # padded queries' rows are not compared
    for layer, theirs in enumerate(reference.attentions):
        assert (cap.patterns[layer] - theirs).abs().permute(0, 2, 1, 3)[valid].max() <= 1e-5
    with headscope.capture(model, sites="text.cross") as cross:
        model(**x)
    assert cross.patterns == {} and cross.not_run == [0, 1, 2]
    with pytest.raises(headscope.HeadscopeError, match="never ran"):
        with headscope.ablate(model, heads=[(0, 0)], sites="text.cross"):
            model(**x)
    assert not route.routed_models()


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_ablation_is_zeroing_the_heads_slice_of_the_output_projections_input_and_restores_the_model(family):
    model = tiny_decoder_alone(family)
    x = _inputs()
    layer, head = 1, 1
    before = model(**x).logits
    with headscope.ablate(model, heads=[(layer, head)]):
        ablated = model(**x).logits
    with head_zeroed_at(model.model.decoder.layers[layer].self_attn.out_proj, head, DECODER_HEADS):
        reference = model(**x).logits
    assert (ablated - before).abs().max() > 1e-3
    assert (ablated - reference).abs().max() <= 1e-4
    assert torch.equal(before, model(**x).logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_agrees_with_the_models_own_attention(family):
    rows = headscope.verify(tiny_decoder_alone(family), _inputs())
    assert rows.layer.tolist() == list(range(DECODER_LAYERS))
    assert rows.max_abs_diff_output.max() <= 1e-4 and rows.max_abs_diff_pattern.max() <= 1e-5


def test_analyze_scores_are_the_detectors_formulas_on_the_eager_maps_and_the_report_renders(tmp_path):
    model = tiny_decoder_alone()
    loaded = Loaded.from_model(model, char_tokenizer(), "tiny-bart-lm")
    probes = [TextProbe(n_examples=4, seq_len=24), RepeatedProbe(n_examples=4, repeat_len=6, repeats=3)]
    analysis = headscope.analyze(loaded, detectors=["previous_token", "induction"], probes=probes, explorer_examples=1)
    assert set(analysis.scores.layer) == set(range(DECODER_LAYERS))
    assert set(analysis.scores.site) == {f"model.decoder.layers.{layer}.self_attn" for layer in range(DECODER_LAYERS)}
    for name, settings in (("previous_token", probes[0]), ("induction", probes[1])):
        detector = get(name)
        probe = settings.build(loaded, 0)
        per_layer = {}
        for batch in probe.batches(8, True, "cpu"):
            maps = _eager(model, {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask.long()}).attentions
            for layer, pattern in enumerate(maps):
                per_layer.setdefault(layer, []).append(detector.score(pattern.float(), batch))
        rows = analysis.scores[analysis.scores.detector == name].set_index(["layer", "head"]).score
        for layer, parts in per_layer.items():
            mean = torch.cat(parts).nanmean(0)
            for head in range(DECODER_HEADS):
                assert rows[(layer, head)] == pytest.approx(float(mean[head]), abs=1e-5)
    folder = analysis.save(tmp_path / "a")
    page = render_html(headscope.Analysis.load(folder), plotlyjs="cdn")
    assert "tiny-bart-lm" in page and "model.decoder.layers.2.self_attn" in page
