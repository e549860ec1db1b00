"""analyze on an encoder-decoder's decoder sites (`sites="decoder.self"`, `"decoder.cross"`):
each probe read as a teacher-forced copy (the encoder reads the example, the decoder the same
tokens shifted right), the detectors of the sites' kind, scores equal to the detectors' formulas
on the model's own eager attention maps (`decoder_attentions`, `cross_attentions`), the control
twin looking at the same group, the group recorded in meta.json, the report and the CLI, and
the head explorer's maps with the decoder's tokens as queries and, at cross-attention, the
encoder's as keys."""

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import headscope
from headscope.analysis import Analysis
from headscope.analysis.explorer import explorer_inputs, explorer_maps
from headscope.cli import app
from headscope.detectors.registry import defaults_for, get
from headscope.loading.loader import Loaded
from headscope.probes.copy import as_copy
from headscope.probes.kinds import CopyProbe, RepeatedProbe, TextProbe, decoder_start
from headscope.probes.tokens import display_tokens
from headscope.report import render_html
from headscope.report.html import axis_tokens
from tests.support.planted import char_tokenizer
from tests.support.tiny import ENCODER_DECODER_FAMILIES, tiny_config, tiny_model
from tests.support.pages import saved_and_rendered

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROBES = [TextProbe(n_examples=4, seq_len=24), RepeatedProbe(n_examples=4, repeat_len=6, repeats=3),
          CopyProbe(n_examples=4, seq_len=24)]
KIND = {"decoder.self": "causal", "decoder.cross": "cross"}
# The encoder-decoders whose encoder reads token ids (whisper's decoder sites: test_whisper_decoder_sites.py).
TOKEN_FAMILIES = tuple(f for f in ENCODER_DECODER_FAMILIES if f != "whisper")


def _loaded(family):
    return Loaded.from_model(tiny_model(family, kind="encoder_decoder"), char_tokenizer(), f"tiny-{family}")


@torch.no_grad()
def _eager_means(loaded, sites, detector, probe_settings):
    """Each head's mean over examples of the detector's formula on the model's eager maps."""
    model = loaded.model
    probe = as_copy(probe_settings.build(loaded, 0), decoder_start(loaded))
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    values = {}
    try:
        for batch in probe.batches(8, True, "cpu"):
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(),
                        decoder_input_ids=batch.decoder_input_ids,
                        decoder_attention_mask=batch.decoder_attention_mask.long(), output_attentions=True)
            maps = out.decoder_attentions if sites == "decoder.self" else out.cross_attentions
            for layer, pattern in enumerate(maps):
                score = detector.score(pattern.float(), batch.for_site(KIND[sites]))  # (B, H)
                values.setdefault(layer, []).append(score)
    finally:
        model.set_attn_implementation(previous)
    return {layer: torch.cat(parts).nanmean(0) for layer, parts in values.items()}


