"""Labels an untrained network cannot earn: the control twin, and random models under test.

A random-init model of every tiny family (and, in the slow tests, of both bundled models) is
analysed as if it were a trained model: with the default control it must get no
learned-behaviour label, from the default analysis and from each learned detector alone, on
the bundled treebank and on real UD English (../shared/ud, see its README).
"""
import gc

import pytest
import torch

import headscope
from headscope import detectors
from headscope.loading.control import CONTROL_SEED_OFFSET, random_twin, resolve_control
from headscope.errors import HeadscopeError
from headscope.loading.loader import Loaded
from headscope.analysis.analyze import analyze
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from tests.support.planted import char_tokenizer
from tests.support.labels import LEARNED, learned_labels
from tests.support.tiny import ODD_FAMILIES, tiny_model
from tests.support.treebanks import UD, needs_ud

SETTINGS = [TextProbe(n_examples=8, seq_len=48), RepeatedProbe(n_examples=8, repeat_len=12, repeats=4)]
PROBES = dict(probes=SETTINGS)


def _random(family: str) -> Loaded:
    # seed 3: not the control's seed (0 + CONTROL_SEED_OFFSET), so the model is not its own control
    return Loaded.from_model(tiny_model(family, seed=3, positions=320), char_tokenizer(), f"random-{family}")


def test_twin_is_seeded_and_leaves_global_randomness_alone():
    loaded = _random("llama")
    state = torch.get_rng_state()
    one, two = random_twin(loaded, 5), random_twin(loaded, 5)
    assert torch.equal(torch.get_rng_state(), state)
    for (name, a), b, mine in zip(one.model.named_parameters(), two.model.parameters(), loaded.model.parameters()):
        assert torch.equal(a, b), name
        if a.numel() > 50:  # weights (not norms, all ones) differ from the model's
            assert not torch.equal(a, mine), name
    assert one.tokenizer is loaded.tokenizer and one.causal and one.family == "llama"


def test_from_model_infers_family_and_causality():
    bert = Loaded.from_model(tiny_model("bert"), char_tokenizer())
    gpt2 = Loaded.from_model(tiny_model("gpt2"), char_tokenizer(), name="mine")
    assert (bert.family, bert.causal, gpt2.family, gpt2.causal, gpt2.name) == ("bert", False, "gpt2", True, "mine")
    with pytest.raises(HeadscopeError, match="not a transformers model"):
        Loaded.from_model(torch.nn.Linear(2, 2), char_tokenizer())


def test_resolve_control_choices():
    loaded = _random("gpt2")
    twin, meta = resolve_control(loaded, "random-init", seed=4)
    assert meta["kind"] == "random-init" and meta["seed"] == 4 + CONTROL_SEED_OFFSET and twin is not None
    none, meta = resolve_control(loaded, None, seed=0)
    assert none is None and meta["kind"] == "none" and "not checked" in meta["note"]
    given, meta = resolve_control(loaded, twin, seed=0)
    assert given is twin and meta["kind"] == "given"
    with pytest.raises(HeadscopeError, match="unknown control 'shuffled'"):
        resolve_control(loaded, "shuffled", seed=0)
    with pytest.raises(HeadscopeError, match="the control has 2 layers x 3 heads"):
        resolve_control(_random("llama"), twin, seed=0)


def test_control_columns_are_the_twins_scores():
    loaded = _random("gpt2")
    analysis = analyze(loaded, detectors=["previous_token", "induction"], explorer_examples=0, **PROBES)
    twin = random_twin(loaded, CONTROL_SEED_OFFSET)
    alone = analyze(twin, detectors=["previous_token", "induction"], explorer_examples=0, control=None, **PROBES)
    merged = analysis.scores.merge(alone.scores, on=["layer", "head", "detector"], suffixes=("", "_twin"))
    torch.testing.assert_close(torch.tensor(merged.control.values), torch.tensor(merged.score_twin.values))
    best = alone.scores.groupby("detector").score.max()
    assert (analysis.scores.control_max == analysis.scores.detector.map(best)).all()
    assert analysis.meta["control"]["kind"] == "random-init"


