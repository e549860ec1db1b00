"""Per-head attention maps and head ablation inside Hugging Face models.

- `capture(model, layers=None, heads=None, to="cpu", dtype=None, reduce=None, sites=None)`: a context
  manager; inside it every forward pass stores `cap.patterns[layer]` `[batch, head, query, key]`
  or, with `reduce=fn`, stores only `fn(layer, pattern, attention_mask)` in `cap.results[layer]`
  so full maps never accumulate; with `lazy=True` the reducer gets a `LazyPattern` and no map
  is computed at all.
- `ablate(model, heads=[(layer, head), ...], mode="zero"|"mean", means=None)`: a context manager
  that replaces those heads' outputs z (the output projection's input, after any norm that
  mixes heads, as bitnet's `attn_sub_norm`, or gates them, as qwen3_next's output gate).
Both route attention through headscope's kernel (`headscope.hf.route`) and restore the model's
own attention implementation on exit, also on exceptions. Both address one group of attention
sites (`headscope.hf.sites`): by default the analysed stack (the text decoder, an
encoder-decoder's encoder); `sites="decoder.self"` or `"decoder.cross"` another, whose layers
the ints then number. At a packed vision tower (qwen2_5_vl's, `headscope.hf.sites`) a layer's
map is `[1, head, patch, patch]`, block-diagonal over its images or windows, in its patch order.
"""
from __future__ import annotations

import operator
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from ..errors import HeadscopeError
from ..attention.lazy import LazyPattern
from .route import Session, routed, selection
from .sites import Selection

__all__ = ["capture", "ablate", "Capture", "check_ran", "check_device", "head_pairs", "stack_layers"]

# (layer, pattern, attention_mask) -> stat; the pattern is the map `[batch, head, query, key]`,
# or with lazy=True a LazyPattern (`headscope.attention.pattern.as_pattern` gives both one interface).
Reducer = Callable[[int, Union[torch.Tensor, LazyPattern], Optional[torch.Tensor]], Any]


