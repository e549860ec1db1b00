"""kv_evaluate's numbers against independent computations on a tiny random Llama (GQA) that reads
SmolLM2's tokenizer: full attention against the model's own attention, streaming conditions
against plain eager attention with a hand-built mask (tests/support/kv_reference.py)."""
import numpy as np
import pytest
import torch

import headscope
from headscope.atomic import read_card
from headscope.errors import HeadscopeError
from headscope.kv.evaluate import HELD_OUT_NEEDLES, HELD_OUT_QUESTION, KVEvaluation, conditions, kv_evaluate
from headscope.kv.policy import policy_from_values
from headscope.kv.report import curve_data
from headscope.loading.loader import Loaded
from headscope.probes.needle import NEEDLES, QUESTION, needle_probe
from tests.support.kv_reference import reference_attention
from tests.support.tiny import tiny_config

SINK, RECENT, LENGTH = 4, 16, 160


@pytest.fixture(scope="module")
def loaded():
    import transformers as tf

    tokenizer = headscope.load("smollm2-135m").tokenizer
    config = tiny_config("llama", positions=512)  # 6 query heads share 2 key/value heads
    config.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    return Loaded(model=tf.AutoModelForCausalLM.from_config(config).eval(), tokenizer=tokenizer, name="tiny llama",
                  family="llama", causal=True)


@pytest.fixture(scope="module")
def policy():
    values = np.random.default_rng(1).random((2, 2))  # 2 layers x 2 KV heads
    return policy_from_values(values, 0.5, 6, SINK, RECENT, "tiny llama")


@pytest.fixture(scope="module")
def evaluation(loaded, policy):
    return kv_evaluate(loaded, policy, lengths=(LENGTH,), depths=(0.5,), keeps=(0.25, 0.5), n_random=5)


def _by_hand(loaded, example, streaming: dict):
    """(accuracy, mean loss) from the reference attention: answer tokens predicted, and the
    cross-entropy of the text before the needle from position sink + recent on."""
    ids = example.input_ids[None]
    with torch.no_grad(), reference_attention(loaded.model, streaming, SINK, RECENT):
        logits = loaded.model(input_ids=ids).logits[0].float()
    answer = logits[example.queries].argmax(-1) == example.input_ids[example.answer]
    text = torch.arange(SINK + RECENT, example.needle.start - 1)
    loss = torch.nn.functional.cross_entropy(logits[text], example.input_ids[text + 1])
    return float(answer.float().mean()), float(loss)


def test_the_held_out_needles_are_not_the_ranking_needles():
    assert not set(HELD_OUT_NEEDLES) & set(NEEDLES) and HELD_OUT_QUESTION != QUESTION


def test_conditions_cover_every_baseline_with_the_same_number_of_full_heads(policy):
    todo = conditions(policy, keeps=(0.25, 0.5), n_random=5, seed=0)
    kinds = [(kind, keep) for kind, keep, _, _ in todo]
    assert kinds[:2] == [("full", 1.0), ("streaming", 0.0)]
    assert kinds.count(("random", 0.5)) == 5 and kinds.count(("headscope", 0.25)) == 1
    for kind, keep, _, full in todo[2:]:
        assert full.sum() == max(1, round(keep * 4))
    top = [full for kind, keep, _, full in todo if kind == "headscope" and keep == 0.5][0]
    assert np.array_equal(top, policy.full)
    reverse = [full for kind, keep, _, full in todo if kind == "reverse" and keep == 0.5][0]
    assert not (top & reverse).any()


def test_full_and_streaming_numbers_equal_independent_computations(loaded, policy, evaluation):
    example = needle_probe(loaded.tokenizer, [LENGTH], (0.5,), 1, 0, HELD_OUT_NEEDLES, HELD_OUT_QUESTION)[0]
    t = evaluation.table
    full = t[t.kind == "full"].iloc[0]
    accuracy, loss = _by_hand(loaded, example, {})
    assert full.accuracy == accuracy and full.loss == pytest.approx(loss, abs=1e-4)
    streaming = t[t.kind == "streaming"].iloc[0]
    accuracy, loss = _by_hand(loaded, example, {0: [0, 1], 1: [0, 1]})
    assert streaming.accuracy == accuracy and streaming.loss == pytest.approx(loss, abs=1e-4)
    assert streaming.loss != pytest.approx(full.loss, abs=1e-3)  # the window matters on this prompt
    top = t[(t.kind == "headscope") & (t.keep == 0.5)].iloc[0]
    streams = {}
    for layer, head in zip(*np.nonzero(~policy.with_keep(0.5).full)):
        streams.setdefault(int(layer), []).append(int(head))
    accuracy, loss = _by_hand(loaded, example, streams)
    assert top.accuracy == accuracy and top.loss == pytest.approx(loss, abs=1e-4)


def test_kv_bytes_are_full_heads_times_t_plus_streaming_heads_times_the_window(evaluation):
    t = evaluation.table
    d_head, size = 10, 4  # tiny llama: head_dim 10, fp32; 2 layers x 2 KV heads
    for row in t.itertuples():
        by_hand = 2 * d_head * size * (row.full_heads * row.length + (4 - row.full_heads) * (SINK + RECENT))
        assert row.kv_bytes == by_hand
        assert row.kv_share == pytest.approx(by_hand / (2 * d_head * size * 4 * row.length))


def test_summary_and_page(evaluation, tmp_path):
    summary = evaluation.summary()
    assert list(summary.length) == [LENGTH]
    full = summary.full_accuracy.iloc[0]
    t = evaluation.table
    for kind in ("headscope", "reverse"):
        rows = t[t.kind == kind].sort_values("keep")
        good = rows[rows.accuracy >= 0.9 * full]
        expected = good.keep.min() if len(good) else float("nan")
        assert summary[f"{kind}_smallest_keep"].iloc[0] == pytest.approx(expected, nan_ok=True)
    series = curve_data(evaluation)[LENGTH]
    assert [s.name for s in series].count("random (median)") == 1 and len(series) == 5 + 5
    folder = evaluation.save(tmp_path / "eval")
    page = (folder / "index.html").read_text()
    assert page.count('<script charset="utf-8">') == 1  # plotly.js embedded once
    assert f'<div id="kv-accuracy-{LENGTH}"' in page and f'<div id="kv-loss-{LENGTH}"' in page
    card = read_card(folder)  # what `headscope report --index` lists: the policy's numbers from the summary
    keep = evaluation.meta["policy"]["keep"]
    row = summary.iloc[0]
    assert card["kind"] == "kv evaluation" and card["model"] == evaluation.meta["model"]
    assert dict(card["headline"])[f"needle accuracy at {LENGTH} tokens"] == (
        f"{row[f'keep {keep:g}: headscope']:.3f} (random median {row[f'keep {keep:g}: random median']:.3f}, "
        f"full {row['full_accuracy']:.3f})")
    back = KVEvaluation.load(folder)
    assert list(back.table.kind) == list(t.kind) and list(back.table.kv_bytes) == list(t.kv_bytes)
    assert np.allclose(back.table[["accuracy", "loss"]], t[["accuracy", "loss"]], rtol=1e-12, atol=0)


def test_a_policy_of_another_models_shape_is_a_one_line_error(loaded):
    other = policy_from_values(np.zeros((3, 2)), 0.5, 6, SINK, RECENT)
    with pytest.raises(HeadscopeError, match="another model") as err:
        kv_evaluate(loaded, other, lengths=(LENGTH,))
    assert "\n" not in str(err.value)
