"""Hook points inside Hugging Face models, with the names and shapes of `MultiHeadAttention`'s.

- `model_hooks(model, {name: fn, ...})`: a context manager; inside it, `fn(value, hook)` is
  called on the named value of every forward pass and may return a replacement, exactly as on
  `MultiHeadAttention` (`hook` is a `HookPoint` whose `.name` is the full name). Always removed
  on exit, exceptions included, and the model's attention implementation restored.
- `hook_names(model)`: every name `model_hooks` accepts.

Names are `layers.{layer}.attn.{point}`; a key may hold `*` wildcards (`layers.*.attn.hook_z`)
or be a filter function `name -> bool`. The layers are those of one group of attention sites
(`headscope.hf.sites`): by default the analysed stack, or the group `sites=` names
(`model_hooks(model, hooks, sites="decoder.cross")`: `layers.0` is the decoder's first
cross-attention, whose key axis is the encoder's positions). The points and shapes:
    hook_q       [batch, head, pos, d_head]      queries as the model hands them to attention
                                                 (after its q/k norms and rotary)
    hook_k       [batch, kv_head, pos, d_head]   keys (key/value heads NOT expanded)
    hook_v       [batch, kv_head, pos, d_head]   values (not expanded)
    hook_scores  [batch, head, query, key]       pre-softmax scores, fp32, masked entries at min
    hook_pattern [batch, head, query, key]       attention probabilities, fp32
    hook_z       [batch, pos, head, d_head]      per-head weighted values, before W_O (its input
                                                 where a norm mixes heads first, bitnet, or an
                                                 output gate scales z, qwen3_next: after the gate)
    hook_result  [batch, pos, head, d_model]     per-head output after W_O (no bias); the layer's
                                                 output projection then returns its sum plus bias
A hook on scores or pattern switches that layer to the explicit path; other layers stay fused.
At a packed vision tower (qwen2_5_vl's, `headscope.hf.sites`) only hook_z exists whole per layer
(`[1, patch, head, d_head]`, the output projection's input): the others are refused in one line,
since each call of the attention function sees one image or window; `capture` reads the pattern.
`hook_result` needs the family's adapter (it reads W_O through it; at the vision sites the tower's,
`headscope.hf.adapters.VISION_ADAPTERS`, and not at a packed tower); the others work on any model
headscope runs inside.
"""
from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ..errors import HeadscopeError
from ..attention.hook_points import HookFn, HookPoint
from .adapters import _needs_adapter, block_adapter, out_projection
from .layouts import conv1d, linear
from .capture import check_ran
from .route import Session, routed, selection

__all__ = ["POINTS", "model_hooks", "hook_names", "point_name"]

POINTS = ("hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z", "hook_result")
Selector = Union[str, Callable[[str], bool]]
# Points a packed module (headscope.hf.sites) passes once per image or window, never whole.
_PIECEWISE = ("hook_q", "hook_k", "hook_v", "hook_scores", "hook_pattern")


def point_name(layer: int, point: str) -> str:
    """The full name of a hook point: `layers.{layer}.attn.{point}`."""
    return f"layers.{layer}.attn.{point}"


def hook_names(model: nn.Module, sites: Optional[str] = None) -> list[str]:
    """Every hook point name inside `model`, attention layer by attention layer (the model's
    numbers), of the analysed stack or of the group `sites` names ("decoder.cross")."""
    return [point_name(layer, p) for layer in selection(model, sites).layers for p in POINTS]


def _select(selector: Selector, names: list[str]) -> list[str]:
    if callable(selector):
        chosen = [n for n in names if selector(n)]
    else:
        chosen = fnmatch.filter(names, selector)
    if not chosen:
        shown = selector if isinstance(selector, str) else getattr(selector, "__name__", "filter")
        raise HeadscopeError(f"no hook point matches {shown!r}; names look like {point_name(0, 'hook_z')} "
                             f"(points: {', '.join(POINTS)})")
    return chosen


class _Points(Session):
    """Runs the hooked points of each layer inside headscope's kernel."""

    def __init__(self, layer_of: dict[int, int], points: dict[tuple[int, str], HookPoint]):
        self.points = points
        self.layers = {layer for layer, point in points if point != "hook_result"}
        self.layer_of = layer_of  # every layer, to tell a hooked layer that never ran (check_ran)
        self.ran: set[int] = set()

    def _run(self, layer: int, point: str, x: torch.Tensor) -> torch.Tensor:
        hook = self.points.get((layer, point))
        return x if hook is None else hook(x)

    def edit_qkv(self, layer, q, k, v):
        self.ran.add(layer)
        if layer not in self.layers:
            return q, k, v
        return self._run(layer, "hook_q", q), self._run(layer, "hook_k", k), self._run(layer, "hook_v", v)

    def edits_attention(self, layer):
        return (layer, "hook_scores") in self.points or (layer, "hook_pattern") in self.points

    def edit_scores(self, layer, scores):
        return self._run(layer, "hook_scores", scores)

    def edit_pattern(self, layer, pattern):
        return self._run(layer, "hook_pattern", pattern)

    def edit_z(self, layer, z):
        return self._run(layer, "hook_z", z)


