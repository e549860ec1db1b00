"""The syntactic-head detector: word attention, baseline, planted heads, the pipeline, real models."""
import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.loading.loader import Loaded
from headscope import run_syntax
from headscope.detectors.syntax import MIN_ARCS, THRESHOLD
from headscope.detectors.syntax.baselines import PREDICTORS, predictor_hits
from headscope.detectors.syntax.crossfit import NotEnoughArcs, score_arcs
from headscope.detectors.syntax.scoring import arc_hits, best_heads, offset_baseline, predicted_partners, word_attention
from headscope.probes.arcs import collect_arcs
from headscope.probes.conllu import Sentence, bundled_treebank


def _sentence(sent_id, words, heads, relations):
    return Sentence(sent_id, tuple(words.split()), tuple(heads), tuple(relations.split()), (True,) * len(heads))


# ---------------------------------------------------------------- word-level attention (section 4.1)

def test_word_attention_sums_to_and_means_from():
    # Tokens: [CLS] a b1 b2 c [SEP]  ->  words a=0, b=1 (two pieces), c=2.
    token_words = torch.tensor([[-1, 0, 1, 1, 2, -1]])
    pattern = torch.tensor([[[
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # [CLS]: dropped
        [0.1, 0.2, 0.3, 0.1, 0.2, 0.1],  # a
        [0.2, 0.4, 0.1, 0.1, 0.1, 0.1],  # b1
        [0.0, 0.2, 0.2, 0.2, 0.0, 0.4],  # b2
        [0.5, 0.0, 0.1, 0.1, 0.3, 0.0],  # c
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],  # [SEP]: dropped
    ]]])  # (batch 1, head 1, query 6, key 6)
    words = word_attention(pattern, token_words, 3)
    expected = torch.tensor([
        [0.2, 0.3 + 0.1, 0.2],  # a: to b = b1 + b2
        [(0.4 + 0.2) / 2, (0.2 + 0.4) / 2, (0.1 + 0.0) / 2],  # b: mean of rows b1, b2
        [0.0, 0.1 + 0.1, 0.3],  # c
    ])
    torch.testing.assert_close(words[0, 0], expected)
    # [CLS]/[SEP] are dropped, not renormalised: rows sum to 0.8, 0.65, 0.5.
    torch.testing.assert_close(words[0, 0].sum(-1), torch.tensor([0.8, 0.65, 0.5]))
    before = words.clone()
    partners = predicted_partners(words, torch.ones(1, 3, dtype=torch.bool))
    # a -> b (0.4); b -> a (0.3, its own 0.3 zeroed); c -> b (0.2: [CLS] 0.5 and itself 0.3 do not count)
    assert partners[0, 0].tolist() == [1, 0, 1]
    assert torch.equal(words, before)  # the input is not modified


def test_word_attention_ignores_padding_and_absent_words():
    token_words = torch.tensor([[0, 1, 2], [0, 1, -1]])  # second sentence: 2 words + a pad token
    pattern = torch.tensor([[0.0, 0.1, 0.9], [0.6, 0.0, 0.4], [0.3, 0.3, 0.4]]).expand(2, 1, 3, 3)
    words = word_attention(pattern, token_words, 3)
    assert words[1, 0, :, 2].abs().sum() == 0 and words[1, 0, 2].abs().sum() == 0
    present = torch.tensor([[True, True, True], [True, True, False]])
    partners = predicted_partners(words, present)
    assert partners[0, 0, 0] == 2 and partners[1, 0, 0] == 1  # the pad column never wins


def test_token_level_planted_head_through_pieces():
    # A sentence whose words are split into pieces; every piece of word i puts all its attention
    # on the *last* piece of word i's gold head. Word-level argmax must give the gold heads.
    sentence = bundled_treebank()[3]
    n = len(sentence.words)
    pieces = [1 + i % 3 for i in range(n)]  # 1, 2, 3, 1, 2, 3 ... tokens per word
    token_words = [-1] + [w for w in range(n) for _ in range(pieces[w])] + [-1]
    last_piece = {w: max(t for t, x in enumerate(token_words) if x == w) for w in range(n)}
    pattern = torch.zeros(len(token_words), len(token_words))
    pattern[:, 0] = 1.0  # default: everything on [CLS]
    for t, w in enumerate(token_words):
        if w >= 0 and sentence.heads[w]:
            pattern[t] = 0.0
            pattern[t, last_piece[sentence.heads[w] - 1]] = 0.7
            pattern[t, 0] = 0.3
    words = word_attention(pattern[None, None], torch.tensor([token_words]), n)
    partners = predicted_partners(words, torch.ones(1, n, dtype=torch.bool))[0, 0]
    for w, head in enumerate(sentence.heads):
        if head:
            assert partners[w] == head - 1


