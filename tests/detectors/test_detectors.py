"""Detectors against ground truth: hand-worked patterns and a model with planted heads."""
import math

import pandas as pd
import pytest
import torch

import headscope
from headscope import detectors
from headscope.analysis import Analysis
from headscope.analysis.analyze import analyze
from headscope.detectors.labels import label_heads
from headscope.probes.base import ProbeBatch
from headscope.detectors.stats import bootstrap_mean_ci
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from tests.support.planted import PLANTED

SMALL = dict(probes=[TextProbe(n_examples=8, seq_len=40), RepeatedProbe(n_examples=8, repeat_len=10, repeats=4)])


@pytest.fixture(scope="module")
def planted_default_analysis(planted):
    return analyze(planted, **SMALL)


def _batch(ids, causal=True, start=0):
    ids = torch.as_tensor(ids)
    return ProbeBatch(ids, torch.ones_like(ids, dtype=torch.bool), causal, start)


def _offset_pattern(t, offset):
    """Every query i puts all attention on key i + offset (on itself where that is missing)."""
    p = torch.zeros(1, 1, t, t)
    for i in range(t):
        j = i + offset
        p[0, 0, i, j if 0 <= j < t else i] = 1.0
    return p


def test_planted_heads_get_their_labels_and_no_other_head_does(planted_default_analysis):
    labels = planted_default_analysis.labels.set_index(["layer", "head"]).label
    for head, label in PLANTED.items():
        assert labels[head] == label
        others = [h for h, l in labels.items() if l == label and h != head]
        assert others == [], f"{label} also given to {others}"
    assert labels[(1, 2)] == "none" and labels[(1, 3)] == "none"
    scores = planted_default_analysis.scores.set_index(["layer", "head", "detector"]).score
    for head, label in PLANTED.items():
        assert scores[(*head, label)] > 0.99


def test_confidence_intervals_bracket_scores(planted_default_analysis):
    s = planted_default_analysis.scores
    assert (s.ci_low <= s.score + 1e-12).all() and (s.score <= s.ci_high + 1e-12).all()
    # syntactic counts arcs, not examples; rare_word leaves out examples whose rarest token is only at position 0
    assert (s[~s.detector.isin(["syntactic", "rare_word"])].n == 8).all()
    assert s[s.detector == "rare_word"].n.between(1, 8).all()


def test_offset_detectors_on_hand_worked_patterns():
    batch = _batch([[5, 6, 7, 8, 9]])
    prev = _offset_pattern(5, -1)
    # queries 1..4 put 1.0 on i-1 -> 1; query 0 is not counted
    assert detectors.previous_token(prev, batch).item() == pytest.approx(1.0)
    assert detectors.self_attention(prev, batch).item() == pytest.approx(0.0)
    enc = _batch([[5, 6, 7, 8, 9]], causal=False)
    nxt = _offset_pattern(5, +1)
    assert detectors.next_token(nxt, enc).item() == pytest.approx(1.0)
    # half on previous, half on self for queries >= 1
    mix = 0.5 * _offset_pattern(5, -1) + 0.5 * _offset_pattern(5, 0)
    assert detectors.previous_token(mix, batch).item() == pytest.approx(0.5)
    assert detectors.self_attention(mix, batch).item() == pytest.approx(0.5)


def test_induction_scores_a_perfect_head_one_not_one_half():
    # BOS, then A B C D twice. A perfect induction head: query at position i in the second
    # copy attends to i - 4 + 1. TransformerLens's mul measure would average over all 9 rows.
    ids = [[0, 10, 11, 12, 13, 10, 11, 12, 13]]
    t = 9
    p = torch.zeros(1, 1, t, t)
    for i in range(t):
        p[0, 0, i, i - 3 if i >= 5 else i] = 1.0  # no target: rests on itself
    batch = _batch(ids, start=1)
    assert detectors.induction(p, batch).item() == pytest.approx(1.0)
    tl_style = (p[0, 0] * (torch.arange(t)[:, None] - 3 == torch.arange(t)[None, :]).float()).sum() / p[0, 0].sum()
    assert tl_style.item() == pytest.approx(4 / 9)
    assert detectors.duplicate_token(p, batch).item() == pytest.approx(0.0)
    dup = torch.zeros(1, 1, t, t)
    for i in range(t):
        dup[0, 0, i, i - 4 if i >= 5 else 0] = 1.0
    assert detectors.duplicate_token(dup, batch).item() == pytest.approx(1.0)


