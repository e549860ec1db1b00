"""analyze on Whisper's decoder sites: the decoder reads the text probes' tokens shifted right
behind its start token, the encoder the log-mel features of silence (`headscope.probes.audio`).

The reference is independent of headscope's input path: the silence comes from transformers'
own `WhisperFeatureExtractor` run on a zero waveform, the decoder's tokens are shifted by hand
from the probe's examples, and the maps are the model's eager `decoder_attentions` and
`cross_attentions`; the control twin is rebuilt here and read the same way. Also: the
encoder's group refused in one line naming the way out (library and CLI), validate refused in
one line, alignment left out at cross-attention with a note, the report and the CLI."""

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import headscope
from headscope.analysis import Analysis
from headscope.analysis.decoder_sites import silent_audio
from headscope.analysis.explorer import explorer_inputs, explorer_maps
from headscope.cli import app
from headscope.detectors.registry import defaults_for, get
from headscope.loading.control import CONTROL_SEED_OFFSET, random_twin
from headscope.loading.loader import Loaded
from headscope.probes.audio import SILENCE_LOG_MEL, silence_log_mel
from headscope.probes.base import ProbeBatch
from headscope.probes.copy import as_copy
from headscope.probes.kinds import CopyProbe, RepeatedProbe, TextProbe
from headscope.probes.tokens import display_tokens
from headscope.report.html import axis_tokens
from tests.support.planted import char_tokenizer
from tests.support.tiny import ENCODER_DECODER
from tests.support.pages import saved_and_rendered

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROBES = [TextProbe(n_examples=4, seq_len=24), RepeatedProbe(n_examples=4, repeat_len=6, repeats=3),
          CopyProbe(n_examples=4, seq_len=24)]
KIND = {"decoder.self": "causal", "decoder.cross": "cross"}
# tests/support/tiny.py's whisper with 10 encoder positions, not 6: the uniform detector reads
# rows of at least 8 keys, and cross-attention's keys are the encoder's positions.
MEL_BINS, FRAMES, POSITIONS = 8, 20, 10


def _loaded():
    from transformers import AutoConfig, WhisperForConditionalGeneration

    config = AutoConfig.for_model("whisper", **dict(ENCODER_DECODER["whisper"], max_source_positions=POSITIONS))
    assert config.num_mel_bins == MEL_BINS
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    return Loaded.from_model(model, char_tokenizer(), "tiny-whisper")


