"""The argmax detectors (positional:<k>, rare_word) on hand-worked patterns and planted heads."""
import math

import pytest
import torch

from headscope import detectors
from headscope.detectors.patterns.positional import argmax_offset_share
from headscope.detectors.patterns.rare_word import rare_targets
from headscope.analysis.analyze import analyze
from headscope.probes.base import ProbeBatch
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from tests.support.planted_positions import PLANTED

SMALL = dict(probes=[TextProbe(n_examples=8, seq_len=40)], explorer_examples=0)


@pytest.fixture(scope="module")
def planted_positions_analysis(planted_positions):
    return analyze(planted_positions, detectors=["positional", "rare_word", "previous_token", "self", "sink"], **SMALL)


def _batch(ids, causal=True, counts=None):
    ids = torch.as_tensor(ids)
    return ProbeBatch(ids, torch.ones_like(ids, dtype=torch.bool), causal, 0, counts)


def _pointing(keys):
    """`[1, 1, t, t]` pattern: query i puts 0.6 on key keys[i] and spreads the rest over what it sees."""
    t = len(keys)
    p = torch.zeros(1, 1, t, t)
    for i, j in enumerate(keys):
        p[0, 0, i, : i + 1] = 0.4 / (i + 1)
        p[0, 0, i, j] += 0.6
    return p


def test_planted_heads_get_their_labels_and_no_other_head_does(planted_positions_analysis):
    labels = planted_positions_analysis.labels.set_index(["layer", "head"])
    for head, label in PLANTED.items():
        assert labels.label[head] == label
        assert [h for h, l in labels.label.items() if l == label and h != head] == []
    assert labels.label[(0, 3)] == "none"
    assert "positional" not in labels.labels[(0, 2)]  # offset -1 is previous_token's alone
    scores = planted_positions_analysis.scores.set_index(["layer", "head", "detector"]).score
    assert scores[(0, 0, "positional")] > 0.99 and scores[(0, 1, "rare_word")] > 0.99
    assert planted_positions_analysis.meta["probes"]["text"]["patterns"].startswith("maps")  # argmax needs whole rows


def test_offset_share_on_hand_worked_patterns():
    t = 9
    two_back = _pointing([max(0, i - 2) for i in range(t)])
    share = argmax_offset_share(two_back, _batch(torch.arange(t)[None]))[0, 0]  # (offsets,) -3, -2, +2, +3
    assert share[1] == 1.0 and share[0] == 0.0
    assert math.isnan(share[2]) and math.isnan(share[3])  # forward offsets: no query in a causal model
    ahead = torch.zeros(1, 1, t, t)
    for i in range(t):
        ahead[0, 0, i, min(t - 1, i + 3)] = 1.0
    share = argmax_offset_share(ahead, _batch(torch.arange(t)[None], causal=False))[0, 0]
    # +3: queries 0..5 have a key at i + 3 and all hit; +2: of queries 0..6 only 6 (clamped to key 8) hits
    assert share.tolist() == pytest.approx([0.0, 0.0, 1 / 7, 1.0])


def test_positional_picks_each_heads_offset_from_captured_patterns():
    t = 12
    pattern = torch.cat([_pointing([max(0, i - 3) for i in range(t)]), _pointing([max(0, i - 2) for i in range(t)])], 1)
    table = detectors.positional(pattern)
    assert table.variant.tolist() == ["-3", "-2"] and table.score.tolist() == [1.0, 1.0]


def test_rare_word_targets_the_least_frequent_token_and_not_position_zero():
    counts = torch.tensor([50, 40, 30, 1, 20])
    batch = _batch([[1, 0, 2, 3, 0, 1]], counts=counts)
    assert rare_targets(batch).tolist() == [[False, False, False, True, False, False]]
    pattern = _pointing([0, 0, 0, 3, 3, 3])  # queries 3..5 see token 3; query 3 is the token itself
    assert detectors.rare_word.score(pattern, batch)[0, 0] == 1.0  # queries 4, 5 hit; 3 does not count
    elsewhere = _pointing([0, 0, 0, 3, 3, 4])
    assert detectors.rare_word.score(elsewhere, batch)[0, 0] == 0.5
    only_first = _batch([[3, 0, 1, 2]], counts=counts)  # rarest token at position 0 only: not scored
    assert math.isnan(detectors.rare_word.score(_pointing([0, 0, 0, 0]), only_first)[0, 0])


def test_rare_word_without_counts_counts_the_batch():
    batch = _batch([[5, 6, 5, 7, 6, 5]])  # 7 occurs once
    assert rare_targets(batch).tolist() == [[False, False, False, True, False, False]]


def test_argmax_detectors_do_not_modify_their_input():
    pattern = _pointing([max(0, i - 2) for i in range(8)])
    before = pattern.clone()
    batch = _batch(torch.arange(8)[None], counts=torch.arange(1, 9))
    for det in (detectors.positional, detectors.rare_word):
        det.score(pattern, batch)
        assert torch.equal(pattern, before)