def test_uniform_and_sink_on_hand_worked_patterns():
    t = 20
    causal = torch.tril(torch.ones(t, t))
    uniform = (causal / causal.sum(-1, keepdim=True))[None, None]
    batch = _batch([list(range(3, 3 + t))])
    assert detectors.uniform(uniform, batch).item() == pytest.approx(1.0, abs=1e-6)
    sink = torch.zeros(1, 1, t, t)
    sink[..., 0] = 1.0
    assert detectors.sink(sink, batch).item() == pytest.approx(1.0)
    assert detectors.uniform(sink, batch).item() == pytest.approx(0.0, abs=1e-6)
    # half on the first token, half spread over all n_i keys: H = 0.5 ln 2 + 0.5 ln n_i + ...
    half = 0.5 * sink + 0.5 * uniform
    rows = half[0, 0]
    n = torch.arange(1, t + 1).float()
    h = -(torch.special.xlogy(rows, rows)).sum(-1) / n.log()
    expected = h[7:].mean().item()  # queries with >= 8 keys
    assert detectors.uniform(half, batch).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", list(detectors.REGISTRY))
def test_every_builtin_keeps_the_detector_contract(name):
    headscope.check_detector(detectors.REGISTRY[name])


def test_the_contract_check_catches_a_detector_that_mutates_or_misshapes():
    def zeroes_its_input(pattern, batch):
        pattern.tensor.zero_()  # the pattern arrives wrapped (attention.pattern.DensePattern)
        return pattern.tensor.sum(dim=(-1, -2))

    def per_query(pattern, batch):
        return pattern.tensor.sum(-1)  # [batch, head, query]: one axis too many

    made = [detectors.Detector(name, probe="text", threshold=0.5, formula="x", source="a test", fn=fn)
            for name, fn in (("zeroes", zeroes_its_input), ("per_query", per_query))]
    with pytest.raises(headscope.HeadscopeError, match="changed its input"):
        headscope.check_detector(made[0])
    with pytest.raises(headscope.HeadscopeError, match=r"returns \[batch, head\] scores"):
        headscope.check_detector(made[1])
    with pytest.raises(headscope.HeadscopeError, match="takes a Detector"):
        headscope.check_detector("induction")


def test_detectors_do_not_modify_their_input():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(2, 3, 12, 12), -1)
    before = p.clone()
    batch = _batch(torch.randint(3, 9, (2, 12)), start=1)
    for det in detectors.REGISTRY.values():
        if det.run is not None:  # runs its own passes on its probe (retrieval): a pattern is refused
            with pytest.raises(headscope.HeadscopeError, match="runs its own forward passes"):
                det(p, batch)
            continue
        if det.probe == "treebank":
            with pytest.raises(headscope.HeadscopeError, match="dependency arcs"):
                det(p, batch)  # needs sentences, not one pattern
            continue
        det(p, batch)
    assert torch.equal(p, before)


def test_bootstrap_interval_matches_normal_theory():
    torch.manual_seed(0)
    values = torch.randn(1, 400) * 2 + 5
    mean, low, high, n = bootstrap_mean_ci(values, n_resamples=4000)
    se = values.std() / math.sqrt(400)
    assert mean.item() == pytest.approx(values.mean().item())
    assert (high - low).item() == pytest.approx(2 * 1.96 * se.item(), rel=0.1)
    const = torch.full((1, 10), 0.25)
    m, lo, hi, _ = bootstrap_mean_ci(const)
    assert lo.item() == hi.item() == pytest.approx(0.25)
    with_nan = torch.tensor([[1.0, float("nan"), 3.0]])
    m, _, _, n = bootstrap_mean_ci(with_nan)
    assert m.item() == 2.0 and n.item() == 2


