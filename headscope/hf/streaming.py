"""Streaming key/value heads inside a Hugging Face model.

- `stream_heads(model, heads, sink, recent)`: a context manager; inside it each listed
  `(layer, kv_head)` sees only its first `sink` and last `recent` keys (the query's own
  included), through headscope's kernel (`headscope.attention.streaming`); every other head is
  unchanged. The model's own attention implementation returns on exit, also on exceptions.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator, Sequence

from torch import nn

from ..attention.streaming import KeyWindow
from ..checks import check_count
from ..errors import HeadscopeError
from .adapters import head_sizes
from .route import Session, layer_map, routed

__all__ = ["stream_heads"]


class _Streaming(Session):
    def __init__(self, layer_of, windows: dict[int, KeyWindow]):
        self.layer_of = {k: l for k, l in layer_of.items() if l in windows}
        self.windows = windows

    def key_window(self, layer):
        return self.windows.get(layer)


@contextmanager
def stream_heads(model: nn.Module, heads: Sequence[tuple[int, int]], sink: int, recent: int) -> Iterator[None]:
    """Restrict key/value heads to a sink and a recent window of keys for the `with` block.

    Args:
        model: a transformers model of a supported family.
        heads: `[(layer, kv_head), ...]` key/value heads to restrict (under GQA every query head
            sharing a key/value head is restricted with it).
        sink: first keys kept (>= 0); recent: last keys kept, the query's own included (>= 1).
    """
    check_count("sink", sink, least=0)
    check_count("recent", recent)
    layer_of = layer_map(model)
    n_kv = head_sizes(model.config)[2]
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, head in heads:
        if int(layer) not in layer_of.values():
            raise HeadscopeError(f"layer {layer} has no attention: the model's attention layers are "
                                 f"{sorted(layer_of.values())}")
        if not 0 <= int(head) < n_kv:
            raise HeadscopeError(f"key/value head {head} is out of range: each layer has {n_kv} (0-{n_kv - 1})")
        by_layer[int(layer)].append(int(head))
    windows = {layer: KeyWindow(tuple(kv), sink, recent) for layer, kv in by_layer.items()}
    with routed(model, _Streaming(layer_of, windows)):
        yield
