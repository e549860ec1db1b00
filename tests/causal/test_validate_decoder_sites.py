"""validate at an encoder-decoder's decoder sites (`sites="decoder.self"`, `"decoder.cross"`): the
probe read as a teacher-forced copy, the metric the decoder's loss of each copied token, heads
ablated at the analysed group. The reference computes that loss from the model's own logits with
the head's slice of the output projection's input zeroed (or set to its mean) by a forward
pre-hook on that site's output projection."""
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import headscope
from headscope.analysis import Analysis
from headscope.causal import validate
from headscope.loading.loader import Loaded
from headscope.probes.copy import as_copy_eval
from headscope.probes.kinds import CopyProbe, RepeatedProbe, TextProbe, decoder_start
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

OUTPUT_PROJECTION = {"bart": "out_proj", "t5": "o"}  # the attention module's child that reads z
TEXT = TextProbe(seq_len=24)


def _loaded(family):
    return Loaded.from_model(tiny_model(family, kind="encoder_decoder"), char_tokenizer(), f"tiny-{family}")


def _labelled(view, rows):
    """An Analysis of `view`'s sites whose labels are `rows` = [(layer, head, label, score)]."""
    given = {(l, h): (label, s) for l, h, label, s in rows}
    table = [(l, h, *given.get((l, h), ("none", 0.0)), "") for l in view.attention_layers for h in range(view.n_heads)]
    labels = pd.DataFrame(table, columns=["layer", "head", "label", "score", "labels"])
    meta = {"n_layers": view.n_layers, "n_heads": view.n_heads, "model": view.name,
            "sites": {"group": view.sites, "kind": view.site_kind}}
    return Analysis(scores=pd.DataFrame(), labels=labels, meta=meta)


@torch.no_grad()
def _reference_loss(view, family, probe, heads, mode):
    """Mean cross-entropy of the decoder's logits at the scored positions against the copied
    tokens, `heads` removed by forward pre-hooks on their sites' output projections (mean mode:
    the head's slice set to its mean over the probe's tokens on the unablated model)."""
    model = view.model
    chosen = view.selection
    d_head = None
    means = {}
    if mode == "mean":
        seen = {}
        hooks = [getattr(model.get_submodule(chosen.sites[layer].name), OUTPUT_PROJECTION[family])
                 .register_forward_pre_hook(lambda module, args, layer=layer: seen.setdefault(layer, args[0].clone()))
                 for layer in {layer for layer, _ in heads}]
        try:
            model(input_ids=probe.input_ids, decoder_input_ids=probe.decoder_input_ids)
        finally:
            for hook in hooks:
                hook.remove()
        means = {layer: z.mean(dim=(0, 1)) for layer, z in seen.items()}  # (H * D,)

    def edit(layer, chosen_heads):
        def hook(module, args):
            z = args[0].clone()  # (B, T, H * D)
            size = z.shape[-1] // view.n_heads
            for head in chosen_heads:
                part = slice(head * size, (head + 1) * size)
                z[..., part] = 0 if mode == "zero" else means[layer][part]
            return (z,)
        return hook

    by_layer = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    hooks = [getattr(model.get_submodule(chosen.sites[layer].name), OUTPUT_PROJECTION[family])
             .register_forward_pre_hook(edit(layer, chosen_heads)) for layer, chosen_heads in by_layer.items()]
    try:
        logits = model(input_ids=probe.input_ids, decoder_input_ids=probe.decoder_input_ids).logits.float()
    finally:
        for hook in hooks:
            hook.remove()
    losses = F.cross_entropy(logits.transpose(1, 2), probe.targets, reduction="none")  # (N, T)
    return float(losses[probe.scored].mean())