def test_bootstrap_resamples_are_the_seeded_draws_with_replacement():
    """The interval from resample means computed draw by draw (NaN left out of each mean),
    against the function's counts-times-values products."""
    values = torch.rand(5, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    values[2, 3] = values[4, :6] = float("nan")
    mean, low, high, n = bootstrap_mean_ci(values, n_resamples=300, seed=7)
    idx = torch.randint(0, 7, (300, 7), generator=torch.Generator().manual_seed(7))
    for row in range(5):
        means = []
        for draw in idx:
            picked = values[row, draw]
            picked = picked[~torch.isnan(picked)]
            means.append(picked.mean() if len(picked) else values[row][~torch.isnan(values[row])].mean())
        means = torch.stack(means)
        assert low[row].item() == pytest.approx(torch.quantile(means, 0.025).item(), rel=1e-12)
        assert high[row].item() == pytest.approx(torch.quantile(means, 0.975).item(), rel=1e-12)
    assert n.tolist() == [7, 7, 6, 7, 1]


def test_labels_mixed_none_and_resting():
    thresholds = {"induction": 0.4, "sink": 0.6, "previous_token": 0.5, "self": 0.5}
    rows = [
        (0, 0, "induction", 0.9), (0, 0, "sink", 0.95),  # specific beats resting
        (0, 1, "previous_token", 0.75), (0, 1, "self", 0.76),  # equally clear -> mixed
        (0, 2, "previous_token", 0.2), (0, 2, "self", 0.3),  # nothing passes
        (0, 3, "sink", 0.7), (0, 3, "self", 0.1),
    ]
    scores = pd.DataFrame(rows, columns=["layer", "head", "detector", "score"])
    rules = {name: detectors.get(name) for name in thresholds}
    assert {name: rule.threshold for name, rule in rules.items()} == thresholds
    labels = label_heads(scores, rules).set_index("head")
    assert labels.label.tolist() == ["induction", "mixed", "none", "sink"]
    assert labels.labels[0] == "sink;induction" and labels.labels[2] == ""  # clearest first


def test_learned_labels_need_their_ci_above_the_control():
    # previous_token (learned, threshold 0.5): the lower bound must beat the control's best head.
    # sink (resting): descriptive, the control does not gate it.
    # syntactic (gate "ci_low"): the CI lower bound itself must reach the threshold 0.10.
    rows = [
        (0, 0, "previous_token", 0.80, 0.70, 0.60),  # 0.70 > 0.60 -> passes
        (0, 1, "previous_token", 0.80, 0.55, 0.60),  # mean passes, lower bound under the control
        (0, 2, "previous_token", 0.80, 0.55, float("nan")),  # no control: the threshold alone
        (0, 3, "sink", 0.90, 0.20, 0.95),  # resting: control ignored
        (0, 4, "syntactic", 0.15, 0.11, 0.0),  # lower bound >= 0.10 -> passes
        (0, 5, "syntactic", 0.15, 0.09, 0.0),  # margin 0.15 but lower bound 0.09 -> fails
    ]
    scores = pd.DataFrame(rows, columns=["layer", "head", "detector", "score", "ci_low", "control_max"])
    rules = {name: detectors.get(name) for name in ("previous_token", "sink", "syntactic")}
    labels = label_heads(scores, rules, {(0, 4, "syntactic"): "syntactic:det"}).set_index("head").label
    assert labels.tolist() == ["previous_token", "none", "previous_token", "sink", "syntactic:det", "none"]


def test_random_init_model_has_no_induction_head(tmp_path):
    import transformers as tf
    from tests.support.planted import char_tokenizer

    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=99, n_positions=48, n_embd=48, n_layer=3, n_head=4, bos_token_id=2, eos_token_id=2)
    tf.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    analysis = analyze(headscope.load(str(tmp_path), device="cpu"), **SMALL)
    assert "induction" not in set(analysis.labels.label)
    assert analysis.scores[analysis.scores.detector == "induction"].score.max() < 0.2