def _result_hook(point: HookPoint, out: nn.Module, conv: bool, n_heads: int):
    """A forward hook on an output projection: per-head results through `point`, then their sum."""
    def hook(module, args, output):
        weight, bias = conv1d(out) if conv else linear(out)  # (d_model, H * D)
        z = args[0]  # (B, T, H * D); D read here: v's head size may differ from q's (MLA)
        d_head = z.shape[-1] // n_heads
        z = z.view(*z.shape[:-1], n_heads, d_head)  # (B, T, H, D)
        w_o = weight.view(weight.shape[0], n_heads, d_head)  # (d_model, H, D)
        result = point(torch.einsum("bthd,mhd->bthm", z, w_o))  # (B, T, H, d_model)
        summed = result.sum(dim=2)
        return summed + bias if bias is not None else summed
    return hook


@contextmanager
def model_hooks(
    model: nn.Module,
    fwd_hooks: Union[Mapping[Selector, HookFn], Sequence[tuple[Selector, HookFn]]],
    sites: Optional[str] = None,
) -> Iterator[nn.Module]:
    """Attach hooks to hook points inside a Hugging Face model for the `with` block.

    Args:
        model: a transformers model headscope runs inside (`hook_result` needs an adapter).
        fwd_hooks: `{name: fn}` or `[(name, fn), ...]`; a name may hold `*` wildcards or be a
            filter function `name -> bool`. `fn(value, hook)` returns None to only read, or a
            tensor of the same shape to replace the value; several hooks on one point run in
            the order given.
        sites: the group of attention sites whose layers the names number ("encoder",
            "decoder.self", "decoder.cross"; `headscope.hf.sites`); default: the analysed stack.
            Hooking a layer whose attention never ran in the block, while other attention did,
            is a HeadscopeError.
    Yields:
        `model`, for convenience.
    """
    chosen_sites = selection(model, sites)
    layer_of = {id(core): layer for layer, core in chosen_sites.cores.items()}
    names = [point_name(layer, p) for layer in chosen_sites.layers for p in POINTS]
    items = list(fwd_hooks.items()) if isinstance(fwd_hooks, Mapping) else list(fwd_hooks)
    points: dict[tuple[int, str], HookPoint] = {}
    for selector, fn in items:
        for name in _select(selector, names):
            _, layer, _, point = name.split(".")
            key = (int(layer), point)
            if key not in points:
                points[key] = HookPoint(name)
            points[key].add_hook(fn)  # HookPoints live only in this block: nothing to remove
    piecewise = sorted({point for layer, point in points if layer in chosen_sites.packed and point in _PIECEWISE})
    if piecewise:
        raise HeadscopeError(f"{', '.join(piecewise)} at the {chosen_sites.group} sites would see one image or "
                             f"window at a time (their attention runs once per piece); hook_z works there, and "
                             f"capture(sites={chosen_sites.group!r}) reads the whole pattern")
    handles = []
    try:
        result_layers = sorted(layer for layer, point in points if point == "hook_result")
        if result_layers:
            if any(layer not in chosen_sites.blocks for layer in result_layers):
                _needs_adapter(model.config)  # names the family without an adapter, and what works without one
                raise HeadscopeError(f"hook_result needs an adapter for the {chosen_sites.group} sites (it reads W_O "
                                     f"through one); the other points work there")
            if any(layer in chosen_sites.packed for layer in result_layers):
                raise HeadscopeError(f"hook_result is not offered at the packed {chosen_sites.group} sites (their "
                                     f"output projection reads one sequence of all images' patches); hook_z works there")
            for layer in result_layers:
                block = chosen_sites.blocks[layer]
                conv = block_adapter(model.config, block)[0].out_is_conv1d
                out = out_projection(model, block)
                hook = _result_hook(points[(layer, "hook_result")], out, conv, chosen_sites.n_heads)
                handles.append(out.register_forward_hook(hook))
        session = _Points(layer_of, points)
        with routed(model, session):
            yield model
        check_ran(session, session.layers, "hooking", chosen_sites)
    finally:
        for handle in handles:
            handle.remove()