@pytest.mark.parametrize("family", ["bart", "t5"])
@pytest.mark.parametrize("sites", ["decoder.self", "decoder.cross"])
def test_validate_measures_the_copy_loss_with_the_sites_heads_removed(family, sites):
    loaded = _loaded(family)
    view = loaded.at(sites)
    last = view.n_heads - 1
    analysis = _labelled(view, [(0, 0, "sink", 0.9), (1, last, "sink", 0.8), (1, 0, "uniform", 0.7)])
    frame = validate(loaded, analysis, k=2, n_random=2, n_examples=3, probes=[TEXT])
    assert list(frame["label"]) == ["sink", "sink", "uniform", "uniform"] and list(frame["mode"]) == ["zero", "mean"] * 2
    assert set(frame["metric"]) == {"copy_token_loss"} and set(frame["probe"]) == {"text"}
    assert frame.attrs["sites"] == sites and frame.attrs["icl"] is None
    assert "teacher-forced copy" in frame.attrs["probes"]["text"]
    rows = frame.set_index(["label", "mode"])
    assert rows.loc[("sink", "zero"), "heads"] == f"0.0;1.{last}"
    probe = as_copy_eval(TEXT.eval_probe(view, 3, seed=0), decoder_start(view))
    baseline = _reference_loss(view, family, probe, [], "zero")
    for label in ("sink", "uniform"):
        for mode in ("zero", "mean"):
            row = rows.loc[(label, mode)]
            heads = [tuple(map(int, h.split("."))) for h in row.heads.split(";")]
            assert row.baseline == pytest.approx(baseline, abs=1e-5)
            assert row.ablated == pytest.approx(_reference_loss(view, family, probe, heads, mode), abs=1e-5)
            assert row.delta != 0  # the heads write into the decoder: removing them moves the loss
            draws = [[tuple(map(int, h.split("."))) for h in draw.split(";")] for draw in row.random_heads.split("|")]
            assert all([layer for layer, _ in draw] == [layer for layer, _ in heads] for draw in draws)
            expected = [_reference_loss(view, family, probe, draw, mode) - baseline for draw in draws]
            assert [float(d) for d in row.random_deltas.split(";")] == pytest.approx(expected, abs=1e-5)
            assert row.hurts_more == (row.delta > 0 and row.delta > max(expected))


def test_validate_follows_the_analysis_to_its_sites_and_refuses_another_group():
    loaded = _loaded("bart")
    analysis = _labelled(loaded.at("decoder.cross"), [(0, 0, "sink", 0.9)])
    via_default = validate(loaded, analysis, k=1, n_random=1, n_examples=2, probes=[TEXT])
    via_view = validate(loaded.at("decoder.cross"), analysis, k=1, n_random=1, n_examples=2, probes=[TEXT])
    assert via_default.attrs["sites"] == "decoder.cross"
    assert list(via_default["ablated"]) == list(via_view["ablated"])
    with pytest.raises(headscope.HeadscopeError, match="scored decoder.cross sites but .* looks at decoder.self") as err:
        validate(loaded.at("decoder.self"), analysis, n_examples=2, probes=[TEXT])
    assert "\n" not in str(err.value)


def test_induction_at_a_decoders_self_attention_is_checked_on_the_copied_repeats_without_icl_rows():
    loaded = _loaded("bart")
    view = loaded.at("decoder.self")
    analysis = _labelled(view, [(1, 1, "induction", 0.9)])
    analysis.meta["detectors"] = {"induction": {"probe": "repeated", "icl_check": True}}
    repeated = RepeatedProbe(repeat_len=6, repeats=3)
    frame = validate(loaded, analysis, k=1, n_random=1, n_examples=2, probes=[repeated])
    assert list(frame["label"]) == ["induction", "induction"] and frame.attrs["icl"] is None  # no icl_score rows
    probe = as_copy_eval(repeated.eval_probe(view, 2, seed=0), decoder_start(view))
    row = frame.set_index("mode").loc["zero"]
    assert row.probe == "repeated"
    assert row.ablated == pytest.approx(_reference_loss(view, "bart", probe, [(1, 1)], "zero"), abs=1e-5)


