"""A probe's pass runs the model without a key/value cache: nothing is generated after it, so a
cache would only copy and hold every layer's keys and values until the pass ends."""
import torch
from transformers.cache_utils import DynamicLayer

from headscope.detectors import get, runner
from headscope.detectors.registry import defaults
from headscope.loading.loader import Loaded
from headscope.probes.base import ProbeSet
from tests.support.tiny import tiny_model


def _probe(loaded):
    ids = torch.randint(4, loaded.model.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    return ProbeSet("text", ids, 1, "random tokens")


def test_a_pass_builds_no_cache_and_scores_as_a_cached_forward_would(monkeypatch):
    loaded = Loaded.from_model(tiny_model("llama"), tokenizer=None)
    chosen = [get(name) for name in defaults(loaded.causal) if get(name).probe == "text"]
    probe = _probe(loaded)
    updates = []
    original = DynamicLayer.update
    monkeypatch.setattr(DynamicLayer, "update", lambda self, *a, **k: updates.append(1) or original(self, *a, **k))
    without = runner.collect(loaded, probe, chosen, batch_size=2)
    assert updates == []
    monkeypatch.setattr(runner, "_no_cache", lambda body_class: {})  # the model's default: a cache
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

    assert runner._no_cache(type(tiny_model("llama").model)) == {"use_cache": False}
    assert runner._no_cache(Plain) == {}
