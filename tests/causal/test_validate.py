"""Causal checks: ablating the heads a detector found, against random heads of the same layers.

Ground truth is the planted model (its induction head 1.0 alone predicts repeated sequences);
the real SmolLM2-135M must agree with the literature (slow)."""
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import headscope
from headscope.analysis import Analysis
from headscope.loading.loader import Loaded
from headscope.analysis.analyze import analyze
from headscope.causal import (
    COLUMNS, EvalProbe, ProbeRunner, icl_positions, icl_score, read_csv, validate, write_csv,
)
from headscope.detectors.measure import masked_for_lm
from headscope.causal.validate import _random_draws, _row
from headscope.probes.base import repeat_periods
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from headscope.probes.treebank import eval_sentences
from tests.support.planted import PLANTED

SMALL = dict(probes=[TextProbe(4, 40), RepeatedProbe(4, 10, 4)])
PROBES = dict(probes=[TextProbe(seq_len=40), RepeatedProbe(repeat_len=10, repeats=4)])


@pytest.fixture(scope="module")
def planted_analysis_to_validate(planted):
    return analyze(planted, explorer_examples=0, **SMALL)


@pytest.fixture(scope="module")
def planted_validation(planted, planted_analysis_to_validate):
    return validate(planted, planted_analysis_to_validate, n_examples=4, n_random=3, **PROBES)


def _rows(frame, label):
    return frame[frame["label"] == label].set_index("mode")


# --- the planted model ----------------------------------------------------------------------

def test_planted_induction_head_alone_predicts_the_repeats(planted):
    probe = RepeatedProbe(4, repeat_len=10, repeats=3).eval_probe(planted, 4, seed=0)  # [BOS] + 30, periods 10..7
    assert probe.input_ids.shape == (4, 31)
    for row, period in enumerate(repeat_periods(4, 10)):  # from the 2nd token of copy 2 on
        assert probe.scored[row, :period + 2].sum() == 0 and probe.scored[row, period + 2:].all()
    runner = ProbeRunner(planted, probe)
    assert runner.baseline.accuracy == 1.0 and runner.baseline.value < 0.01
    for mode in ("zero", "mean"):
        removed = runner.measure([(1, 0)], mode)
        assert removed.accuracy == 0.0 and removed.value > 5
        other = runner.measure([(1, 2)], mode)
        assert other.accuracy == 1.0 and other.value == pytest.approx(runner.baseline.value, abs=1e-6)


@pytest.mark.slow  # planted_validation (analyze, then ablations per label and mode) takes 25-30 s
def test_validate_on_planted_says_induction_hurts_more(planted_validation):
    rows = _rows(planted_validation, "induction")
    assert list(planted_validation.columns) == COLUMNS
    for mode in ("zero", "mean"):
        row = rows.loc[mode]
        assert row.heads == "1.0" and row.n_heads == 1 and row.metric == "next_token_loss" and row.probe == "repeated"
        assert row.baseline_accuracy == 1.0 and row.ablated_accuracy == 0.0
        assert row.delta > 5 and row.hurts_more
        # Controls: one head of layer 1, never the induction head; none of them writes anything.
        draws = row.random_heads.split("|")
        assert len(draws) == 3 and all(d in ("1.1", "1.2", "1.3") for d in draws)
        assert [float(d) for d in row.random_deltas.split(";")] == [0.0, 0.0, 0.0]
        assert row.ratio == math.inf and row.primary == (mode == "mean")


@pytest.mark.slow
def test_validate_checks_every_planted_label_once_per_mode(planted_validation):
    frame = planted_validation
    assert set(frame["label"]) == set(PLANTED.values()) | {"icl_score"}
    assert not {"none", "mixed"} & set(frame["label"])
    assert frame.groupby("label").size().eq(2).all()
    assert list(frame["label"][:4]) == ["induction", "induction", "icl_score", "icl_score"]
    for head, label in PLANTED.items():
        assert set(_rows(frame, label)["heads"]) == {f"{head[0]}.{head[1]}"}
        assert set(_rows(frame, label)["sites"]) == {f"transformer.h.{head[0]}.attn"}  # the planted GPT-2's module
    assert set(_rows(frame, "previous_token")["probe"]) == {"text"}
    assert set(_rows(frame, "duplicate_token")["probe"]) == {"repeated"}
    # Previous-token head 0.0 feeds the induction head: removing it breaks text prediction.
    assert _rows(frame, "previous_token").loc["mean", "hurts_more"]
    assert frame.attrs["mode"] == "mean" and frame.attrs["icl"] == {"seq_len": 48, "early": 23, "late": 47}