def test_analyze_validates_decoder_sites_and_the_copy_probe_only_there():
    loaded = _loaded("t5")
    probes = [TextProbe(n_examples=4, seq_len=24), CopyProbe(n_examples=4, seq_len=24)]
    analysis = headscope.analyze(loaded, sites="decoder.cross", probes=probes, explorer_examples=0, validate=True,
                                 control=None)
    checked = set(analysis.validation["label"])
    assert checked == set(analysis.labels["label"]) - {"none", "mixed"} and checked
    assert set(analysis.validation["metric"]) == {"copy_token_loss"}
    assert analysis.validation.groupby("label").size().eq(2).all()
    with pytest.raises(headscope.HeadscopeError, match="copy probe's causal check is the decoder's copy loss"):
        CopyProbe(2, 16).eval_probe(loaded, 2, seed=0)


def test_the_planted_alignment_head_is_found_but_the_planted_model_never_reads_it():
    """The planted BART's head 0.0 attends decoder i -> encoder i, but every output projection and
    the token embeddings (tied to the LM head) are zero: its logits are 0 whatever the heads do.
    So validate, run as the model is, says the alignment head does not matter: every loss is
    log(99) (uniform over the vocabulary), every delta 0, no verdict."""
    from tests.support.planted_cross import planted_bart

    loaded = Loaded.from_model(planted_bart(0), char_tokenizer(), "planted-bart")
    analysis = headscope.analyze(loaded, detectors=["alignment", "sink", "uniform"], sites="decoder.cross",
                                 probes=[CopyProbe(n_examples=8, seq_len=32), TextProbe(n_examples=8, seq_len=32)],
                                 explorer_examples=0, validate=True)
    rows = analysis.validation[analysis.validation["label"] == "alignment"].set_index("mode")
    assert list(rows["heads"]) == ["0.0", "0.0"] and set(rows["probe"]) == {"copy"}
    for column in ("baseline", "ablated"):
        assert (analysis.validation[column] - math.log(99)).abs().max() < 1e-5
    assert (analysis.validation["delta"] == 0).all() and not analysis.validation["hurts_more"].any()
    assert all(d == "0.0" for d in ";".join(rows["random_deltas"]).split(";"))


def test_ablating_the_planted_copying_head_breaks_the_copy_and_random_heads_do_not():
    """Ground truth: the planted copying BART predicts token i at decoder position i only through
    cross-attention head 0.0 (it reads encoder token i and writes it into the decoder)."""
    from tests.support.planted_cross import planted_copying_bart

    loaded = Loaded.from_model(planted_copying_bart(0), char_tokenizer(), "planted-copying-bart")
    analysis = headscope.analyze(loaded, detectors=["alignment"], sites="decoder.cross",
                                 probes=[CopyProbe(n_examples=8, seq_len=32)], explorer_examples=0, validate=True)
    rows = analysis.validation.set_index("mode")
    assert list(analysis.validation["label"]) == ["alignment", "alignment"] and set(rows["heads"]) == {"0.0"}
    for mode in ("zero", "mean"):
        row = rows.loc[mode]
        assert row.baseline < 0.01 and row.baseline_accuracy == 1.0  # the model copies
        assert row.delta > 5 and row.ablated_accuracy < 0.1 and row.hurts_more
        assert {d.split(".")[0] for d in row.random_heads.split("|")} == {"0"}  # heads 0.1, 0.2 of the same layer
        assert [float(d) for d in row.random_deltas.split(";")] == [0.0] * 5  # their output projections are zero
    view = loaded.at("decoder.cross")
    probe = as_copy_eval(TextProbe(seq_len=32).eval_probe(view, 8, seed=0), decoder_start(view))
    assert rows.loc["zero", "ablated"] == pytest.approx(_reference_loss(view, "bart", probe, [(0, 0)], "zero"), abs=1e-5)