# ---------------------------------------------------------------- the offset baseline, by hand

BASELINE_SENTENCES = [
    _sentence("A", "the dog barks", [2, 3, 0], "det nsubj root"),
    _sentence("B", "the big dog sleeps .", [3, 3, 4, 0, 4], "det amod nsubj root punct"),
    _sentence("C", "dogs eat the bones", [2, 0, 4, 2], "nsubj root det obj"),
    _sentence("D", "dogs eat bones", [2, 0, 2], "nsubj root obj"),
]


def test_offset_baseline_worked_example():
    # Offsets are partner - attending, 0-based words; root and punct are not scored.
    # det, dep->head:   A the(0)->dog(1) +1 | B the(0)->dog(2) +2 | C the(2)->bones(3) +1
    #                   +1: 2/3, +2: 1/3, others 0            -> baseline 2/3 at +1
    # det, head->dep:   the same arcs reversed: -1, -2, -1     -> 2/3 at -1
    # nsubj, dep->head: A dog(1)->barks(2) +1 | B dog(2)->sleeps(3) +1 | C +1 | D +1 -> 4/4 at +1
    # amod, dep->head:  B big(1)->dog(2) +1                    -> 1/1 at +1
    # obj, dep->head:   C bones(3)->eat(1) -2 | D bones(2)->eat(1) -1
    #                   -1: 1/2, -2: 1/2, a tie: the nearer offset wins -> 1/2 at -1
    # obj, head->dep:   +2 and +1                              -> 1/2 at +1
    # punct (B ".") is not scored at all.
    arcs = collect_arcs(BASELINE_SENTENCES, causal=False)
    table = offset_baseline(arcs).set_index(["relation", "direction"])
    expected = {
        ("det", "dep->head"): (3, 2 / 3, 1), ("det", "head->dep"): (3, 2 / 3, -1),
        ("nsubj", "dep->head"): (4, 1.0, 1), ("nsubj", "head->dep"): (4, 1.0, -1),
        ("amod", "dep->head"): (1, 1.0, 1), ("amod", "head->dep"): (1, 1.0, -1),
        ("obj", "dep->head"): (2, 0.5, -1), ("obj", "head->dep"): (2, 0.5, 1),
    }
    assert set(table.index) == set(expected)
    for key, (n, baseline, offset) in expected.items():
        row = table.loc[key]
        assert (row.n, row.baseline_offset) == (n, offset), key
        assert row.baseline == pytest.approx(baseline), key
    assert table.loc[("det", "dep->head"), "acc_+2"] == pytest.approx(1 / 3)
    assert table.loc[("obj", "dep->head"), "acc_-2"] == pytest.approx(1 / 2)


def test_offset_baseline_causal():
    # Causal: an arc is scored in a direction only when the partner precedes the attending word.
    # det dep->head: heads follow determiners -> no arcs; det head->dep: -1, -2, -1 -> 2/3 at -1.
    # obj dep->head: both heads precede -> -2, -1 -> tie -> 1/2 at -1; obj head->dep: none.
    # nsubj: subjects precede verbs here -> only head->dep, all at -1.
    table = offset_baseline(collect_arcs(BASELINE_SENTENCES, causal=True)).set_index(["relation", "direction"])
    assert set(table.index) == {("det", "head->dep"), ("obj", "dep->head"), ("nsubj", "head->dep"),
                                ("amod", "head->dep")}
    assert table.loc[("det", "head->dep"), "baseline"] == pytest.approx(2 / 3)
    assert table.loc[("obj", "dep->head"), ["baseline", "baseline_offset"]].tolist() == [0.5, -1]


# ---------------------------------------------------------------- planted heads on the whole treebank

def _planted_predictions(sentences):
    """[sentence, layer 1, head 2, word]: head 0 attends to each word's gold head, head 1 to word - 1."""
    n_words = max(len(s.words) for s in sentences)
    words = torch.zeros(len(sentences), 2, n_words, n_words)  # word-level attention
    present = torch.zeros(len(sentences), n_words, dtype=torch.bool)
    for i, sentence in enumerate(sentences):
        present[i, :len(sentence.words)] = True
        for w, head in enumerate(sentence.heads):
            if head:
                words[i, 0, w, head - 1] = 0.9
            if w:
                words[i, 1, w, w - 1] = 0.9
    return predicted_partners(words, present)[:, None]  # (S, 1, 2, W)


