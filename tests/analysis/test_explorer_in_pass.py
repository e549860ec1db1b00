"""The head explorer's maps from the probe's own pass: on a causal model, the map of an
example's first tokens is the map of those tokens alone, so `collect(explorer=...)` keeps it from
the pass that scores the heads instead of running a second pass; elsewhere `analyze` runs one."""
import pytest
import torch

import headscope
from headscope.analysis.explorer import explorer_inputs, explorer_maps
from headscope.detectors import get, runner
from headscope.loading.loader import Loaded
from headscope.probes.base import ProbeSet
from headscope.probes.kinds import RepeatedProbe, TextProbe
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model

# (family, kind): GQA with rotary; absolute positions; a sliding window shorter than the maps;
# soft-capped scores; learned sinks; a hybrid whose layer 0 has no attention
MODELS = [("llama", "odd"), ("gpt2", "odd"), ("mistral", "interface"), ("gemma2", "interface"),
          ("gpt_oss", "interface"), ("jamba", "hybrid")]
DETECTORS = ["previous_token", "uniform"]


def _probe(loaded, n=5, length=13) -> ProbeSet:
    ids = torch.randint(4, loaded.model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(1))
    return ProbeSet("text", ids, 1, "random tokens")


class _Shifted(ProbeSet):
    """A probe whose batches hold each example one token later than its explorer ids say."""

    def batches(self, batch_size, causal, device):
        out = super().batches(batch_size, causal, device)
        return [type(b)(b.input_ids.roll(1, 1), b.attention_mask, b.causal, b.content_start, b.token_counts)
                for b in out]


@pytest.mark.parametrize("family,kind", MODELS, ids=[f for f, _ in MODELS])
@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "maps"])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_the_pass_keeps_the_maps_a_pass_of_the_cut_examples_gives(family, kind, lazy, batch_size):
    loaded = Loaded.from_model(tiny_model(family, kind=kind), tokenizer=None)
    probe = _probe(loaded)
    detectors = [get(name) for name in DETECTORS]
    passes = runner.collect(loaded, probe, detectors, batch_size, lazy=lazy, explorer=(3, 9))
    inputs, _, _ = explorer_inputs(loaded, probe, 3, 9)
    expected = explorer_maps(loaded, inputs)  # the first 3 examples cut to 9 tokens, a pass of their own
    assert passes.explorer is not None and passes.explorer.shape == expected.shape
    assert expected.shape[0] == 3 and expected.shape[-2:] == (9, 9) and expected.abs().sum() > 0
    torch.testing.assert_close(passes.explorer, expected, rtol=1e-5, atol=1e-6)
    plain = runner.collect(loaded, probe, detectors, batch_size, lazy=lazy)  # the scores are untouched
    for name in DETECTORS:
        ours, theirs = passes.values[name].values, plain.values[name].values  # [{layer: values}] per batch
        assert len(ours) == len(theirs) and all(a.keys() == b.keys() for a, b in zip(ours, theirs))
        assert all(torch.equal(a[layer], b[layer]) for a, b in zip(ours, theirs) for layer in a)


def test_no_maps_are_kept_where_the_pass_does_not_hold_them():
    bert = Loaded.from_model(tiny_model("bert"), tokenizer=None)  # bidirectional: later tokens change the map
    assert runner.collect(bert, _probe(bert), [get("previous_token")], 4, explorer=(2, 9)).explorer is None
    llama = Loaded.from_model(tiny_model("llama"), tokenizer=None)
    probe = _probe(llama)
    assert runner.collect(llama, probe, [get("previous_token")], 4).explorer is None  # not asked for
    assert runner.collect(llama, probe, [get("previous_token")], 4, explorer=(0, 9)).explorer is None
    shifted = _Shifted("text", probe.input_ids, 1, "random tokens")
    assert runner.collect(llama, shifted, [get("previous_token")], 4, explorer=(2, 9)).explorer is None


def test_analyze_shows_the_maps_of_a_pass_of_their_own_without_running_it(monkeypatch):
    loaded = Loaded(tiny_model("llama"), char_tokenizer(), "tiny-llama", "llama", True)
    probes = [TextProbe(4, 20), RepeatedProbe(4, 6, 2)]
    calls = []
    monkeypatch.setattr("headscope.analysis.explorer.explorer_maps", lambda *a: calls.append(1) or explorer_maps(*a))
    analysis = headscope.analyze(loaded, detectors=["previous_token", "induction"], control=None, ov=False,
                                 probes=probes, batch_size=3, explorer_examples=2, explorer_len=10)
    assert calls == []  # both probes' maps came from their scoring passes
    assert [(e.probe, e.index) for e in analysis.examples] == [("text", 0), ("text", 1), ("repeated", 0),
                                                               ("repeated", 1)]
    built = {p.name: p.build(loaded, 0) for p in probes}
    for example in analysis.examples:
        inputs, _, _ = explorer_inputs(loaded, built[example.probe], 2, 10)
        expected = torch.clamp(torch.round(explorer_maps(loaded, inputs)[example.index] * 255), 0, 255)
        assert example.patterns.shape == tuple(expected.shape)
        assert (torch.from_numpy(example.patterns.astype("float32")) - expected).abs().max() <= 1  # a rounding edge
