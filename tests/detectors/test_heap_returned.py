"""An analysis's passes give freed heap back: where the heap is held, once its free bytes pass the
pass's limit; elsewhere every `TRIM_EVERY` layers once they have run `TRIM_TOKENS` tokens, counted
across batches (what keeps the process's resident set near a plain forward's with glibc's default
allocator; `headscope.loading.heap`)."""
import pytest
import torch

from headscope.detectors import get, runner
from headscope.detectors.registry import defaults
from headscope.loading import heap
from headscope.loading.loader import Loaded
from headscope.probes.base import ProbeSet
from tests.support.tiny import tiny_model


@pytest.mark.parametrize("tokens,every", [(1, runner.TRIM_EVERY), (17 * 10, 10), (10 ** 9, None)])
def test_freed_heap_is_returned_every_few_layers_across_batches(monkeypatch, tokens, every):
    """Six batches of one example of 17 tokens: with a token budget that six layers meet, a return
    every TRIM_EVERY layers; with one of ten layers' tokens, every ten; with one never met, none."""
    monkeypatch.setattr(heap, "_tuning", lambda: None)  # glibc before 2.33, or MALLOC_* settings of the process
    calls = []
    monkeypatch.setattr(runner, "return_freed_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(runner, "TRIM_TOKENS", tokens)
    reductions = _six_batches()
    assert runner.TRIM_EVERY > 1 and reductions >= 10
    assert len(calls) == (reductions // every if every else 0)


def _six_batches() -> int:
    """Six batches of one example of 17 tokens through a tiny Llama's text detectors; the
    number of layer reductions."""
    loaded = Loaded.from_model(tiny_model("llama"), tokenizer=None)
    ids = torch.randint(4, loaded.model.config.vocab_size, (6, 17), generator=torch.Generator().manual_seed(0))
    probe = ProbeSet("text", ids, 1, "random tokens")
    chosen = [get(name) for name in defaults(loaded.causal) if get(name).probe == "text"]
    runner.collect(loaded, probe, chosen, batch_size=1)
    return 6 * len(loaded.attention_layers)


class _Glibc:
    """`heap._tuning()`'s (mallopt, mallinfo2), recording the settings and giving the free bytes
    of `free` in turn."""

    def __init__(self, free):
        self.free, self.settings = list(free), []

    def mallopt(self, parameter, value):
        self.settings.append((parameter, value))
        return 1

    def mallinfo2(self):
        return heap._MallInfo2(fordblks=self.free.pop(0))


@pytest.mark.parametrize("every", [1, 3])
def test_a_held_heap_goes_back_only_past_the_pass_limit(monkeypatch, every):
    """Held: the heap's free bytes are read once every `every` reductions' tokens have passed
    HELD_CHECK_TOKENS; the first reading sets the pass's limit (four times it, at least 256 MiB);
    after that the heap goes back at every reading that passes it, and once more when the pass
    ends."""
    mib = 2**20
    first = 100 * mib  # limit: 400 MiB
    free = [first] + [300 * mib, 401 * mib, 350 * mib, 500 * mib] * 40
    glibc = _Glibc(free)
    monkeypatch.setattr(heap, "_tuning", lambda: (glibc.mallopt, glibc.mallinfo2))
    monkeypatch.setattr(runner, "HELD_CHECK_TOKENS", 17 * every)  # batches of one example of 17 tokens
    inner, at_end = [], []
    monkeypatch.setattr(runner, "return_freed_heap", lambda: inner.append(1) or True)
    monkeypatch.setattr(heap, "return_freed_heap", lambda: at_end.append(1) or True)
    reductions = _six_batches()
    readings = reductions // every
    assert len(glibc.free) == len(free) - readings  # (a batch's tokens are counted across batches)
    read = free[:readings]
    assert len(inner) == sum(value > 4 * first for value in read[1:]) > 0
    assert at_end == [1]
    assert glibc.settings == [(heap.M_MMAP_THRESHOLD, 32 * mib), (heap.M_TRIM_THRESHOLD, 2**31 - 1),
                              (heap.M_TRIM_THRESHOLD, 64 * mib), (heap.M_MMAP_THRESHOLD, 32 * mib)]
    assert heap.held_free_limit(mib) == 256 * mib  # the floor
