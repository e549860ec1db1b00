"""An analysis's passes give freed heap back every `TRIM_EVERY` layers once they have run
`TRIM_TOKENS` tokens, counted across batches (what keeps the process's resident set near a plain
forward's with glibc's default allocator; `headscope.loading.heap`)."""
import pytest
import torch

from headscope.detectors import get, runner
from headscope.detectors.registry import defaults
from headscope.loading.loader import Loaded
from headscope.probes.base import ProbeSet
from tests.support.tiny import tiny_model


@pytest.mark.parametrize("tokens,every", [(1, runner.TRIM_EVERY), (17 * 10, 10), (10 ** 9, None)])
def test_freed_heap_is_returned_every_few_layers_across_batches(monkeypatch, tokens, every):
    """Six batches of one example of 17 tokens: with a token budget that six layers meet, a return
    every TRIM_EVERY layers; with one of ten layers' tokens, every ten; with one never met, none."""
    loaded = Loaded.from_model(tiny_model("llama"), tokenizer=None)
    calls = []
    monkeypatch.setattr(runner, "return_freed_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(runner, "TRIM_TOKENS", tokens)
    ids = torch.randint(4, loaded.model.config.vocab_size, (6, 17), generator=torch.Generator().manual_seed(0))
    probe = ProbeSet("text", ids, 1, "random tokens")
    chosen = [get(name) for name in defaults(loaded.causal) if get(name).probe == "text"]
    runner.collect(loaded, probe, chosen, batch_size=1)  # six batches of one example
    reductions = 6 * len(loaded.attention_layers)
    assert runner.TRIM_EVERY > 1 and reductions >= 10
    assert len(calls) == (reductions // every if every else 0)

