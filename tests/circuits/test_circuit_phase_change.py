"""EAP-IG on the trained phase-change model (slow: the model is trained once per session,
tests/conftest.py `phase_change`, about 60-100 s on two shared cores; the circuits take a few
seconds). Heads are read off the training timeline's labels at the last record: layer 0's
previous-token head and layer 1's induction heads.

Measured with the induction task at length 16 (the longest this 64-token vocabulary allows), n=16:
the strongest edge into the induction heads' keys comes from the previous-token head (seeds 0 and
1), but those edges rank 43rd and below of 110 (seed 0: 43, 50, 77), never in the top 5. The task
corrupts the second copy only, so the keys an induction head looks up (in the first copy) are the
same in both runs and the previous-token -> key edges carry little of the difference; EAP-IG's top
edges are the queries' embeddings, the induction heads' outputs to the logits and a0.h1 -> m0.

The `induction-keys` task corrupts what K-composition carries instead (the first copy's token
before the answer): there the previous-token -> induction-key edges rank 3, 7, 10 (seed 0) and
3, 5, 9 (seed 1) at length 16; over lengths 16, 14, 10 and seeds 0, 1 the best of them ranks 2nd
to 4th and is the strongest edge into the keys every time (benchmarks/results-circuit-phase-change.json).
"""
import pytest

import headscope
from headscope.circuits.edge_circuit import circuit
from headscope.training.toy import toy_tokenizer
from tests.support.phase_change import labelled_heads

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def found(phase_change):
    task = headscope.task("induction", toy_tokenizer(), n=16, seed=0, length=16)
    return circuit(phase_change.model, task, method="eap-ig", steps=5)


@pytest.fixture(scope="module")
def keyed(phase_change):
    task = headscope.task("induction-keys", toy_tokenizer(), n=16, seed=0, length=16)
    return circuit(phase_change.model, task, method="eap-ig", steps=5)


def _strongest_into_keys(found, induction):
    keys = found.edges[found.edges.dst.isin({f"{head}.k" for head in induction})]
    return keys.loc[keys.score.abs().idxmax()]


def _previous_to_induction_keys_in_top(found, previous, induction, n):
    top = found.top(n)
    return any(src in previous and dst.endswith(".k") and dst[:-2] in induction for src, dst in zip(top.src, top.dst))


def test_the_strongest_edge_into_the_induction_heads_keys_is_the_previous_token_heads(phase_change, found, keyed):
    previous, induction = labelled_heads(phase_change.timeline)
    assert len(previous) == 1 and induction  # the phase change happened: a1.h0, a1.h1, a1.h3 at step 340
    assert _strongest_into_keys(found, induction).src in previous
    assert _strongest_into_keys(keyed, induction).src in previous


def test_with_the_keys_corrupted_a_previous_token_to_induction_key_edge_is_among_the_top_5(phase_change, keyed):
    previous, induction = labelled_heads(phase_change.timeline)
    assert _previous_to_induction_keys_in_top(keyed, previous, induction, 5)


@pytest.mark.xfail(strict=True, reason="measured with the induction task: the previous-token -> induction-key edges rank 43rd and below of 110 "
                                       "(module docstring): the task corrupts the second copy, not the keys' first copy")
def test_a_previous_token_to_induction_key_edge_is_among_the_top_5(phase_change, found):
    previous, induction = labelled_heads(phase_change.timeline)
    assert _previous_to_induction_keys_in_top(found, previous, induction, 5)