def test_analysis_round_trip(planted_default_analysis, tmp_path):
    planted_default_analysis.save(tmp_path / "a")
    again = Analysis.load(tmp_path / "a")
    pd.testing.assert_frame_equal(again.scores, planted_default_analysis.scores, check_dtype=False)
    pd.testing.assert_frame_equal(again.labels, planted_default_analysis.labels, check_dtype=False)
    assert again.meta == planted_default_analysis.meta
    assert len(again.examples) == len(planted_default_analysis.examples) == 4
    ex, orig = again.examples[0], planted_default_analysis.examples[0]
    assert ex.tokens == orig.tokens and (ex.patterns == orig.patterns).all()
    with pytest.raises(headscope.HeadscopeError, match="already exists"):
        planted_default_analysis.save(tmp_path / "a")


def test_explorer_examples_hold_real_patterns(planted_default_analysis):
    ex = [e for e in planted_default_analysis.examples if e.probe == "repeated"][0]
    assert ex.patterns.shape[:2] == (2, 4)
    prev = ex.pattern(0, 0)  # planted previous-token head
    assert prev[5, 4] == pytest.approx(1.0, abs=1 / 255)
    assert ex.tokens[0] == "[BOS]"


def test_meta_records_what_was_run(planted_default_analysis):
    meta = planted_default_analysis.meta
    assert meta["n_layers"] == 2 and meta["n_heads"] == 4 and meta["causal"] is True
    # 48 positions: enough of the bundled treebank's short sentences fit for 30 arcs per half
    assert set(meta["detectors"]) == set(detectors.defaults(causal=True))
    assert "skipped_detectors" not in meta and meta["syntax_best"]
    assert meta["control"]["kind"] == "random-init" and meta["control"]["seed"] == 1_000_003
    assert meta["detectors"]["induction"]["threshold"] == 0.4
    assert meta["probes"]["repeated"]["seq_len"] == 41 and meta["probes"]["text"]["n_examples"] == 8
    assert meta["timings"]["total"] > 0 and "torch" in meta["versions"]


def test_seed_reproducible_and_progress_reported(planted):
    seen = []
    a = analyze(planted, detectors=["previous_token"], seed=3, progress=lambda *s: seen.append(s), **SMALL)
    b = analyze(planted, detectors=["previous_token"], seed=3, **SMALL)
    pd.testing.assert_frame_equal(a.scores, b.scores)
    assert seen == [("probe text", 0, 1), ("probe text", 1, 1), ("probe text (control)", 0, 1),
                    ("probe text (control)", 1, 1)]


@pytest.mark.parametrize("kwargs,message", [
    (dict(detectors=["induction", "copy_suppression"]), "unknown detector 'copy_suppression'; detectors: .*induction"),
    (dict(detectors=["next_token"]), "needs a bidirectional model"),
    (dict(probes=[TextProbe(0, 40), RepeatedProbe(0, 10, 4)]), "n_examples must be an integer of at least 1"),
    (dict(probes=[TextProbe(8, 100), RepeatedProbe(8, 10, 4)]), "the text probe needs 100 tokens but .* takes at most 48"),
    (dict(probes=[TextProbe(8, 40), RepeatedProbe(8, 20, 4)]), "the repeated probe needs 81 tokens"),
    (dict(probes=[TextProbe(100000, 40), RepeatedProbe(8, 10, 4)]), "at most .* examples"),
])
def test_bad_input(planted, kwargs, message):
    with pytest.raises(headscope.HeadscopeError, match=message):
        analyze(planted, **{**SMALL, **kwargs})