@pytest.mark.slow
def test_icl_rows_match_a_hand_computation(planted, planted_validation):
    rows = _rows(planted_validation, "icl_score")
    runner = ProbeRunner(planted, TextProbe(4, 48).eval_probe(planted, 4, seed=0, name="icl_text"))
    expected = icl_score(runner.baseline.per_token, 23, 47)
    ablated = icl_score(runner.measure([(1, 0)], "zero").per_token, 23, 47)
    assert rows.loc["zero", "baseline"] == pytest.approx(expected)
    assert rows.loc["zero", "ablated"] == pytest.approx(ablated)
    assert expected < -1  # the planted model copies what it saw: later tokens are easier
    assert rows.loc["mean", "delta"] > 1 and rows.loc["mean", "hurts_more"]
    assert math.isnan(rows.loc["mean", "baseline_accuracy"])


def test_icl_score_and_positions_by_hand():
    assert icl_positions(512) == (50, 500) and icl_positions(1024) == (50, 500) and icl_positions(48) == (23, 47)
    per_token = torch.full((2, 512), float("nan"))
    per_token[:, 41:51] = 4.0  # the 10 tokens ending at 50
    per_token[0, 491:501] = 3.0  # the 10 tokens ending at 500
    per_token[1, 491:501] = 2.0
    assert icl_score(per_token, 50, 500) == pytest.approx(-1.5)
    with pytest.raises(headscope.HeadscopeError, match="early <= late // 2"):
        icl_score(per_token, 300, 500)


def test_validate_reports_progress_and_is_reproducible(planted, planted_analysis_to_validate):
    seen = []
    kwargs = dict(labels=["previous_token"], icl=False, n_examples=2, n_random=2, **PROBES)
    a = validate(planted, planted_analysis_to_validate, progress=lambda *s: seen.append(s), **kwargs)
    b = validate(planted, planted_analysis_to_validate, **kwargs)
    pd.testing.assert_frame_equal(a, b)
    total = 1 + 2 * 3  # the text probe, then 2 modes x (the heads + 2 draws)
    assert seen[0] == ("validate", 0, total) and seen[-1] == ("validate", total, total)
    assert [s[1] for s in seen] == list(range(total + 1))
    assert list(a["label"]) == ["previous_token", "previous_token"] and list(a["mode"]) == ["zero", "mean"]


def test_syntactic_labels_are_checked_on_treebank_sentences(planted):
    probe = eval_sentences(planted, n_sentences=6, seed=0)
    lengths = probe.attention_mask.sum(dim=1)
    assert len(probe) == 6 and (probe.input_ids[:, 0] == planted.tokenizer.bos_token_id).all()  # BOS first
    for i, n in enumerate(lengths.tolist()):
        assert not probe.attention_mask[i, n:].any() and probe.scored[i, 1:n].all() and not probe.scored[i, n:].any()
        text = planted.tokenizer.decode(probe.input_ids[i, 1:n])
        assert text.replace(" ", "") and "[PAD]" not in text
    analysis = _labelled(2, 4, [(1, 0, "syntactic:det", 0.3), (0, 0, "syntactic:det", 0.2)])
    frame = validate(planted, analysis, labels=["syntactic:det"], n_examples=2, n_random=2, **PROBES)
    assert set(frame["probe"]) == {"treebank"} and frame["heads"].tolist() == ["1.0;0.0", "1.0;0.0"]
    rows = frame.set_index("mode")
    assert rows.loc["zero", "delta"] > 0 and rows.loc["zero", "hurts_more"]  # the induction head feeds prediction
    assert np.isfinite(rows.loc["mean", "ablated"]) and rows.loc["mean", "baseline"] == rows.loc["zero", "baseline"]
    assert "4 x 2" not in frame.attrs["probes"]["treebank"] and "8 sentences" in frame.attrs["probes"]["treebank"]


# --- controls and means ---------------------------------------------------------------------

def _labelled(n_layers, n_heads, rows):
    """A minimal Analysis whose labels are `rows` = [(layer, head, label, score)]; the rest "none"."""
    given = {(l, h): (label, s) for l, h, label, s in rows}
    table = [(l, h, *given.get((l, h), ("none", 0.0)), "") for l in range(n_layers) for h in range(n_heads)]
    labels = pd.DataFrame(table, columns=["layer", "head", "label", "score", "labels"])
    return Analysis(scores=pd.DataFrame(), labels=labels, meta={"n_layers": n_layers, "n_heads": n_heads, "model": "x"})


