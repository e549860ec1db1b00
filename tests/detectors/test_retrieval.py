"""Retrieval heads (Wu et al. 2024): the copy formula, the answer-rows computation, controls."""
import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from headscope.loading.loader import Loaded
from headscope.probes.needle import NEEDLES, NeedleExample, needle_probe
from headscope.detectors.retrieval.scoring import (
    THRESHOLD, _per_example, answer_rows, copy_scores, needle_copy_accuracy, retrieval_scores, run_needle,
)
from tests.support.planted import VOCAB, char_tokenizer, planted_model
from tests.support.tiny import tiny_model


def _example(ids: list[int], needle_at: int, needle_len: int) -> NeedleExample:
    """A needle prompt whose answer (the needle's ids again) ends it."""
    return NeedleExample(torch.tensor(ids), slice(needle_at, needle_at + needle_len),
                         slice(len(ids) - needle_len, len(ids)), len(ids), 0.5, 0)


def test_copy_scores_of_a_hand_set_argmax():
    # prompt: 0 | 5 6 (haystack) | 10 11 12 13 (needle at 3..6) | 7 8 (question) | 10 11 12 13 (answer at 9..12)
    ids = [0, 5, 6, 10, 11, 12, 13, 7, 8, 10, 11, 12, 13]
    example = _example(ids, 3, 4)
    argmax = torch.tensor([
        [3, 4, 5, 6],   # every answer token: its own needle position -> 4/4
        [3, 5, 5, 6],   # the second lands on the needle's 12, not 11 -> 3/4
        [9, 10, 11, 12],  # the answer's own copies (outside the needle) -> 0
        [1, 4, 2, 6],   # haystack twice -> 2/4
    ])[None]  # (layer 1, head 4, n_answer 4)
    everything = torch.ones(4, dtype=torch.bool)
    assert copy_scores(argmax, example.input_ids, example.needle, example.answer, everything).tolist() == [[1.0, 0.75, 0.0, 0.5]]
    # Only answer tokens the model predicts count; the denominator stays |needle|.
    predicted = torch.tensor([False, True, True, False])
    assert copy_scores(argmax, example.input_ids, example.needle, example.answer, predicted).tolist() == [[0.5, 0.25, 0.0, 0.25]]


def test_answer_rows_argmax_of_hand_set_queries_and_keys():
    # head 0's query 4 matches key 2; head 1 (sharing the one kv head) is the opposite, -> key 3;
    # query 1 cannot see key 2 or 3 (causal), so its argmax is among keys 0-1.
    k = torch.zeros(1, 1, 5, 4)
    k[0, 0, 2, 0] = 1.0
    k[0, 0, 3, 0] = -1.0
    k[0, 0, 1, 1] = 1.0
    q = torch.zeros(1, 2, 5, 4)
    q[0, 0, :, 0] = 20.0
    q[0, 1, :, 0] = -20.0
    q[0, :, 1, 1] = 20.0
    rows = answer_rows(q, k, torch.tensor([4, 1]))
    assert rows.shape == (1, 2, 2, 5)
    assert rows.argmax(-1).tolist() == [[[2, 1], [3, 1]]]
    assert torch.allclose(rows.sum(-1), torch.ones(1, 2, 2))
    assert (rows[0, :, 1, 2:] == 0).all()  # hidden keys


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2", "gpt_neox"])
def test_answer_rows_equal_the_full_maps_rows(family):
    model = tiny_model(family)
    loaded = Loaded(model=model, tokenizer=None, name=f"tiny {family}", family=family, causal=True)
    ids = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    example = _example(ids, 10, 6)
    _, _, rows = run_needle(loaded, example, keep_rows=True)
    with headscope.capture(model) as cap:
        with torch.no_grad():
            model(input_ids=example.input_ids[None])
    for layer in range(model.config.num_hidden_layers):
        full = cap.patterns[layer][:, :, example.queries]  # (1, H, n, T)
        torch.testing.assert_close(rows[layer], full, atol=1e-5, rtol=0)


def test_planted_induction_head_copies_every_predicted_token():
    # The planted 1.0 induction head attends, from the answer token before, to the needle
    # position after that token's occurrence: the very token being emitted. The first answer
    # token's query is the question's last character, which is not in the needle.
    tok = char_tokenizer()
    hay, needle, question = "abcdefghijklmnopqrst", "XYZQWV", " ?:"
    ids = [tok.bos_token_id] + tok(hay + needle + "uvw" + question + needle, add_special_tokens=False)["input_ids"]
    example = _example(ids, 1 + len(hay), len(needle))
    loaded = Loaded(model=planted_model(), tokenizer=tok, name="planted", family="gpt2", causal=True)
    argmax, predicted, _ = run_needle(loaded, example)
    assert predicted[1:].all()  # the planted model predicts repeats by induction
    scores = copy_scores(argmax, example.input_ids, example.needle, example.answer, predicted)  # (2, 4)
    n = len(needle)
    expected = int(predicted[1:].sum()) / n
    assert scores[1, 0].item() == expected == (n - 1) / n
    assert scores[1, 1].item() == 0.0  # duplicate-token: lands on the needle's previous token
    assert scores[0].abs().sum().item() == 0.0  # layer 0 heads never land on the emitted token