def test_tokenizer_without_enough_vocabulary(tmp_path):
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[BOS]"] + list("abcdefghi"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]").save_pretrained(tmp_path)
    tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=12, n_positions=128, n_embd=8, n_layer=1, n_head=2)).save_pretrained(tmp_path)
    loaded = headscope.load(str(tmp_path), device="cpu")
    with pytest.raises(headscope.HeadscopeError, match="only 9 ordinary token ids.*needs 25 distinct ones"):
        analyze(loaded, detectors=["induction"], probes=[RepeatedProbe(n_examples=2)])


def test_detectors_called_on_a_loaded_model_and_on_captured_patterns(planted):
    from headscope.detectors import induction, previous_token

    table = analyze(planted, detectors=["induction"], **SMALL).scores
    with pytest.raises(headscope.HeadscopeError, match=r"headscope.analyze\(loaded, detectors=\['induction'\]\)"):
        induction(planted)  # a detector scores patterns; running a model is analyze's job
    assert list(table.columns) == ["layer", "head", "detector", "score", "ci_low", "ci_high", "n", "control", "control_max",
                                   "site"]
    assert table.set_index(["layer", "head"]).score[(1, 0)] > 0.99
    text_ids = planted.tokenizer("the cat sat on the mat. the cat sat on the mat.", return_tensors="pt")["input_ids"]
    ids = torch.cat([torch.tensor([[planted.tokenizer.bos_token_id]]), text_ids], dim=1)
    with torch.no_grad(), headscope.capture(planted.model) as cap:
        planted.model(input_ids=ids)
    prev = previous_token(cap.patterns).set_index(["layer", "head"]).score
    assert prev[(0, 0)] == pytest.approx(1.0, abs=1e-4) and prev[(0, 2)] < 0.2
    ind = induction(cap.patterns, input_ids=ids, content_start=1).set_index(["layer", "head"]).score
    assert ind[(1, 0)] > 0.99
    with pytest.raises(headscope.HeadscopeError, match="pass input_ids="):
        induction(cap.patterns)
    assert previous_token(cap.patterns[0][0]).shape[0] == 4  # one [head, q, k] map


def test_analyze_in_head_groups_gives_the_same_scores(planted):
    """The maps path with a budget too small for one head's map runs one head at a time."""
    whole = analyze(planted, lazy=False, explorer_examples=0, **SMALL)
    grouped = analyze(planted, lazy=False, map_budget=1, explorer_examples=0, **SMALL)
    assert {p["patterns"] for p in whole.meta["probes"].values()} == {"maps"}
    assert {p["patterns"] for p in grouped.meta["probes"].values()} == {"maps, 1 heads at a time"}
    pd.testing.assert_frame_equal(grouped.labels, whole.labels)
    a, b = whole.scores, grouped.scores
    assert (a.score - b.score).abs().max() < 1e-6


def test_a_default_detector_with_too_few_arcs_degrades_and_says_why():
    # 24 positions: too few treebank sentences fit for 30 arcs per half, so the syntactic
    # detector runs without its held-out rule: accuracies kept, no label, and a note says why.
    from headscope.loading.loader import Loaded
    from tests.support.planted import char_tokenizer
    from tests.support.tiny import tiny_model

    loaded = Loaded.from_model(tiny_model("gpt2", positions=24), char_tokenizer(), name="short")
    analysis = analyze(loaded, probes=[TextProbe(4, 16), RepeatedProbe(4, 5, 2)], explorer_examples=0, control=None)
    assert set(analysis.meta["detectors"]) == set(detectors.defaults(causal=True))
    assert "syntactic" not in analysis.meta.get("skipped_detectors", {})
    assert any("no relation has the 30 arcs in each half" in note for note in analysis.meta["syntax_notes"])
    assert analysis.syntax.accuracy.notna().all() and analysis.syntax.held_out_margin.isna().all()
    assert analysis.scores[analysis.scores.detector == "syntactic"].score.isna().all()
    assert not analysis.labels.label.str.startswith("syntactic").any()