def _score(sentences, predictions, causal, control=None, **kwargs):
    arcs = collect_arcs(sentences, causal)
    pieces = [[1] * len(s.words) for s in sentences]
    hits = predictor_hits(arcs, sentences, pieces)
    control_hits = None if control is None else arc_hits(control, arcs).flatten(1)
    kwargs.setdefault("min_arcs", MIN_ARCS)
    table, heads, _ = score_arcs(arc_hits(predictions, arcs).flatten(1), arcs, len(sentences), predictions.shape[1:3],
                              hits, control_hits, **kwargs)
    return arcs, hits, table, heads


def test_position_only_predictors_worked_example():
    # The big dog barks .   pieces 1 3 1 2 1; UPOS DET ADJ NOUN VERB PUNCT
    sentence = Sentence("p", ("The", "big", "dog", "barks", "."), (3, 3, 4, 0, 4),
                        ("det", "amod", "nsubj", "root", "punct"), (True,) * 5, ("DET", "ADJ", "NOUN", "VERB", "PUNCT"))
    arcs = collect_arcs([sentence], causal=False)
    hits = predictor_hits(arcs, [sentence], [[1, 3, 1, 2, 1]])
    column = {name: i for i, name in enumerate(PREDICTORS)}
    named = {}
    for a in range(len(arcs.sentence)):
        key = (int(arcs.attending[a]), int(arcs.partner[a]))
        named[key] = {name for name, i in column.items() if hits[a, i]}
    # The -> dog: 2 to the right (the next content word after "The" is "big")
    assert named[(0, 2)] == {"offset +2"}
    # dog -> The: the first word, 2 to the left
    assert named[(2, 0)] == {"offset -2", "first word"}
    # big -> dog: next content word, +1; dog -> big: previous content word, most pieces, -1
    assert named[(1, 2)] == {"offset +1", "next content word"}
    assert named[(2, 1)] == {"offset -1", "previous content word", "most pieces"}
    # dog -> barks: last word ("." is punctuation), next content word, +1
    assert named[(2, 3)] == {"offset +1", "last word", "next content word"}
    # barks -> dog: -1, previous content word, and the last word other than barks itself;
    # most pieces from barks is "big" (3)
    assert named[(3, 2)] == {"offset -1", "previous content word", "last word"}
    # Without UPOS the content-word predictors never fire.
    bare = Sentence("q", sentence.words, sentence.heads, sentence.relations, sentence.space_after)
    bare_hits = predictor_hits(collect_arcs([bare], causal=False), [bare], [[1, 3, 1, 2, 1]])
    assert not bare_hits[:, column["previous content word"]].any()
    assert not bare_hits[:, column["next content word"]].any()


