"""The built-in tasks on SmolLM2-135M: it does IOI and induction, and its tokenizer cannot do
greater-than (it splits years into single digits)."""
import pytest
import torch

import headscope
from headscope import HeadscopeError

pytestmark = pytest.mark.slow


def scores(loaded, task):
    """The metric on the clean and on the corrupted prompts, both in one forward pass."""
    clean, corrupted = task.inputs("clean"), task.inputs("corrupted")
    with torch.no_grad():
        logits = loaded.model(**{key: torch.cat([clean[key], corrupted[key]]) for key in clean}).logits
    return task.score(logits[:task.n]), task.score(logits[task.n:])


def test_smollm2_prefers_the_indirect_object(smollm2):
    task = headscope.task("ioi", smollm2, n=32, seed=0)  # n=64 and other seeds: benchmarks/tasks_smollm2.py
    task.check_for(smollm2)
    clean, corrupted = scores(smollm2, task)
    # issue 37: a mean logit difference of ~4.7 and ~100% accuracy on 40 prompts
    assert (clean > 0).float().mean() > 0.9 and clean.mean() > 2
    # ABC: no name of the clean prompt is left, so nothing tells the two answers apart: mean 0 within 3 standard errors
    assert corrupted.mean().abs() < 3 * corrupted.std() / len(corrupted) ** 0.5


def test_smollm2_copies_a_repeated_sequence(smollm2):
    task = headscope.task("induction", smollm2, n=4, seed=0, length=10)
    clean, corrupted = scores(smollm2, task)
    assert (clean > 0).all() and clean.mean() > corrupted.mean() + 5


def test_smollm2_tokenizer_cannot_do_greater_than(smollm2):
    with pytest.raises(HeadscopeError) as caught:
        headscope.task("greater-than", smollm2)
    assert str(caught.value).endswith("this tokenizer splits ' 1732' into [' ', '1', '7', '3', '2']")