def test_the_twin_analyze_built_is_freed_before_its_last_heap_return(monkeypatch):
    """The twin's weights are freed before `analyze` gives the freed heap back at its end, so they
    leave the process with the analysis; a control the caller passed stays the caller's."""
    import weakref

    import headscope.analysis.analyze as analyze_module
    import headscope.loading.control as control

    twins, alive_at_return, collections = [], [], []
    real = control.random_twin
    cycle = []  # whether the next twin is also held by a reference cycle

    def built(*args):
        twin = real(*args)
        twins.append(weakref.ref(twin.model))
        if cycle:
            twin.model.held_by_itself = [twin.model]
        return twin

    monkeypatch.setattr(control, "random_twin", built)
    monkeypatch.setattr(analyze_module, "return_freed_heap",
                        lambda: alive_at_return.append(any(ref() is not None for ref in twins)) or True)
    collect = gc.collect
    monkeypatch.setattr(analyze_module.gc, "collect", lambda *a: collections.append(1) or collect(*a))
    loaded = _random("gpt2")
    gc.disable()  # only analyze's own collection, if it makes one, may free a cycle
    try:
        analysis = analyze(loaded, detectors=["previous_token"], explorer_examples=0, **PROBES)
        assert analysis.meta["control"]["kind"] == "random-init" and len(twins) == 1
        assert alive_at_return == [False]  # the twin was gone when the heap went back
        assert collections == []  # by reference counting: no full collection (0.2 s in a large process)
        cycle.append(True)
        analyze(loaded, detectors=["previous_token"], explorer_examples=0, **PROBES)
        assert alive_at_return == [False, False] and collections == [1]  # a cycle: collected before the return
    finally:
        gc.enable()
    given = random_twin(loaded, CONTROL_SEED_OFFSET)
    analyze(loaded, detectors=["previous_token"], explorer_examples=0, control=given, **PROBES)
    assert next(given.model.parameters()).abs().sum() > 0  # the caller's control is untouched


# gpt2 in the quick loop; each other family takes 20-200 s on 2 shared cores (slow, CI runs them).
@pytest.mark.parametrize("family", [f if f == "gpt2" else pytest.param(f, marks=pytest.mark.slow) for f in ODD_FAMILIES])
def test_random_model_earns_no_learned_label(family):
    loaded = _random(family)
    # The default analysis on the bundled treebank: every detector, 300 sentences.
    default = analyze(loaded, probes=SETTINGS + [TreebankProbe(n_sentences=300)], explorer_examples=0)
    assert "syntactic" in set(default.scores.detector)  # it ran (no skip note)
    assert learned_labels(default) == set(), default.labels
    # Each learned detector alone (the syntactic one on the bundled treebank).
    for name in LEARNED:
        if ("causal" if loaded.causal else "bidirectional") not in detectors.get(name).applies_to:
            continue  # next_token on a causal model; alignment reads cross-attention
        if detectors.get(name).run is not None:  # retrieval: its own needle probe, tests/detectors/test_retrieval_detector.py
            continue
        if name == "syntactic":  # on real UD English too: test_random_model_earns_no_syntactic_label_on_ud
            alone = analyze(loaded, detectors=[name], probes=[TreebankProbe(n_sentences=300)], explorer_examples=0)
            assert learned_labels(alone) == set(), name
        else:
            alone = analyze(loaded, detectors=[name], explorer_examples=0, **PROBES)
            assert learned_labels(alone) == set(), name


@needs_ud
@pytest.mark.parametrize("family", [f if f == "gpt2" else pytest.param(f, marks=pytest.mark.slow) for f in ODD_FAMILIES])
def test_random_model_earns_no_syntactic_label_on_ud(family):
    loaded = _random(family)
    alone = analyze(loaded, detectors=["syntactic"], probes=[TreebankProbe(UD, n_sentences=300)], explorer_examples=0)
    assert learned_labels(alone) == set(), ("syntactic", UD)


def test_without_a_control_the_analysis_says_so():
    analysis = analyze(_random("gpt2"), detectors=["previous_token"], explorer_examples=0, control=None, **PROBES)
    assert analysis.meta["control"]["kind"] == "none"
    assert analysis.scores.control.isna().all() and analysis.scores.control_max.isna().all()