def test_random_draws_come_from_the_same_layers_and_skip_the_label():
    analysis = _labelled(6, 7, [(2, 1, "induction", 0.9), (2, 3, "induction", 0.8), (4, 0, "induction", 0.7),
                                (4, 5, "induction", 0.1), (3, 3, "sink", 0.9)])
    heads = [(2, 1), (2, 3), (4, 0)]
    draws = _random_draws(analysis, "induction", heads, 50, seed=0)
    assert len(draws) == 50
    for draw in draws:
        assert [layer for layer, _ in draw] == [2, 2, 4]  # as many per layer
        assert not {(2, 1), (2, 3), (4, 0), (4, 5)} & set(draw)  # no induction head, top-k or not
        assert len(set(draw)) == 3
    assert {h for d in draws for layer, h in d if layer == 4} == {1, 2, 3, 4, 6}
    assert draws == _random_draws(analysis, "induction", heads, 50, seed=0)
    assert draws != _random_draws(analysis, "induction", heads, 50, seed=1)
    # A layer with no other heads: no control (the row's random columns are then NaN).
    full = _labelled(1, 2, [(0, 0, "sink", 0.9), (0, 1, "sink", 0.8)])
    assert _random_draws(full, "sink", [(0, 0), (0, 1)], 5, seed=0) == []


def test_hurts_more_needs_the_metric_to_get_worse():
    draws = [[(0, 1)], [(0, 2)]]
    better_than_random = _row("x", "mean", "mean", "next_token_loss", "text", [(0, 0)], 3.0, 2.9, [2.8, 2.85], draws, 0.5, 0.5)
    assert better_than_random["delta"] == pytest.approx(-0.1) and not better_than_random["hurts_more"]
    worse = _row("x", "zero", "mean", "next_token_loss", "text", [(0, 0)], 3.0, 3.2, [3.1, 3.05], draws, 0.5, 0.4)
    assert worse["hurts_more"] and not worse["primary"] and worse["random_max"] == pytest.approx(0.1)
    assert worse["ratio"] == pytest.approx(0.2 / 0.075) and worse["random_heads"] == "0.1|0.2"


def _tiny_gpt2_loaded():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=99, n_positions=64, n_embd=36, n_layer=2, n_head=3, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0)
    return Loaded(tf.GPT2LMHeadModel(config).eval(), None, "tiny-gpt2", "gpt2", True)


def test_mean_ablation_uses_the_mean_over_the_whole_probe():
    loaded = _tiny_gpt2_loaded()
    ids = torch.randint(3, 99, (6, 13), generator=torch.Generator().manual_seed(0))
    probe = EvalProbe("text", ids, ids, torch.ones_like(ids, dtype=torch.bool),
                      torch.ones_like(ids, dtype=torch.bool).index_fill_(1, torch.tensor([0]), False), "random ids")
    in_batches = ProbeRunner(loaded, probe, batch_size=4)  # 4 + 2: means still over all 6 examples
    whole = ProbeRunner(loaded, probe, batch_size=6)
    for layer in (0, 1):
        torch.testing.assert_close(in_batches.means[layer], whole.means[layer], rtol=1e-5, atol=1e-6)
    # One batch holding the whole probe: the probe mean is ablate()'s own batch mean.
    with torch.no_grad(), headscope.ablate(loaded.model, [(1, 2)], mode="mean"):
        logits = loaded.model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 99), ids[:, 1:].reshape(-1))
    assert in_batches.measure([(1, 2)], "mean").value == pytest.approx(loss.item(), rel=1e-5)
    assert in_batches.baseline.value == pytest.approx(whole.baseline.value, rel=1e-6)


# --- encoders -------------------------------------------------------------------------------

def _tiny_bert(tmp_path, lm_head: bool):
    import transformers as tf
    from tests.support.planted import char_tokenizer

    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=99, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                           intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    model = (tf.BertForMaskedLM if lm_head else tf.BertModel)(config).eval()
    tokenizer = char_tokenizer()
    if lm_head:
        tokenizer = SimpleNamespace(mask_token_id=1)  # masking needs only the id
    return Loaded(model, tokenizer, "tiny-bert", "bert", False)


def test_encoder_without_lm_head_reports_hidden_change(tmp_path):
    loaded = _tiny_bert(tmp_path, lm_head=False)
    analysis = _labelled(2, 3, [(0, 1, "previous_token", 0.8), (1, 2, "next_token", 0.7), (1, 0, "induction", 0.6)])
    frame = validate(loaded, analysis, n_examples=2, n_random=2, probes=[TextProbe(seq_len=24), RepeatedProbe(repeat_len=6, repeats=3)])
    assert set(frame["metric"]) == {"hidden_change"} and "icl_score" not in set(frame["label"])  # not causal
    assert (frame["baseline"] == 0).all() and (frame["delta"] > 0).all()
    assert frame["baseline_accuracy"].isna().all()
    assert list(frame["label"].drop_duplicates()) == ["induction", "previous_token", "next_token"]