def _tiny_loaded(family: str, seed: int = 0):
    """A tiny random-init model with SmolLM2's tokenizer (vocab 49152), for needle prompts."""
    import transformers as tf
    from tests.support.tiny import tiny_config

    tokenizer = headscope.load("smollm2-135m").tokenizer
    config = tiny_config(family, positions=512)
    config.vocab_size = len(tokenizer)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    return Loaded(model=model, tokenizer=tokenizer, name=f"tiny {family}", family=family, causal=True)


def test_needle_probe_puts_the_needle_at_each_depth():
    tokenizer = headscope.load("smollm2-135m").tokenizer
    examples = needle_probe(tokenizer, [300, 400], depths=(0.0, 0.5, 1.0), n_needles=2, seed=1)
    assert len(examples) == 12
    for example in examples:
        assert example.length == len(example.input_ids) == (300 if example.length <= 300 else 400)
        assert torch.equal(example.input_ids[example.needle], example.input_ids[example.answer])
        assert tokenizer.decode(example.input_ids[example.answer]).strip() == NEEDLES[example.needle_index]
        assert example.answer.stop == example.length
        assert (example.queries + 1).tolist() == list(range(example.answer.start, example.answer.stop))
    shallow, middle, deep = examples[0], examples[2], examples[4]
    assert shallow.needle.start < middle.needle.start < deep.needle.start


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_random_init_model_gets_no_retrieval_label(family):
    loaded = _tiny_loaded(family)
    examples = needle_probe(loaded.tokenizer, [256], depths=(0.2, 0.8), n_needles=2)
    # Counting every answer token (the control's rule), no head's score (its mean over
    # examples) reaches the threshold.
    values, accuracy = _per_example(loaded, examples, False, None, "test")
    assert values.mean(-1).max().item() < THRESHOLD
    assert max(accuracy) < 0.5
    result = retrieval_scores(loaded, lengths=(256,), depths=(0.2, 0.8), n_needles=2, control="random-init")
    assert not result.scores.retrieval.any()
    assert result.scores.control_max.iloc[0] < THRESHOLD
    assert needle_copy_accuracy(loaded, examples[:1], heads=[(0, 0)]) < 0.5


def test_retrieval_refuses_bidirectional_models():
    model = tiny_model("bert")
    loaded = Loaded(model=model, tokenizer=None, name="tiny bert", family="bert", causal=False)
    with pytest.raises(HeadscopeError, match="needs a causal model"):
        retrieval_scores(loaded, lengths=(64,))


@pytest.mark.slow
def test_smollm2_retrieval_heads_at_1k(smollm2):
    result = retrieval_scores(smollm2, lengths=(1024,), depths=(0.3, 0.7), n_needles=1, seed=0)
    assert result.examples.counted.all()  # SmolLM2 repeats the needle (>= half the answer tokens)
    top = result.top(1).iloc[0]
    assert top.score >= THRESHOLD and top.ci_low > top.control_max and top.retrieval
    # Far from every head: retrieval heads are a small minority (Wu et al.: under 5%).
    assert result.scores.retrieval.mean() < 0.1


def test_validate_retrieval_draws_random_heads_from_the_top_heads_layers():
    import pandas as pd

    from headscope.detectors.retrieval.scoring import RetrievalResult, validate_retrieval

    loaded = _tiny_loaded("llama")
    scores = pd.DataFrame({"layer": [0] * 6 + [1] * 6, "head": list(range(6)) * 2,
                           "score": [0.5, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.4, 0.0, 0.0]})
    result = RetrievalResult(scores, None, None)
    frame = validate_retrieval(loaded, result, k=2, n_random=3, lengths=(200,), depths=(0.5,), n_needles=1)
    assert frame.ablation.tolist() == ["none", "top", "random 1", "random 2", "random 3"]
    assert frame.heads[1] == "0.0;1.3"
    for heads in frame.heads[2:]:
        drawn = [tuple(map(int, h.split("."))) for h in heads.split(";")]
        assert sorted(layer for layer, _ in drawn) == [0, 1] and not {(0, 0), (1, 3)} & set(drawn)
    assert (frame.delta == frame.accuracy - frame.accuracy[0]).all()
    assert frame.attrs["n_examples"] == 1


def test_validate_retrieval_accuracies_are_needle_copy_accuracy_on_fresh_prompts():
    """validate's measuring core (`ProbeRunner` on `NeedleProbe.eval_probe`) gives the share of
    answer tokens predicted that `needle_copy_accuracy` counts one prompt at a time, pooled over
    two lengths by answer tokens, on the seed + 1 prompts."""
    import pandas as pd

    from headscope.detectors.retrieval.scoring import RetrievalResult, validate_retrieval

    loaded = _tiny_loaded("llama")
    scores = pd.DataFrame({"layer": [0] * 6 + [1] * 6, "head": list(range(6)) * 2, "score": [0.5] + [0.0] * 10 + [0.4]})
    frame = validate_retrieval(loaded, RetrievalResult(scores, None, None),
                               k=2, n_random=1, seed=3, lengths=(120, 200), depths=(0.3, 0.7), n_needles=1)
    examples = needle_probe(loaded.tokenizer, [120], (0.3, 0.7), 1, 4) + needle_probe(loaded.tokenizer, [200], (0.3, 0.7), 1, 4)
    for row in frame.itertuples(index=False):
        heads = [tuple(map(int, h.split("."))) for h in row.heads.split(";")] if row.heads else []
        assert row.accuracy == pytest.approx(needle_copy_accuracy(loaded, examples, heads), abs=1e-12)
    assert frame.attrs["n_examples"] == 4 and frame.attrs["seed"] == 4
