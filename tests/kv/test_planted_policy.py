"""The planted model (tests/support/planted.py): its 1.0 induction head is the one head that copies
a needle back (`tests/detectors/test_retrieval.py`). A policy keeping it full preserves the copy
task exactly; streaming it breaks the task; streaming every other head changes nothing."""
import numpy as np
import pytest
import torch

import headscope
from headscope.hf.streaming import stream_heads
from headscope.kv.evaluate import conditions
from headscope.loading.loader import Loaded
from headscope.probes.kinds import NeedleProbe
from tests.support.planted import char_tokenizer, planted_model

SINK, RECENT = 1, 4  # the needle lies ~15 positions before its copy: out of a streaming head's reach
RETRIEVAL_HEAD = (1, 0)
ALL_HEADS = [(layer, head) for layer in range(2) for head in range(4)]  # GPT-2: a KV head per query head


@pytest.fixture(scope="module")
def loaded():
    return Loaded(model=planted_model(), tokenizer=char_tokenizer(), name="planted", family="gpt2", causal=True)


@pytest.fixture(scope="module")
def copy_prompt(loaded):
    tok = loaded.tokenizer
    hay, needle, question = "abcdefghijklmnopqrst", "XYZQWV", " ?:"
    ids = [tok.bos_token_id] + tok(hay + needle + "uvw" + question + needle, add_special_tokens=False)["input_ids"]
    return torch.tensor([ids]), len(needle)


def _copy(loaded, prompt, streaming):
    """(logits at the answer queries, share of answer tokens after the first one predicted)."""
    ids, n = prompt
    with torch.no_grad(), stream_heads(loaded.model, streaming, SINK, RECENT):
        logits = loaded.model(input_ids=ids).logits[0, -n - 1:-1]
    hits = logits.argmax(-1) == ids[0, -n:]
    return logits, float(hits[1:].float().mean())  # the first answer token follows the question: not a copy


def test_keeping_the_retrieval_head_keeps_the_copy_task_and_streaming_it_breaks_it(loaded, copy_prompt):
    full_logits, full_acc = _copy(loaded, copy_prompt, [])
    assert full_acc == 1.0
    others = [h for h in ALL_HEADS if h != RETRIEVAL_HEAD]
    kept_logits, kept_acc = _copy(loaded, copy_prompt, others)  # every other head streams
    assert kept_acc == 1.0
    assert torch.equal(kept_logits.argmax(-1), full_logits.argmax(-1))
    assert torch.allclose(kept_logits, full_logits, atol=1e-4, rtol=0)  # the other heads' far keys carry ~e^-30
    _, broken_acc = _copy(loaded, copy_prompt, [RETRIEVAL_HEAD])
    assert broken_acc == 0.0


def test_the_retrieval_ranking_keeps_the_planted_head_when_one_head_is_kept(loaded):
    probe = NeedleProbe(lengths=(40,), depths=(0.3, 0.6), n_needles=1, needles=("XYZQWV",), question=" ?:")
    analysis = headscope.analyze(loaded, ["retrieval"], [probe], control=None, ov=False, explorer_examples=0)
    policy = headscope.kv_policy(analysis, keep=1 / 8, sink=SINK, recent=RECENT)
    assert list(zip(*np.nonzero(policy.full))) == [RETRIEVAL_HEAD]
    reverse = [c for c in conditions(policy, keeps=(1 / 8,), n_random=5) if c[0] == "reverse"][0]
    assert not reverse[3][RETRIEVAL_HEAD]