def _indices(values, what: str) -> list[int]:
    """`values` as a list of ints; HeadscopeError naming `what` for a lone value or a non-integer."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise HeadscopeError(f"{what} must be a list of integers such as [0, 2], got {values!r}")
    chosen = []
    for value in values:
        if isinstance(value, bool):
            raise HeadscopeError(f"{what} must hold integers, got {value!r}")
        try:
            chosen.append(operator.index(value))
        except TypeError:
            raise HeadscopeError(f"{what} must hold integers, got {value!r} in {values!r}") from None
    return chosen


def _check_layers(layers: Optional[Iterable[int]], chosen_sites: Selection) -> list[int]:
    """The chosen layers (default: every layer of the sites), each one the sites have attention in."""
    attention_layers = chosen_sites.layers
    if layers is None:
        return list(attention_layers)
    chosen = _indices(layers, "layers")
    whose = "the model's" if chosen_sites.default else f"the {chosen_sites.group} sites'"
    for layer in chosen:
        if layer not in attention_layers:
            why = "has no attention" if 0 <= layer < max(attention_layers) else "is out of range"
            raise HeadscopeError(f"{chosen_sites.noun} {layer} {why}: {whose} attention layers are "
                                 f"{_spans(attention_layers)}")
    return chosen


def _spans(layers: Sequence[int]) -> str:
    """"0-29" for consecutive layers, else the list ("3, 7, 11")."""
    layers = sorted(layers)
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ", ".join(map(str, layers))


def _check_heads(heads: Optional[Sequence[int]], n_heads: int) -> Optional[list[int]]:
    if heads is None:
        return None
    chosen = _indices(heads, "heads")
    for head in chosen:
        if not 0 <= head < n_heads:
            raise HeadscopeError(f"head {head} is out of range: each layer has {n_heads} heads (0-{n_heads - 1})")
    return chosen


def head_pairs(heads, what: str = "ablate") -> list[tuple[int, int]]:
    """`heads` as `[(layer, head), ...]`; HeadscopeError naming `what` for anything else ("0,1", [0, 1])."""
    example = "heads=[(0, 1), (2, 0)] (layer, head pairs)"
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise HeadscopeError(f"{what} needs {example}, got {heads!r}")
    pairs = []
    for pair in heads:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable) or len(tuple(pair)) != 2:
            raise HeadscopeError(f"{what} needs {example}, got {pair!r} in {heads!r}")
        layer, head = _indices(tuple(pair), "each (layer, head) pair")
        pairs.append((layer, head))
    return pairs


def check_device(to, what: str = "to") -> None:
    """A device torch accepts (None allowed); HeadscopeError naming the value otherwise."""
    if to is None or isinstance(to, torch.device):
        return
    try:
        torch.device(to)
    except (RuntimeError, TypeError, ValueError):
        raise HeadscopeError(f"{what}={to!r} is not a device; use 'cpu', 'cuda', 'cuda:0' or a torch.device") from None


class Capture(Session):
    """What `capture` yields: `patterns` (stored maps) or `results` (reducer outputs)."""

    def __init__(self, chosen_sites: Selection, layers, heads, to, dtype, reduce: Optional[Reducer],
                 chunk_heads: Optional[int] = None, lazy: bool = False, entropy: bool = False):
        self.layer_of = {id(core): l for l, core in chosen_sites.cores.items() if l in set(layers)}
        self.layers = layers
        self.sites = {l: chosen_sites.sites[l] for l in layers}  # layer -> Site (module path, kind, stack)
        self.heads = heads
        self.to = to
        self.dtype = dtype
        self.reduce = reduce
        self.chunk_heads = chunk_heads
        self.lazy = lazy
        self.entropy = entropy
        self._maps: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._pieces: dict[int, list[Any]] = defaultdict(list)
        self.results: dict[int, list[Any]] = defaultdict(list)
        self.extras: dict[int, set[str]] = defaultdict(set)  # layer -> {"sinks", "lse:flex", ...}: see Session.note
        self.ran: set[int] = set()  # layers whose attention ran at least once

    def wants_pattern(self, layer: int) -> bool:
        return True

    def takes_lazy(self, layer: int) -> bool:
        return self.lazy

    def wants_entropy(self, layer: int) -> bool:
        return self.entropy

    def pattern_chunk(self, layer: int) -> Optional[int]:
        return self.chunk_heads

    def on_pattern(self, layer, pattern, attention_mask, heads=None):
        self.ran.add(layer)
        if heads is not None:  # one head group of a layer: reduce it now, join at end_pattern
            self._pieces[layer].append(self.reduce(layer, pattern, attention_mask))
            return
        if self.heads is not None:
            pattern = pattern[:, self.heads]
        if self.reduce is not None:
            self.results[layer].append(self.reduce(layer, pattern, attention_mask))
            return
        self._maps[layer].append(pattern.detach().to(device=self.to, dtype=self.dtype or pattern.dtype))

    def note(self, layer, what):
        self.extras[layer].add(what)

    def end_pattern(self, layer):
        self.results[layer].append(_join_heads(self._pieces.pop(layer)))

    @property
    def not_run(self) -> list[int]:
        """The chosen layers whose attention never ran (mllama's cross-attention without an
        image): they are absent from `patterns` and `results`."""
        return [layer for layer in self.layers if layer not in self.ran]

    @property
    def patterns(self) -> dict[int, torch.Tensor]:
        """`{layer: [batch, head, query, key]}`; several forward passes concatenate on batch."""
        out = {}
        for layer, maps in self._maps.items():
            if len({m.shape[1:] for m in maps}) > 1:
                raise HeadscopeError(
                    f"layer {layer} saw forward passes of different lengths; use capture(reduce=...) or one pass per capture"
                )
            out[layer] = maps[0] if len(maps) == 1 else torch.cat(maps, dim=0)
        return out


def stack_layers(maps: dict, n_layers: int) -> torch.Tensor:
    """`[example, layer, ...]`: `maps` `{layer: [example, ...]}` stacked over layers 0..n_layers - 1,
    a layer without a map (a hybrid's layer without attention) as zeros."""
    empty = torch.zeros_like(next(iter(maps.values())))
    return torch.stack([maps.get(layer, empty) for layer in range(n_layers)], dim=1)


def _join_heads(pieces: list):
    """Join reducer outputs of head groups along dim 1 (tensors, or dicts of tensors)."""
    if isinstance(pieces[0], dict):
        return {key: torch.cat([p[key] for p in pieces], dim=1) for key in pieces[0]}
    return torch.cat(pieces, dim=1)


@contextmanager
def capture(
    model: nn.Module,
    layers: Optional[Iterable[int]] = None,
    heads: Optional[Sequence[int]] = None,
    to: Any = "cpu",
    dtype: Optional[torch.dtype] = None,
    reduce: Optional[Reducer] = None,
    chunk_heads: Optional[int] = None,
    lazy: bool = False,
    sites: Optional[str] = None,
    entropy: bool = False,
) -> Iterator[Capture]:
    """Capture per-head attention patterns inside a Hugging Face model.

    Args:
        model: a transformers model of a supported family.
        layers: layer indices to capture (default all).
        heads: query-head indices to keep (default all).
        to: device for stored maps (ignored by reducers, which run on the model's device).
        dtype: dtype for stored maps (default fp32).
        reduce: `fn(layer, pattern, attention_mask) -> stat` called on each layer's pattern
            `[batch, head, query, key]` as soon as it is computed; only the stats are kept,
            in `cap.results[layer]` (one entry per forward pass).
        chunk_heads: with `reduce`, compute each layer's attention this many heads at a time and
            call the reducer on each group (`[batch, chunk, query, key]`), so a layer's full
            map never exists; the group results, tensors or dicts of tensors with heads on dim
            1, are joined along dim 1. Needs a reducer that treats heads independently.
        lazy: with `reduce`, hand the reducer a `headscope.attention.lazy.LazyPattern` instead of the
            pattern: the layer runs the fused kernel, and the reducer computes only the entries
            and row statistics it reads (`diagonal`, `column`, `mass`, `entropy`).
        entropy: with `lazy`, the reducer reads `entropy()`: on the CPU's fused kernel the
            layer's one kernel call computes it beside z (`headscope.attention.lazy.lazy_attention`).
        sites: the group of attention sites to capture ("encoder", "decoder.self",
            "decoder.cross"; `headscope.hf.sites`); `layers` are then its layers. Default: the
            analysed stack (the text decoder; an encoder-decoder's encoder).
    Yields:
        A `Capture` with `.patterns` or `.results`, `.sites` `{layer: Site}` (the module path
        of each captured layer), `.not_run` (chosen layers whose attention
        never ran, such as cross-attention without its image), and `.extras` `{layer: {"sinks", ...}}`:
        "sinks" for layers whose heads have a learned sink logit (their pattern rows sum to less
        than 1), "lse:KERNEL" for what computed a lazy layer's row log-sum-exp.
    """
    chosen_sites = selection(model, sites)
    chosen = _check_layers(layers, chosen_sites)
    check_device(to)
    if reduce is not None and not callable(reduce):
        raise HeadscopeError(f"reduce must be a function fn(layer, pattern, attention_mask), got {reduce!r}")
    if chunk_heads is not None and (reduce is None or heads is not None or chunk_heads < 1):
        raise HeadscopeError("chunk_heads needs a reducer, no heads= selection, and a size of at least 1")
    if lazy and (reduce is None or heads is not None):
        raise HeadscopeError("lazy=True needs a reducer and no heads= selection")
    if entropy and not lazy:
        raise HeadscopeError("entropy=True reads the lazy pattern's row entropy: it needs lazy=True")
    if (lazy or chunk_heads is not None) and chosen_sites.packed & set(chosen):
        raise HeadscopeError(f"the {chosen_sites.group} sites run attention once per image or window, and their "
                             f"pattern is joined from the pieces: capture them without lazy= or chunk_heads=")
    session = Capture(chosen_sites, chosen, _check_heads(heads, chosen_sites.n_heads), to, dtype, reduce, chunk_heads,
                      lazy, entropy)
    with routed(model, session):
        yield session


def check_ran(session: Session, layers: Iterable[int], what: str, chosen_sites: Selection) -> None:
    """HeadscopeError when some attention ran inside a block but one of `layers` (of `chosen_sites`)
    never did (mllama's cross-attention without an image; a decoder's sites while only the
    encoder ran; a vision tower's on text alone): editing it changed nothing. `session.ran` holds the layers that ran."""
    missing = sorted(set(layers) - session.ran)
    if session.attention_ran and missing:
        raise HeadscopeError(f"{what} {chosen_sites.noun} {', '.join(map(str, missing))} did nothing: its attention "
                             f"never ran in the block (cross-attention runs only with its other input, such as an "
                             f"image or the encoder's output; a vision tower only with pixel_values)")


class _Ablation(Session):
    def __init__(self, layer_of, by_layer, mode, means):
        self.layer_of = layer_of  # every layer of the sites, to tell a layer that never ran (check_ran)
        self.by_layer = by_layer
        self.mode = mode
        self.means = means or {}
        self.ran: set[int] = set()

    def edit_z(self, layer, z):
        self.ran.add(layer)
        heads = self.by_layer.get(layer)
        if heads is None:
            return z
        z = z.clone()
        if self.mode == "zero":
            z[:, :, heads] = 0
        elif layer in self.means:  # (H, D) reference means for this layer
            z[:, :, heads] = self.means[layer][heads].to(z)
        else:
            z[:, :, heads] = z[:, :, heads].mean(dim=(0, 1), keepdim=True)
        return z


@contextmanager
def ablate(
    model: nn.Module,
    heads: Sequence[tuple[int, int]],
    mode: str = "zero",
    means: Optional[dict[int, torch.Tensor]] = None,
    sites: Optional[str] = None,
) -> Iterator[None]:
    """Remove heads' contributions inside a Hugging Face model for the `with` block.

    Args:
        model: a transformers model of a supported family.
        heads: `[(layer, head), ...]` query heads to ablate.
        mode: "zero" sets the head's z to 0; "mean" sets it to its mean, taken from
            `means[layer][head]` (`[head, d_head]` tensors) when given, else over the batch
            and positions of the current forward pass.
        means: optional reference means for "mean" mode.
        sites: the group of attention sites the layers number ("decoder.cross";
            `headscope.hf.sites`); default: the analysed stack. Ablating a layer whose
            attention never ran in the block, while other attention did, is a HeadscopeError.
    Yields:
        None: the model runs with the heads removed inside the block and as loaded after it (also
        after an exception).
    """
    if mode not in ("zero", "mean"):
        raise HeadscopeError(f"unknown ablation mode {mode!r}; use 'zero' or 'mean'")
    chosen_sites = selection(model, sites)
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, head in head_pairs(heads):
        _check_layers([layer], chosen_sites)
        _check_heads([head], chosen_sites.n_heads)
        by_layer[int(layer)].append(int(head))
    layer_of = {id(core): layer for layer, core in chosen_sites.cores.items()}
    session = _Ablation(layer_of, dict(by_layer), mode, means)
    with routed(model, session):
        yield
    check_ran(session, by_layer, "ablating", chosen_sites)