@pytest.mark.parametrize("causal", [False, True])
def test_planted_gold_head_and_offset_head(causal):
    sentences = bundled_treebank()
    predictions = _planted_predictions(sentences)
    arcs, hits, table, heads = _score(sentences, predictions, causal, n_resamples=200)
    gold = table[(table["head"] == 0) & (table.direction == "dep->head")]
    frequent = gold[gold.n >= 2 * MIN_ARCS]
    assert len(frequent) >= (6 if causal else 15)
    assert (frequent.accuracy == 1.0).all()
    # baseline = the best position-only predictor on the same arcs (no control here)
    group_n = torch.bincount(arcs.group, minlength=arcs.n_groups).clamp(min=1)
    shares = torch.zeros(arcs.n_groups, hits.shape[1]).index_add_(0, arcs.group, hits.float()) / group_n[:, None]
    for row in frequent.itertuples():
        g = arcs.relations.index(row.relation) * 2
        assert row.baseline == pytest.approx(float(shares[g].max()))
        assert row.baseline_kind == PREDICTORS[int(shares[g].argmax())]
    # The offset -1 head never beats the baseline, which contains offset -1.
    offset = table[table["head"] == 1]
    assert (offset.accuracy <= offset.baseline + 1e-9).all()
    assert not offset.significant.any()
    assert table.causal_only.all() == causal

    # The planted head's held-out margin, recomputed by hand from the two halves.
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(0))
    halves = [set(order[: len(sentences) // 2].tolist()), set(order[len(sentences) // 2:].tolist())]
    planted = heads.set_index("head").loc[0]
    g = arcs.relations.index(planted.relation) * 2 + ("dep->head", "head->dep").index(planted.direction)
    margins, counts = [], []
    for half in halves:
        mine = torch.tensor([int(s) in half for s in arcs.sentence]) & (arcs.group == g)
        n = int(mine.sum())
        base = hits[mine].float().mean(0).max().item()
        accuracy = (predictions[arcs.sentence[mine], 0, 0, arcs.attending[mine]] == arcs.partner[mine]).float().mean()
        margins.append(accuracy.item() - base)
        counts.append(n)
    # both halves choose it (margin >= 0.10 there), so both held-out margins count
    assert min(margins) >= THRESHOLD
    expected = (margins[0] * counts[0] + margins[1] * counts[1]) / sum(counts)
    assert planted.score == pytest.approx(expected, abs=1e-6)
    assert planted.label == "syntactic:" + planted.relation
    assert planted.ci_low <= planted.score <= planted.ci_high
    assert heads.set_index("head").loc[1].label == "none"  # an offset head is no syntactic head
    best = best_heads(table, MIN_ARCS)
    assert set(best.relation) == set(table[table.n >= MIN_ARCS].relation)


def test_a_model_equal_to_its_control_earns_nothing():
    # The control's best head joins the baseline: a model whose heads are the control's cannot
    # beat it, however syntactic its heads are.
    sentences = bundled_treebank()
    predictions = _planted_predictions(sentences)
    _, _, table, heads = _score(sentences, predictions, False, control=predictions, n_resamples=100)
    assert (table.accuracy <= table.baseline + 1e-9).all()
    assert table.baseline_kind.str.startswith("control").any()
    assert not table.significant.any() and (heads.label == "none").all()
    assert (table.control_accuracy == table.accuracy).all()
    assert (heads.control_max <= 0).all()


def test_cross_fitting_does_not_reward_luck():
    # A head that guesses at random among the words: in-sample, the best of ~40 relation x
    # direction pairs may beat the baseline by chance; held out, it must not be significant.
    sentences = bundled_treebank()
    gen = torch.Generator().manual_seed(5)
    n_words = max(len(s.words) for s in sentences)
    lengths = torch.tensor([len(s.words) for s in sentences])
    guesses = (torch.rand(len(sentences), 1, 8, n_words, generator=gen) * lengths[:, None, None, None]).long()
    _, _, table, heads = _score(sentences, guesses, False, n_resamples=200)
    assert not table.significant.any()
    assert (heads.label == "none").all()


def test_too_few_arcs_keep_the_accuracies_without_labels():
    # A handful of sentences: no relation has 30 arcs in each half, so nothing is held out.
    predictions = _planted_predictions(BASELINE_SENTENCES)
    arcs = collect_arcs(BASELINE_SENTENCES, False)
    pieces = [[1] * len(s.words) for s in BASELINE_SENTENCES]
    table, heads, note = score_arcs(arc_hits(predictions, arcs).flatten(1), arcs, len(BASELINE_SENTENCES),
                                    predictions.shape[1:3], predictor_hits(arcs, BASELINE_SENTENCES, pieces),
                                    min_arcs=MIN_ARCS)
    assert "no relation has the 30 arcs in each half" in note and "no head is labelled syntactic" in note
    assert table.held_out_margin.isna().all() and not table.significant.any()
    assert table.accuracy.notna().all() and table.baseline.notna().all()
    # head 0 of the planted predictions points every word at its gold head: accuracy 1 on dep->head
    planted = table[(table["head"] == 0) & (table.direction == "dep->head")]
    assert (planted.accuracy == 1.0).all()
    assert (heads.label == "none").all() and heads.score.isna().all() and len(heads) == 2
    assert set(heads.relation) <= set(table.relation)


def test_no_arcs_at_all_is_an_error():
    root_only = [_sentence("R", "go", [0], "root")]
    with pytest.raises(NotEnoughArcs, match="none were found"):
        _score(root_only, _planted_predictions(root_only), False)


# ---------------------------------------------------------------- the pipeline on tiny models

def _tiny(family):
    from tests.support.planted import char_tokenizer
    from tests.support.tiny import tiny_model

    return Loaded(tiny_model(family), char_tokenizer(), f"tiny-{family}", family, family != "bert")


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_pipeline_on_tiny_model(family):
    # The char tokenizer gives one token per character; tiny models take 64 positions, so
    # longer sentences are skipped. Padding must not change anything: batch 1 == batch 5.
    loaded = _tiny(family)
    sentences = [s for s in bundled_treebank() if len(s.text) <= 70][:40]
    calls = []
    one = run_syntax(loaded, sentences, batch_size=1, min_arcs=5, seed=1)
    five = run_syntax(loaded, sentences, batch_size=5, min_arcs=5, seed=1, progress=lambda *a: calls.append(a))
    assert one.table.equals(five.table)
    assert one.head_scores.equals(five.head_scores)
    assert len(one.head_scores) == 2 * loaded.n_heads
    assert list(one.head_scores.columns[:8]) == ["layer", "head", "detector", "score", "ci_low", "ci_high", "n",
                                                 "relation"]
    skipped = sum(len(s.text) + (family != "bert") > 64 for s in sentences)  # causal: a BOS in front
    assert skipped and one.meta["skipped"] == skipped
    assert any(f"{skipped} sentences skipped: longer than the context" in note for note in one.notes)
    assert (any("causal model" in note for note in one.notes)) == loaded.causal
    assert (any("[BOS] put in front" in note for note in one.notes)) == one.meta["bos_added"] == loaded.causal
    kept = len(sentences) - skipped
    assert calls[-1] == ("syntax", -(-kept // 5), -(-kept // 5))  # one call per batch of 5
    sample = run_syntax(loaded, sentences, min_arcs=1, max_sentences=10)
    assert sample.meta["n_sentences"] + sample.meta["skipped"] == 10


def test_bad_input():
    loaded = _tiny("bert")
    with pytest.raises(HeadscopeError, match="no sentences"):
        run_syntax(loaded, [])
    broken = _sentence("x", "a b", [0, 0], "root root")
    with pytest.raises(HeadscopeError, match="2 roots"):
        run_syntax(loaded, [broken])
    with pytest.raises(HeadscopeError, match="longer than the model's context"):
        run_syntax(loaded, [s for s in bundled_treebank() if len(s.text) > 80][:3])
    with pytest.raises(HeadscopeError, match="batch_size"):
        run_syntax(loaded, BASELINE_SENTENCES, batch_size=0)


# ---------------------------------------------------------------- the real reference models

@pytest.mark.slow
def test_minilm_syntactic_heads(minilm):
    # All 1,016 bundled sentences, position-only baselines (no control here). Clark et al.
    # report det 94.3 vs 51.7 (offset baseline only) for BERT-base.
    result = run_syntax(minilm)
    assert result.notes == [] and result.meta["n_sentences"] == len(bundled_treebank())
    assert {"syntactic:det", "syntactic:case"} <= set(result.head_scores.label)
    det = result.best.set_index("relation").loc["det"]
    assert det.significant and det.accuracy >= det.baseline_accuracy + 0.15
    assert len(result.head_scores) == 6 * 12


@pytest.mark.slow
def test_smollm2_causal_directions_only(smollm2):
    # A sample: the whole treebank takes ~30-70 s on CPU for this 30-layer model; 120 sentences
    # give the frequent relations 30 arcs in each half.
    result = run_syntax(smollm2, max_sentences=120)
    assert result.meta["n_sentences"] == 120
    assert any("only arcs whose partner precedes" in note for note in result.notes)
    assert any("<|im_start|> put in front" in note for note in result.notes)
    assert result.table.causal_only.all()
    # determiners precede their nouns: a causal model scores det only as head->dep
    assert set(result.table[result.table.relation == "det"].direction) == {"head->dep"}
    assert len(result.head_scores) == 30 * 9
    assert (result.best.accuracy > result.best.baseline_accuracy).any()  # some relation beats its baseline


def test_analyze_counts_four_sentences_an_example():
    """`analyze`'s batch size counts examples; a treebank example is 4 sentences, so a pass takes
    4 x batch_size sentences, with the same scores as one sentence a pass."""
    from headscope.analysis.analyze import analyze
    from headscope.probes.kinds import TreebankProbe

    loaded = _tiny("llama")
    sentences = [s for s in bundled_treebank() if len(s.text) <= 60]  # 267, enough arcs for every head
    calls = []
    two = analyze(loaded, detectors=["syntactic"], probes=[TreebankProbe(sentences)], batch_size=2, control=None,
                  progress=lambda *a: calls.append(a))
    treebank_calls = [c for c in calls if c[0] == "probe treebank"]
    assert treebank_calls[-1][1:] == (-(-len(sentences) // 8),) * 2  # every sentence fits: 8 a pass
    one = run_syntax(loaded, sentences, batch_size=1, seed=0)
    scored = two.scores[two.scores.detector == "syntactic"].sort_values(["layer", "head"])
    expected = one.head_scores.sort_values(["layer", "head"])
    assert not expected.score.isna().any()
    torch.testing.assert_close(torch.tensor(scored.score.to_numpy()), torch.tensor(expected.score.to_numpy()))