@pytest.mark.parametrize("family", TOKEN_FAMILIES)
@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_decoder_sites_score_as_the_formulas_on_the_models_eager_maps(family, sites):
    loaded = _loaded(family)
    analysis = headscope.analyze(loaded, sites=sites, probes=PROBES, explorer_examples=1)
    view = loaded.at(sites)
    expected_detectors = [d for d in defaults_for(KIND[sites]) if get(d).probe in ("text", "repeated", "copy")]
    assert list(dict.fromkeys(analysis.scores.detector)) == expected_detectors
    assert analysis.n_heads == view.n_heads and sorted(set(analysis.scores.layer)) == list(view.attention_layers)
    for name in expected_detectors:
        detector = get(name)
        settings = next(p for p in PROBES if p.name == detector.probe)
        reference = _eager_means(loaded, sites, detector, settings)
        rows = analysis.scores[analysis.scores.detector == name]
        for row in rows.itertuples(index=False):
            assert row.score == pytest.approx(float(reference[row.layer][row.head]), abs=1e-5), (name, row.layer, row.head)
    assert analysis.scores.control.notna().all()  # the twin scored the same group
    assert analysis.meta["sites"]["group"] == sites and analysis.meta["sites"]["kind"] == KIND[sites]
    assert [e.probe for e in analysis.examples] == list(dict.fromkeys(d.probe for d in map(get, expected_detectors)))
    assert all((e.key_tokens is not None) == (sites == "decoder.cross") for e in analysis.examples)
    assert any(note.startswith(f"sites: {sites}") for note in analysis.meta["notes"])
    assert not any("explorer" in note for note in analysis.meta["notes"])


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_the_explorer_keeps_the_models_own_maps_with_each_axis_tokens(family, sites, tmp_path):
    """The explorer's maps are the model's eager `decoder_attentions` / `cross_attentions` on the
    same examples; the queries are the decoder's tokens (its start token, then the example shifted
    right by one) and cross-attention's keys the encoder's; both survive saving and reach the page."""
    loaded = _loaded(family)
    text = TextProbe(n_examples=4, seq_len=24)
    analysis = headscope.analyze(loaded, detectors=["sink"], sites=sites, probes=[text], explorer_examples=2,
                                 explorer_len=20, control="none")
    copy = as_copy(text.build(loaded, 0), decoder_start(loaded))
    source, target = copy.input_ids[:2, :20], copy.decoder_input_ids[:2, :20]
    model = loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=source, attention_mask=torch.ones_like(source), decoder_input_ids=target,
                        decoder_attention_mask=torch.ones_like(target), output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    eager = torch.stack(out.decoder_attentions if sites == "decoder.self" else out.cross_attentions, dim=1)
    view = loaded.at(sites)
    inputs, queries, keys = explorer_inputs(view, copy, 2, 20)
    torch.testing.assert_close(explorer_maps(view, inputs), eager.float(), atol=1e-5, rtol=0)  # (N, L, H, Tq, Tk)

    assert [(e.probe, e.index) for e in analysis.examples] == [("text", 0), ("text", 1)]
    start = display_tokens(loaded.tokenizer, [decoder_start(loaded)])
    for i, example in enumerate(analysis.examples):
        assert np.abs(example.patterns.astype(float) - eager[i].numpy() * 255).max() <= 0.5 + 1e-3  # uint8 rounding
        encoder = display_tokens(loaded.tokenizer, source[i].tolist())
        assert example.tokens == display_tokens(loaded.tokenizer, target[i].tolist())
        assert example.tokens == start + encoder[:-1]  # the decoder reads the encoder's tokens one later
        assert example.key_tokens == (encoder if sites == "decoder.cross" else None)
    assert keys is None if sites == "decoder.self" else keys.tolist() == source.tolist()

    again, page, payload = saved_and_rendered(analysis, tmp_path / "a")
    for shown, example in zip(payload["examples"], again.examples):
        assert (shown["tokens"], shown["ticks"]) == axis_tokens(example.tokens)
        if sites == "decoder.cross":
            assert (shown["m"], shown["keyTokens"], shown["keyTicks"]) == (20, *axis_tokens(example.key_tokens))
        else:
            assert "keyTokens" not in shown
    assert ("query × 20 key tokens" in page) == (sites == "decoder.cross")


