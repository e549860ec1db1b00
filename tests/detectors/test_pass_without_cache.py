"""A probe's pass runs the model without a key/value cache (`Loaded.probe_pass`): nothing is
generated after it, so a cache would only copy and hold every layer's keys and values until the
pass ends. The scoring pass, the explorer's own pass and the head-similarity pass all go through it."""
import pytest
import torch
from transformers.cache_utils import DynamicLayer

from headscope.analysis.explorer import explorer_maps
from headscope.detectors import get, runner
from headscope.detectors.registry import defaults
from headscope.head_geometry.similarity import pattern_divergence
from headscope.loading import loader
from headscope.loading.loader import Loaded
from headscope.probes.base import ProbeSet
from tests.support.tiny import tiny_model


def _probe(loaded):
    ids = torch.randint(4, loaded.model.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    return ProbeSet("text", ids, 1, "random tokens")


@pytest.fixture
def updates(monkeypatch):
    """A list that grows by one each time a cache layer takes keys and values."""
    seen = []
    original = DynamicLayer.update
    monkeypatch.setattr(DynamicLayer, "update", lambda self, *a, **k: seen.append(1) or original(self, *a, **k))
    return seen


def test_a_pass_builds_no_cache_and_scores_as_a_cached_forward_would(monkeypatch, updates):
    loaded = Loaded.from_model(tiny_model("llama"), tokenizer=None)
    chosen = [get(name) for name in defaults(loaded.causal) if get(name).probe == "text"]
    probe = _probe(loaded)
    without = runner.collect(loaded, probe, chosen, batch_size=2)
    assert updates == []
    monkeypatch.setattr(loader, "no_cache", lambda body_class: {})  # the model's default: a cache
    with_cache = runner.collect(loaded, probe, chosen, batch_size=2)
    assert len(updates) == len(loaded.attention_layers)  # the cache was there to be skipped
    for name, collected in without.values.items():
        for ours, cached in zip(collected.values, with_cache.values[name].values, strict=True):  # per batch
            assert ours.keys() == cached.keys()
            assert all(torch.equal(ours[layer], cached[layer]) for layer in ours), name


def test_the_flag_is_passed_only_to_a_forward_that_takes_it():
    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, **kwargs):
            return input_ids

    assert loader.no_cache(type(tiny_model("llama").model)) == {"use_cache": False}
    assert loader.no_cache(Plain) == {}


def test_the_explorer_and_similarity_passes_build_no_cache(monkeypatch, updates):
    loaded = Loaded.from_model(tiny_model("llama"), tokenizer=None)
    probe = _probe(loaded)
    inputs = {"input_ids": probe.input_ids, "attention_mask": torch.ones_like(probe.input_ids)}
    maps = explorer_maps(loaded, inputs)
    divergence = pattern_divergence(loaded, probe, batch_size=2)
    assert updates == []
    monkeypatch.setattr(loader, "no_cache", lambda body_class: {})
    assert torch.equal(explorer_maps(loaded, inputs), maps)
    cached = pattern_divergence(loaded, probe, batch_size=2)
    assert len(updates) == 2 * len(loaded.attention_layers)  # one cache per pass, there to be skipped
    assert torch.equal(cached.divergence(), divergence.divergence())
