"""`Example`: the explorer's stored maps, and the key axis's own tokens at cross-attention."""
import json

import numpy as np
import pytest

from headscope.analysis import Analysis, Example
from headscope.errors import HeadscopeError
from tests.support.fake_analysis import fake_analysis


def _cross_example() -> Example:
    maps = np.random.default_rng(0).dirichlet(np.ones(5), size=(2, 3, 4))  # [layer, head, 4 queries, 5 keys]
    return Example.from_float("copy", 0, ["<s>", "a", "b", "c"], maps, key_tokens=["a", "b", "c", "d", "</s>"])


def test_an_example_without_key_tokens_saves_as_before():
    example = fake_analysis(n_examples=1).examples[0]
    assert example.key_tokens is None and example.keys == example.tokens
    data = example.to_json()
    assert list(data) == ["probe", "index", "tokens", "shape", "patterns_uint8_base64"]  # no new field
    again = Example.from_json(json.loads(json.dumps(data)))
    assert again.to_json() == data and again.key_tokens is None


def test_key_tokens_survive_save_and_load(tmp_path):
    analysis = fake_analysis(n_layers=2, n_heads=3, n_examples=1)  # the grid of _cross_example's maps
    analysis.examples = [_cross_example()]
    analysis.save(tmp_path / "a")
    again = Analysis.load(tmp_path / "a").examples[0]
    assert again.tokens == ["<s>", "a", "b", "c"] and again.key_tokens == ["a", "b", "c", "d", "</s>"]
    assert again.patterns.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(again.patterns, analysis.examples[0].patterns)


def test_maps_that_do_not_fit_the_tokens_are_refused_in_one_line():
    with pytest.raises(HeadscopeError, match="maps of 4 x 5 do not fit 4 query and 4 key tokens") as err:
        Example.from_float("copy", 0, ["<s>", "a", "b", "c"], np.zeros((1, 1, 4, 5)))
    assert "\n" not in str(err.value)