def test_encoder_with_lm_head_reports_masked_token_loss(tmp_path):
    loaded = _tiny_bert(tmp_path, lm_head=True)
    ids = torch.randint(3, 99, (4, 20), generator=torch.Generator().manual_seed(0))
    scored = torch.ones_like(ids, dtype=torch.bool)
    scored[:, 0] = False
    probe = masked_for_lm(EvalProbe("text", ids, ids, torch.ones_like(scored), scored, "ids"), mask_id=1, seed=0)
    assert (probe.input_ids[probe.scored] == 1).all() and (probe.input_ids[~probe.scored] == ids[~probe.scored]).all()
    assert probe.scored.any(dim=1).all() and not probe.scored[:, 0].any()
    assert 0.05 < probe.scored.float().mean() < 0.3
    runner = ProbeRunner(loaded, probe)
    assert runner.metric == "masked_token_loss"
    assert runner.baseline.value == pytest.approx(math.log(99), rel=0.2)  # random init: about uniform
    assert 0 <= runner.baseline.accuracy <= 1
    assert runner.measure([(0, 0), (1, 1)], "zero").value != runner.baseline.value


# --- bad input and saving -------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    (dict(k=0), "k must be an integer of at least 1, got 0"),
    (dict(n_random=0), "n_random must be an integer of at least 1, got 0"),
    (dict(n_examples=0), "n_examples must be an integer of at least 1"),
    (dict(mode="half"), "unknown ablation mode 'half'"),
    (dict(labels=["copy_suppression"]), "no heads labelled 'copy_suppression' to check; labels with heads: "),
    (dict(labels=["none"]), "no heads labelled 'none'"),
    (dict(probes=[TextProbe(seq_len=100), RepeatedProbe(repeat_len=10, repeats=4)]),
     "the text probe needs 100 tokens but .* takes at most 48"),
    (dict(probes=[TextProbe(seq_len=40), RepeatedProbe(repeat_len=12, repeats=4)]),
     "the repeated probe needs 49 tokens"),  # measured: 48 + the BOS
])
def test_bad_input(planted, planted_analysis_to_validate, kwargs, message):
    with pytest.raises(headscope.HeadscopeError, match=message) as err:
        validate(planted, planted_analysis_to_validate, **{**PROBES, **kwargs})
    assert "\n" not in str(err.value)


def test_analysis_of_another_model_is_refused(planted):
    from tests.support.fake_analysis import fake_analysis

    with pytest.raises(headscope.HeadscopeError, match=r"4 layers x 3 heads \(fake/tiny-4x3\) but .* has 2 x 4") as err:
        validate(planted, fake_analysis(4, 3), **PROBES)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_csv_round_trip_keeps_heads_and_flags(planted_validation, tmp_path):
    frame = planted_validation.copy()
    frame.loc[0, "heads"] = "10.10"  # a single head that pandas would read as the float 10.1
    frame.loc[1, "random_heads"] = frame.loc[1, "random_deltas"] = ""
    write_csv(frame, tmp_path / "validation.csv")
    again = read_csv(tmp_path / "validation.csv")
    assert again.loc[0, "heads"] == "10.10" and again.loc[1, "random_heads"] == ""
    pd.testing.assert_frame_equal(again, frame[COLUMNS], check_dtype=False)
    frame[COLUMNS].drop(columns="sites").to_csv(tmp_path / "older.csv", index=False)  # written before `sites`
    older = read_csv(tmp_path / "older.csv")
    assert (older.sites == "").all()
    pd.testing.assert_frame_equal(older.drop(columns="sites"), frame[COLUMNS].drop(columns="sites"), check_dtype=False)


# --- the real SmolLM2-135M ------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_induction_heads_matter_more_than_random_heads(smollm2):
    # Small probes for CPU time: 4 examples of 20 random tokens x 2 (docs/results.md has the
    # numbers at the defaults: 8 examples of 25 x 4).
    probes = [RepeatedProbe(n_examples=4, repeat_len=20, repeats=2)]
    analysis = analyze(smollm2, detectors=["induction"], explorer_examples=0, probes=probes)
    frame = validate(smollm2, analysis, labels=["induction"], icl=False, k=3, n_random=5, n_examples=4, probes=probes)
    top3 = analysis.heads_with("induction").head(3)
    assert len(top3) == 3
    for mode in ("mean", "zero"):
        row = _rows(frame, "induction").loc[mode]
        assert row.heads == ";".join(f"{l}.{h}" for l, h in zip(top3["layer"], top3["head"]))
        deltas = [float(d) for d in row.random_deltas.split(";")]
        assert len(deltas) == 5 and row.delta > max(deltas) and row.hurts_more
        assert row.delta > 0.5 and row.ablated_accuracy < row.baseline_accuracy
        for draw in row.random_heads.split("|"):
            assert sorted(int(h.split(".")[0]) for h in draw.split(";")) == sorted(top3["layer"])