def _extractor_silence(n_mel_bins: int, n_frames: int) -> torch.Tensor:
    """`[1, mel bin, frame]` transformers' features of a zero waveform of `n_frames` hops."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=n_mel_bins)
    samples = n_frames * extractor.hop_length
    return extractor(np.zeros(samples), sampling_rate=16000, padding="max_length", max_length=samples,
                     return_tensors="pt").input_features


def test_the_silence_features_are_the_feature_extractors_of_a_zero_waveform():
    from transformers import WhisperFeatureExtractor

    for n_mel_bins in (MEL_BINS, 80):
        full = WhisperFeatureExtractor(feature_size=n_mel_bins)(np.zeros(16000), sampling_rate=16000,
                                                                return_tensors="pt").input_features  # 30 s: 3000
        assert full.shape == (1, n_mel_bins, 3000)
        torch.testing.assert_close(silence_log_mel(n_mel_bins, 3000), full[0], atol=1e-6, rtol=0)
    short = _extractor_silence(MEL_BINS, FRAMES)
    assert short.shape == (1, MEL_BINS, FRAMES)
    torch.testing.assert_close(silence_log_mel(MEL_BINS, FRAMES), short[0], atol=1e-6, rtol=0)
    assert SILENCE_LOG_MEL == pytest.approx(-1.5, abs=1e-12)  # (log10(1e-10) + 4) / 4


@torch.no_grad()
def _eager_means(model, sites, detector, settings, loaded):
    """Each head's mean over examples of the detector's formula on `model`'s eager maps, the
    encoder fed the extractor's silence and the decoder the probe's tokens shifted right by hand."""
    probe = settings.build(loaded, 0)
    ids = probe.input_ids  # (N, T)
    start = torch.full((ids.shape[0], 1), model.config.decoder_start_token_id, dtype=ids.dtype)
    decoder = torch.cat([start, ids[:, :-1]], dim=1)  # (N, T)
    features = _extractor_silence(MEL_BINS, FRAMES).expand(ids.shape[0], -1, -1)  # (N, mel, frames)
    ones = torch.ones_like(decoder, dtype=torch.bool)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        out = model(input_features=features, decoder_input_ids=decoder, decoder_attention_mask=ones.long(),
                    output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    if sites == "decoder.self":
        maps, batch = out.decoder_attentions, ProbeBatch(decoder, ones, True, probe.content_start + 1,
                                                         probe.token_counts)
    else:
        keys = torch.ones(ids.shape[0], POSITIONS, dtype=torch.bool)
        maps, batch = out.cross_attentions, ProbeBatch(decoder, ones, False, probe.content_start + 1,
                                                       probe.token_counts, key_mask=keys)
    return {layer: detector.score(pattern.float(), batch).nanmean(0) for layer, pattern in enumerate(maps)}


@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_whispers_decoder_sites_score_as_the_formulas_on_the_models_eager_maps(sites):
    loaded = _loaded()
    analysis = headscope.analyze(loaded, sites=sites, probes=PROBES, explorer_examples=1)
    twin = random_twin(loaded, CONTROL_SEED_OFFSET)  # the analysis's control (seed 0 + the offset)
    expected = [d for d in defaults_for(KIND[sites]) if get(d).probe in ("text", "repeated")]
    assert list(dict.fromkeys(analysis.scores.detector)) == expected
    if sites == "decoder.cross":
        assert expected == ["sink", "uniform"]  # the cross defaults less alignment, which reads the copy probe
        assert "nothing to copy" in analysis.meta["skipped_detectors"]["alignment"]
    assert "alignment" not in analysis.scores.detector.values
    worst = 0.0
    for name in expected:
        detector = get(name)
        settings = next(p for p in PROBES if p.name == detector.probe)
        reference = _eager_means(loaded.model, sites, detector, settings, loaded)
        control = _eager_means(twin.model, sites, detector, settings, loaded)
        rows = analysis.scores[analysis.scores.detector == name]
        assert rows.score.notna().all() and rows.control.notna().all(), name  # every head compared, none NaN
        for row in rows.itertuples(index=False):
            assert row.score == pytest.approx(float(reference[row.layer][row.head]), abs=1e-5), (name, row)
            assert row.control == pytest.approx(float(control[row.layer][row.head]), abs=1e-5), (name, row)
            worst = max(worst, abs(row.score - float(reference[row.layer][row.head])),
                        abs(row.control - float(control[row.layer][row.head])))
    assert worst < 1e-5
    view = loaded.at(sites)
    assert analysis.n_heads == view.n_heads == 2 and sorted(set(analysis.scores.layer)) == [0, 1]
    described = f"{MEL_BINS} mel bins x {FRAMES} frames, {POSITIONS} encoder positions"
    assert analysis.meta["sites"]["group"] == sites and described in analysis.meta["sites"]["encoder_input"]
    assert "silence log-mel" in analysis.meta["sites"]["encoder_input"]
    note = next(n for n in analysis.meta["notes"] if n.startswith("encoder input: silence log-mel"))
    assert "control twin" in note
    assert ("left out: alignment" in note) == (sites == "decoder.cross")
    assert all("hears silence" in p["description"] for p in analysis.meta["probes"].values())
    if sites == "decoder.self":  # the decoder's own tokens: the OV table of its heads
        assert not analysis.meta["ov"]["skipped"] and len(analysis.ov) == 2 * 2
    else:  # values from audio: no token embedding to read through them
        assert analysis.ov is None and "audio encoder's outputs" in analysis.meta["ov"]["skipped"]
        assert any(n.startswith("OV copying not computed: cross-attention's values") for n in analysis.meta["notes"])


@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_the_explorer_keeps_the_models_own_maps_and_the_report_renders(sites, tmp_path):
    """The explorer's maps are the model's eager maps on the silent features and the shifted
    tokens; at cross-attention the keys are the silence's encoder positions; saved, loaded and
    rendered, the page carries both axes."""
    loaded = _loaded()
    text = TextProbe(n_examples=4, seq_len=24)
    analysis = headscope.analyze(loaded, detectors=["sink", "uniform"], sites=sites, probes=[text],
                                 explorer_examples=2, explorer_len=20, control="none")
    ids = text.build(loaded, 0).input_ids
    start = torch.full((2, 1), loaded.model.config.decoder_start_token_id, dtype=ids.dtype)
    target = torch.cat([start, ids[:2, :19]], dim=1)  # the explorer's 20 decoder tokens: start, then shifted
    model = loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_features=_extractor_silence(MEL_BINS, FRAMES).expand(2, -1, -1),
                        decoder_input_ids=target, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    eager = torch.stack(out.decoder_attentions if sites == "decoder.self" else out.cross_attentions, dim=1)
    view = loaded.at(sites)
    copy = as_copy(text.build(loaded, 0), model.config.decoder_start_token_id, silent_audio(view))
    inputs, queries, keys = explorer_inputs(view, copy, 2, 20)
    assert keys is None and queries.tolist() == target.tolist()
    torch.testing.assert_close(explorer_maps(view, inputs), eager.float(), atol=1e-5, rtol=0)  # (N, L, H, Tq, Tk)
    silence = [f"silence {j}" for j in range(POSITIONS)]
    for i, example in enumerate(analysis.examples):
        assert np.abs(example.patterns.astype(float) - eager[i].numpy() * 255).max() <= 0.5 + 1e-3  # uint8 rounding
        assert example.tokens == display_tokens(loaded.tokenizer, target[i].tolist())
        assert example.key_tokens == (silence if sites == "decoder.cross" else None)

    again, page, payload = saved_and_rendered(analysis, tmp_path / "a")
    assert again.meta["sites"] == analysis.meta["sites"]
    for shown, example in zip(payload["examples"], again.examples):
        assert (shown["tokens"], shown["ticks"]) == axis_tokens(example.tokens)
        if sites == "decoder.cross":
            assert (shown["m"], shown["keyTokens"]) == (POSITIONS, axis_tokens(silence)[0])
        else:
            assert "keyTokens" not in shown
    assert f"{sites} (" in page and "silence log-mel" in page


def test_the_encoder_validate_and_alignment_are_refused_in_one_line():
    loaded = _loaded()
    for sites in (None, "encoder"):
        with pytest.raises(headscope.HeadscopeError, match="analyze of whisper's encoder is not available .*"
                                                           "sites='decoder.self' or 'decoder.cross'") as err:
            headscope.analyze(loaded, sites=sites, detectors=["sink"], probes=PROBES)
        assert "\n" not in str(err.value)
    with pytest.raises(headscope.HeadscopeError, match="validate is not available at tiny-whisper's decoder") as err:
        headscope.analyze(loaded, sites="decoder.self", probes=PROBES, validate=True)
    assert "\n" not in str(err.value)
    analysis = headscope.analyze(loaded, sites="decoder.cross", detectors=["sink"], probes=PROBES,
                                 explorer_examples=0, control="none")
    with pytest.raises(headscope.HeadscopeError, match="validate is not available") as err:
        headscope.validate(loaded, analysis)
    assert "\n" not in str(err.value)
    with pytest.raises(headscope.HeadscopeError, match="copy probe's decoder copies .*nothing to copy") as err:
        headscope.analyze(loaded, sites="decoder.cross", detectors=["alignment"], probes=PROBES)
    assert "\n" not in str(err.value)


def test_the_command_line_analyses_the_decoder_and_refuses_the_encoder_in_one_line(tmp_path):
    loaded = _loaded()
    folder = tmp_path / "whisper"
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    out = tmp_path / "report"
    common = ["--n-examples", "4", "--seq-len", "24", "--repeat-len", "6", "--device", "cpu", "--plotlyjs", "cdn",
              "--no-cache"]
    result = CliRunner().invoke(app, ["analyze", str(folder), "--sites", "decoder.self", "--out", str(out), *common])
    assert result.exit_code == 0, result.output
    assert " at its decoder.self sites (causal): 2 layers x 2 heads" in result.output
    saved = Analysis.load(out)
    assert saved.meta["sites"]["group"] == "decoder.self" and "silence log-mel" in saved.meta["sites"]["encoder_input"]
    assert (out / "index.html").exists()
    cross = tmp_path / "cross"
    result = CliRunner().invoke(app, ["analyze", str(folder), "--sites", "decoder.cross", "--out", str(cross), *common])
    assert result.exit_code == 0, result.output
    assert list(dict.fromkeys(Analysis.load(cross).scores.detector)) == ["sink", "uniform"]
    for extra in ([], ["--sites", "encoder"]):
        bad = CliRunner().invoke(app, ["analyze", str(folder), "--out", str(tmp_path / "never"), *common, *extra])
        assert bad.exit_code == 1 and not (tmp_path / "never").exists()
        lines = bad.output.strip().splitlines()
        assert lines[-1].startswith("error: analyze of whisper's encoder is not available") and "--sites" in lines[-1]
        assert "Traceback" not in bad.output and not any(l.startswith("error:") for l in lines[:-1])