@pytest.mark.parametrize("family", ["mbart", "plbart"])
def test_a_decoder_without_a_start_token_is_refused_in_one_line(family):
    """mBART and PLBart configs name no decoder_start_token_id by default (the model starts its
    decoder from the language code at the end of the labels): analyze at the decoder's sites and
    the teacher forcing of `headscope verify` refuse in one line rather than guess a start token;
    `headscope.verify` on token ids alone runs the model's own shift and agrees with it."""
    import transformers as tf

    from headscope.hf.verify import teacher_forced

    config = tiny_config(family, "encoder_decoder")
    config.decoder_start_token_id = None
    torch.manual_seed(0)
    model = tf.AutoModelForSeq2SeqLM.from_config(config).eval()
    assert model.generation_config.decoder_start_token_id is None
    loaded = Loaded.from_model(model, char_tokenizer(), f"tiny-{family}")
    ids = {"input_ids": torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(0))}
    calls = [(lambda: headscope.analyze(loaded, detectors=["sink"], sites="decoder.cross", probes=PROBES[:1]),
              f"tiny-{family} has no decoder_start_token_id"),
             (lambda: teacher_forced(model, ids), "needs decoder_input_ids, and it has no decoder_start_token_id")]
    for call, message in calls:
        with pytest.raises(headscope.HeadscopeError, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    table = headscope.verify(model, ids, sites="decoder.cross")
    assert list(table.layer) == [0, 1]
    assert table.max_abs_diff_output.max() <= 1e-4 and table.max_abs_diff_pattern.max() <= 1e-5


def test_the_treebank_probe_cannot_feed_a_decoder_and_says_so():
    analysis = headscope.analyze(_loaded("bart"), sites="decoder.self", probes=PROBES, explorer_examples=0)
    assert "syntactic" in analysis.meta["skipped_detectors"]
    assert "cannot feed an encoder-decoder's decoder" in analysis.meta["skipped_detectors"]["syntactic"]
    with pytest.raises(headscope.HeadscopeError, match="treebank probe cannot feed") as err:
        headscope.analyze(_loaded("bart"), detectors=["syntactic"], sites="decoder.self")
    assert "\n" not in str(err.value)


def test_a_detector_that_does_not_read_cross_attention_is_refused_in_one_line():
    with pytest.raises(headscope.HeadscopeError, match="'previous_token' needs .*decoder.cross sites are cross") as err:
        headscope.analyze(_loaded("bart"), detectors=["previous_token"], sites="decoder.cross", probes=PROBES)
    assert "\n" not in str(err.value)
    gemma3 = Loaded.from_model(tiny_model("gemma3", kind="composite"), char_tokenizer(), "tiny-gemma3")
    with pytest.raises(headscope.HeadscopeError, match="never reach vision sites .*capture, ablate") as err:
        headscope.analyze(gemma3, sites="vision", detectors=["sink"], probes=PROBES)
    assert "\n" not in str(err.value)
    with pytest.raises(headscope.HeadscopeError, match="no 'decoder.cross' attention sites"):
        headscope.analyze(Loaded.from_model(tiny_model("llama"), char_tokenizer(), "tiny-llama"), sites="decoder.cross")


def test_the_default_sites_are_the_encoder_as_before():
    loaded = _loaded("bart")
    assert loaded.at(None) is loaded and loaded.at("encoder") is loaded
    view = loaded.at("decoder.self")
    assert view.at(None).sites is None and not view.at(None).causal
    assert (view.causal, view.site_kind, view.n_heads) == (True, "causal", 2)
    assert (loaded.at("decoder.cross").causal, loaded.at("decoder.cross").site_kind) == (False, "cross")


def test_a_decoder_sites_analysis_saves_loads_renders_and_runs_from_the_cli(tmp_path):
    loaded = _loaded("bart")
    analysis = headscope.analyze(loaded, sites="decoder.cross", probes=PROBES, explorer_examples=0)
    analysis.save(tmp_path / "a")
    again = Analysis.load(tmp_path / "a")
    assert again.meta["sites"] == analysis.meta["sites"]
    page = render_html(again, plotlyjs="cdn")
    assert "decoder.cross (cross): model.decoder.layers.0.encoder_attn" in page
    folder = tmp_path / "bart"
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["analyze", str(folder), "--sites", "decoder.cross", "--out", str(out),
                                      "--n-examples", "4", "--seq-len", "24", "--repeat-len", "6", "--device", "cpu",
                                      "--plotlyjs", "cdn", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert " at its decoder.cross sites (cross): 2 layers x 2 heads" in result.output
    assert Analysis.load(out).meta["sites"]["group"] == "decoder.cross"
    from tests.support.planted_cross import planted_bart

    planted = tmp_path / "planted"  # tiny random bart labels no head: the planted one labels all six
    planted_bart(0).save_pretrained(planted)
    loaded.tokenizer.save_pretrained(planted)
    checked = tmp_path / "checked"
    result = CliRunner().invoke(app, ["analyze", str(planted), "--sites", "decoder.cross", "--validate", "--out",
                                      str(checked), "--detectors", "alignment,sink,uniform", "--n-examples", "8",
                                      "--seq-len", "32", "--device", "cpu", "--plotlyjs", "cdn", "--no-cache",
                                      "--control", "none"])
    assert result.exit_code == 0, result.output
    validation = Analysis.load(checked).validation
    assert list(dict.fromkeys(validation["label"])) == ["alignment", "uniform"]
    assert set(validation["metric"]) == {"copy_token_loss"}
    bad = CliRunner().invoke(app, ["analyze", str(folder), "--sites", "decoder.cross", "--geometry", "--out",
                                   str(tmp_path / "never"), "--device", "cpu"])
    assert bad.exit_code != 0 and "--sites" in bad.output and not (tmp_path / "never").exists()


@pytest.mark.parametrize("seed", [0, 1])
def test_analyze_finds_the_planted_alignment_head_at_the_cross_sites(seed):
    """The alignment detector through analyze (headscope's kernel, the random-init twin's bar):
    the planted cross-attention head 0.0 (decoder i attends encoder i) is labelled alignment,
    no other head is, and the untrained twin's best head stays far below it."""
    from tests.support.planted_cross import planted_bart

    loaded = Loaded.from_model(planted_bart(seed), char_tokenizer(), "planted-bart")
    analysis = headscope.analyze(loaded, detectors=["alignment", "sink", "uniform"], sites="decoder.cross",
                                 probes=[CopyProbe(n_examples=16, seq_len=48), TextProbe(n_examples=16, seq_len=48)],
                                 explorer_examples=1)
    for example in analysis.examples:  # the explorer shows the planted head: decoder i on encoder i
        assert example.pattern(0, 0).argmax(-1).tolist() == list(range(48))
    rows = analysis.scores[analysis.scores.detector == "alignment"].set_index(["layer", "head"])
    assert rows.loc[(0, 0), "score"] > 0.99 and rows.loc[(0, 0), "ci_low"] > rows.loc[(0, 0), "control_max"]
    labelled = analysis.labels[analysis.labels.labels.str.contains("alignment")]
    assert [(int(r.layer), int(r.head)) for r in labelled.itertuples()] == [(0, 0)]
    assert rows.loc[(0, 0), "control_max"] < 0.3


def test_the_docs_list_each_site_kinds_default_detectors():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    for kind, words in (("causal", "causal self-attention"), ("bidirectional", "bidirectional self-attention"),
                        ("cross", "cross-attention (`decoder.cross`)")):
        line = next(l for l in readme.splitlines() if l.startswith(f"- {words}"))
        assert line.split(": ", 1)[1].split(", ") == defaults_for(kind)


def test_compare_does_not_pair_heads_of_different_sites():
    from headscope.report.compare import compare_data

    loaded = _loaded("bart")
    self_sites = headscope.analyze(loaded, sites="decoder.self", probes=PROBES, explorer_examples=0)
    cross_sites = headscope.analyze(loaded, sites="decoder.cross", probes=PROBES, explorer_examples=0)
    assert (self_sites.n_layers, self_sites.n_heads) == (cross_sites.n_layers, cross_sites.n_heads)
    data = compare_data(self_sites, cross_sites)
    assert not data.same_shape and data.changed == () and data.diffs == ()
    assert any("different attention sites (a: decoder.self; b: decoder.cross)" in note for note in data.notes)
    assert compare_data(cross_sites, cross_sites).same_shape


@pytest.mark.parametrize("family, out", [("bart", "out_proj"), ("t5", "o")])
@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_the_ov_table_is_the_groups_heads_read_from_their_own_weights(family, out, sites):
    """Analysis.ov of a decoder group: one row per head of the group, each eigenvalue share the
    one computed in the test from that site's value and output projections (norms not folded)."""
    from headscope.head_geometry.ov_circuit import ov_scores

    loaded = _loaded(family)
    analysis = headscope.analyze(loaded, detectors=["sink"], sites=sites, probes=PROBES, explorer_examples=0)
    view = loaded.at(sites)
    assert not analysis.meta["ov"]["skipped"] and analysis.meta["ov"]["fold_norms"] is False
    assert len(analysis.ov) == len(view.attention_layers) * view.n_heads
    model = loaded.model
    W_E = model.get_input_embeddings().weight.float()
    W_U = model.get_output_embeddings().weight.float().T
    modules = dict(model.named_modules())
    value = "v_proj" if family == "bart" else "v"
    for row in analysis.ov.itertuples(index=False):
        site = modules[view.selection.sites[row.layer].name]
        v, o = getattr(site, value).weight.float(), getattr(site, out).weight.float()
        d = o.shape[1] // view.n_heads
        _, share = ov_scores(W_E, v[row.head * d:(row.head + 1) * d].T, o[:, row.head * d:(row.head + 1) * d].T, W_U,
                             rows=torch.zeros(0, dtype=torch.long))
        assert row.positive_eig_share == pytest.approx(share, abs=1e-6)
    assert analysis.ov.control_positive_eig_share.notna().all()  # the twin's same group
