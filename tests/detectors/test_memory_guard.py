"""No default pattern detector's reducer makes a `[query, key]`-sized tensor on the lazy path.

Every op run inside a detector's `reduce` is watched (a torch dispatch mode sees each op's
outputs; a fused kernel's internal buffers are not tensors and stay out of it) on a tiny model
with a long input, where one example's map of one head, T x T entries, is far larger than
anything else the analysis needs (T x d_model activations, the model's weights). The guard
trips on any tensor of T x T entries or more, bool masks included, so a reducer that built the
map, a target mask or a key mask for its formula fails. Masks built a block of queries at a
time (`headscope.attention.targets.pairs_in_blocks`) get blocks of 16 query rows here, as they
would be a small part of a long input's map. A reducer that asks for the batch's key mask shows
the guard does trip.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from headscope.attention import targets
from headscope.detectors import get
from headscope.detectors.protocol import Detector
from headscope.detectors.registry import defaults
from headscope.detectors.runner import collect
from headscope.loading.loader import Loaded
from headscope.probes.base import ProbeSet
from tests.support.tiny import tiny_model

T = 384  # one head's map: 147,456 entries; the tiny models' largest activation is T x 4 d_model


class _Largest(TorchDispatchMode):
    """Remembers the largest tensor any op returns while active, and the op."""

    def __init__(self):
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.numel() > self.largest:
                self.largest, self.op = leaf.numel(), str(func)
        return out


def _probes(vocab: int) -> dict:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(4, vocab, (2, T), generator=g)
    text[:, 0] = 2  # a start token, as the probes put one
    unit = torch.randint(4, vocab, (2, (T - 1) // 2), generator=g)
    repeated = torch.cat([torch.full((2, 1), 2), unit, unit], dim=1)
    return {"text": ProbeSet("text", text, 1, "random tokens"), "repeated": ProbeSet("repeated", repeated, 1, "repeats")}


def _largest_per_reducer(loaded, monkeypatch, extra=None) -> dict:
    """{detector: (largest tensor made in its reduce, the op)} over both probes' passes."""
    seen = {}
    original = Detector.reduce

    def watched(self, layer, pattern, batch):
        with _Largest() as mode:
            out = original(self, layer, pattern, batch)
            if extra is not None:
                extra(batch)
        if mode.largest > seen.get(self.name, (0, None))[0]:
            seen[self.name] = (mode.largest, mode.op)
        return out

    monkeypatch.setattr(Detector, "reduce", watched)
    monkeypatch.setattr(targets, "BLOCK_ENTRIES", 2 * 16 * T)  # 16 query rows of a batch of 2
    for name, probe in _probes(loaded.model.config.vocab_size).items():
        chosen = [get(d) for d in defaults(loaded.causal) if get(d).probe == name]
        passes = collect(loaded, probe, chosen, batch_size=2)
        assert passes.how == "lazy" and chosen
    return seen


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_no_default_detector_materialises_a_query_key_map(family, monkeypatch):
    loaded = Loaded.from_model(tiny_model(family, positions=T + 8), tokenizer=None)
    seen = _largest_per_reducer(loaded, monkeypatch)
    expected = {d for d in defaults(loaded.causal) if get(d).probe in ("text", "repeated")}
    assert set(seen) == expected  # every default pattern detector was watched
    for name, (largest, op) in seen.items():
        assert largest < T * T, f"{name}'s reducer made a tensor of {largest} entries ({op}); a map is {T * T}"


def test_the_guard_trips_on_a_key_mask(monkeypatch):
    loaded = Loaded.from_model(tiny_model("llama", positions=T + 8), tokenizer=None)
    seen = _largest_per_reducer(loaded, monkeypatch, extra=lambda batch: batch.key_allowed())
    assert max(largest for largest, _ in seen.values()) >= T * T
