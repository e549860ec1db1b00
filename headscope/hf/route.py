"""Routing a Hugging Face model's attention through headscope's kernel.

transformers (v5) looks up each layer's attention function by `config._attn_implementation`.
headscope registers its kernel under the name "headscope", with transformers' SDPA mask builder
registered under the same name (without a mask function no causal mask would be built and the
outputs would be silently wrong). While at least one `Session` is active on a model, the model
runs with that implementation; when the last one exits, the previous implementation returns.
That state lives per model in a `WeakKeyDictionary` keyed by the model itself: two models routed
at once keep their own, and a model that is garbage-collected takes its state with it (no `id`
reuse can hand it to a newer model).

Sessions see each layer's pattern `[batch, head, query, key]` (key/value heads expanded to
query heads) and may edit z `[batch, pos, head, d_head]` before the output projection. They may
also edit q `[batch, head, pos, d_head]`, k and v `[batch, kv_head, pos, d_head]` (as the model
hands them over), restrict some key/value heads to a sink and a recent window of keys
(`key_window`, `headscope.attention.streaming`) and, when `edits_attention` says so for a layer, its scores and pattern: that
layer then takes the explicit path and other layers stay fused (`headscope.hf.hooks`). When
every session watching a layer takes a `LazyPattern` (`takes_lazy`), the layer runs the fused
kernel (output plus row log-sum-exp) and no map is built.

A session watches one group of attention sites (`headscope.hf.sites`; `selection`, `layer_map`):
its `layer_of` maps those modules to their layers in the group. Every other module of the model
runs through the kernel untouched (an encoder-decoder's decoder while its encoder is captured).
Cross-attention arrives as any other call: q from the decoder, k and v from the encoder's
output (key length not the query length), the encoder's padding mask, and `is_causal` False on
the module, so no causal mask is added; T5 hands it a zero position bias.

The kernel honours what models pass beyond q, k, v and the mask: `softcap` (Gemma 2),
per-head sink logits (`s_aux` in gpt-oss, or `sinks`), an additive `position_bias` (T5) and
`indices`, each query's selected keys (DeepSeek-V3.2's sparse attention), which join the mask.
Sliding windows arrive built into the mask. An argument it does not know stops the forward
pass with a one-line HeadscopeError instead of being silently ignored.

Where something stands between the attention function and the output projection (bitnet's
`attn_sub_norm`, which mixes the heads; qwen3_next's sigmoid output gate;
`headscope.hf.adapters.z_at_out`), `edit_z` runs on the output
projection's input instead, through a forward pre-hook that lives as long as the routing.

A packed vision module (qwen2_5_vl's, `headscope.hf.sites.packed_cores`) calls the attention
function once per image or window of one packed sequence of patches. Hooks on the module, living
as long as the routing, keep the pieces of its pattern from its entry to its exit and then hand
watchers one block-diagonal `[1, head, patch, patch]` map (zero between pieces, as the layer
computed it); its z is edited at the output projection's input, `[patch, head * d_head]` seen as
`[1, patch, head, d_head]`, the whole layer at once. Editing its scores or pattern, key windows,
and lazy or head-group patterns there are refused in one line: each call sees one piece only.
"""
from __future__ import annotations

import itertools
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
from torch import nn

from ..errors import HeadscopeError
from ..attention.kernel import attention, expand_kv, with_bias, with_selected_keys
from ..attention.lazy import lazy_attention
from ..attention.streaming import KeyWindow, restricted_mask, windowed_attention
from .adapters import check_on_interface, head_sizes, z_at_out
from .sites import Selection, packed_cores, select

__all__ = ["IMPLEMENTATION", "Session", "routed", "routed_models", "sessions_on", "selection", "layer_map",
           "block_diagonal"]

IMPLEMENTATION = "headscope"
_registered = False


@dataclass
class _Routing:
    """One routed model's state: the implementation to restore and its active sessions, each
    with the order in which it entered (so sessions on a shared module run in entry order)."""

    previous: str
    sessions: list[tuple[int, "Session"]] = field(default_factory=list)
    handles: list = field(default_factory=list)  # pre-hooks editing z at output projections, packed modules' hooks
    z_at_out: list = field(default_factory=list)  # id(core) of its layers whose z is edited at the output projection


_ROUTED: "weakref.WeakKeyDictionary[nn.Module, _Routing]" = weakref.WeakKeyDictionary()
_Z_AT_OUT: set[int] = set()  # id(core) of routed layers whose z is edited at the output projection
_PIECES: dict[int, list] = {}  # id(packed core) -> its pattern's pieces so far in the running call
_ENTRY = itertools.count()  # entry order of sessions across models
_kernel_calls = 0  # attention calls through the kernel so far (tells a session whether any ran in its block)


class Session:
    """Base class for what runs inside the kernel: override the three hooks below."""

    layer_of: dict[int, int]  # id(attention core module) -> layer index
    attention_ran: bool = False  # set by `routed` on exit: some attention ran through the kernel in the block

    def wants_pattern(self, layer: int) -> bool:
        return False

    def takes_lazy(self, layer: int) -> bool:
        """True if `on_pattern` accepts a `headscope.attention.lazy.LazyPattern` instead of a map."""
        return False

    def wants_entropy(self, layer: int) -> bool:
        """True if what reads the layer's `LazyPattern` reads its row entropy: the fused kernel
        then computes it in the call that computes z, where it can."""
        return False

    def pattern_chunk(self, layer: int) -> Optional[int]:
        """Heads per piece if this session can take the pattern in head groups (None: whole)."""
        return None

    def on_pattern(self, layer: int, pattern: torch.Tensor, attention_mask: Optional[torch.Tensor],
                   heads: Optional[slice] = None) -> None:
        """Receives `[batch, head, query, key]` fp32 probabilities on the model's device (or a
        `LazyPattern` of them if every watcher `takes_lazy`); with head groups, `heads` says
        which query heads this piece holds."""

    def note(self, layer: int, what: str) -> None:
        """Told what a layer's attention has beyond softmax over the keys ("sinks": a learned
        sink logit per head takes part of each row, so pattern rows sum to less than 1), and
        which kernel computed a lazy pattern's row log-sum-exp ("lse:cpu-flash", "lse:flex",
        "lse:blockwise")."""

    def note_call(self, layer: int, settings: dict) -> None:
        """Told how the layer's call computes its pattern: `settings` holds mask, is_causal, scale,
        softcap and sinks as `headscope.attention.kernel.pattern_of` takes them (after the model's
        position bias and key selection joined the mask), so a session can recompute the pattern
        for other queries or keys."""

    def end_pattern(self, layer: int) -> None:
        """Called after the last head group of a layer (only when patterns came in groups)."""

    def edit_z(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """Receives z `[batch, pos, head, d_head]`; returns it, edited or not."""
        return z

    def edit_qkv(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Receives q `[batch, head, pos, d_head]`, k and v `[batch, kv_head, pos, d_head]`;
        returns `(q, k, v)`, edited or not."""
        return q, k, v

    def edits_attention(self, layer: int) -> bool:
        """True if this session reads or replaces the layer's scores or pattern (explicit path)."""
        return False

    def edit_scores(self, layer: int, scores: torch.Tensor) -> torch.Tensor:
        """Receives the masked pre-softmax scores `[batch, head, query, key]` (fp32)."""
        return scores

    def edit_pattern(self, layer: int, pattern: torch.Tensor) -> torch.Tensor:
        """Receives the pattern `[batch, head, query, key]` (fp32) before it weighs the values."""
        return pattern

    def key_window(self, layer: int) -> Optional[KeyWindow]:
        """Key/value heads of the layer restricted to sink and recent keys (None: no restriction;
        `headscope.attention.streaming`). At most one session may restrict a layer."""
        return None


# Keyword arguments models pass to the attention function. Honoured: they change the math.
# Ignored: they change nothing here (sliding windows arrive built into the mask; the rest
# serve caches and other kernels, or, as logits_to_keep, which some vision-language models hand on,
# the model's head). Anything else stops the forward pass with its name.
HONOURED = ("softcap", "s_aux", "sinks", "position_bias", "is_causal", "indices")
IGNORED = ("position_ids", "use_cache", "sliding_window", "encoder_hidden_states", "deterministic",
           "output_attentions", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
           "output_router_logits", "output_hidden_states", "logits_to_keep")


def _extras(module, kwargs) -> tuple[Optional[float], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(softcap, sinks `[head]`, additive position bias) from the model's keyword arguments."""
    for name, value in kwargs.items():
        if value is not None and name not in HONOURED and name not in IGNORED:
            raise HeadscopeError(f"{type(module).__name__} passes {name!r} to the attention function, which "
                                 f"headscope does not know how to honour")
    sinks = kwargs.get("s_aux")
    return kwargs.get("softcap"), (kwargs.get("sinks") if sinks is None else sinks), kwargs.get("position_bias")


def _headscope_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface function: query `[b, h, q, d]`, key/value `[b, kv, k, d]`
    (cross-attention: k, the encoder's length, may differ from q)."""
    global _kernel_calls
    _kernel_calls += 1
    active = [(s, s.layer_of[id(module)]) for _, s in _active_sessions() if id(module) in s.layer_of]
    for session, layer in active:
        query, key, value = session.edit_qkv(layer, query, key, value)
    editors = [(s, layer) for s, layer in active if s.edits_attention(layer)]
    softcap, sinks, bias = _extras(module, kwargs)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # As in transformers' SDPA path: a missing mask means "causal" only for causal modules.
    is_causal = bool(is_causal) and attention_mask is None and query.shape[2] > 1
    mask = with_bias(attention_mask, bias)  # T5: relative position bias joins the mask
    indices = kwargs.get("indices")  # DeepSeek-V3.2: each query's selected keys join the mask
    if indices is not None:
        mask, is_causal = with_selected_keys(mask, indices, key.shape[2], is_causal), False
    watchers = [(s, layer) for s, layer in active if s.wants_pattern(layer)]
    windows = [w for w in (s.key_window(layer) for s, layer in active) if w is not None]
    if len(windows) > 1:
        raise HeadscopeError("two sessions restrict the keys of the same layer; use one at a time")
    window = windows[0] if windows else None
    if window is not None and (editors or watchers):  # the pattern is read: restriction in the mask
        mask = restricted_mask(window, mask, query.shape[1], key.shape[1], query.shape[2], key.shape[2], is_causal,
                               query.device)
        is_causal = False
    chunks = [s.pattern_chunk(layer) for s, layer in watchers]
    chunk = min(chunks) if chunks and all(chunks) else None
    pieces = _PIECES.get(id(module))  # a packed module's call: its pattern joins the others' at the exit
    if pieces is not None and (editors or window is not None or chunk is not None
                               or any(s.takes_lazy(layer) for s, layer in watchers)):
        raise HeadscopeError(f"{type(module).__name__} runs the attention function once per image or window, so "
                             f"its pattern is read whole and dense only: no pattern edits, key windows, lazy or "
                             f"head-group patterns")
    n_heads = query.shape[1]
    math = dict(is_causal=is_causal, scale=scaling, softcap=softcap)
    for session, layer in active:
        session.note_call(layer, dict(math, mask=mask, sinks=sinks))
    if sinks is not None:
        for session, layer in watchers:
            session.note(layer, "sinks")
    if window is not None and not (editors or watchers):  # restricted heads in blocks, no map
        z = windowed_attention(query, key, value, window, mask=mask, sinks=sinks, dropout_p=dropout, **math)
        pattern = None
    elif editors:  # someone reads or replaces scores/pattern: the explicit path, whole layer
        z, pattern = attention(query, key, value, mask=mask, sinks=sinks, dropout_p=dropout, need_pattern=True,
                               on_scores=_chain(editors, "edit_scores"), on_pattern=_chain(editors, "edit_pattern"),
                               **math)
        for session, layer in watchers:
            session.on_pattern(layer, pattern, attention_mask)
    elif watchers and not dropout and all(s.takes_lazy(layer) for s, layer in watchers):
        entropy = any(s.wants_entropy(layer) for s, layer in watchers)
        z, lazy = lazy_attention(query, key, value, mask=mask, sinks=sinks, entropy=entropy, **math)
        for session, layer in watchers:
            session.note(layer, f"lse:{lazy.kernel}")
            session.on_pattern(layer, lazy, attention_mask)
        pattern = None
    elif chunk is not None and chunk < n_heads:
        # Head groups: the explicit path on a few heads at a time, so one layer's full map
        # never exists; observers get each group's pattern, z is assembled from the groups.
        keys, values = expand_kv(key, n_heads), expand_kv(value, n_heads)
        parts = []
        for start in range(0, n_heads, chunk):
            heads = slice(start, min(n_heads, start + chunk))
            z_part, piece = attention(query[:, heads], keys[:, heads], values[:, heads], mask=_heads_of(mask, heads),
                                      sinks=sinks[heads] if sinks is not None else None, dropout_p=dropout,
                                      need_pattern=True, **math)
            for session, layer in watchers:
                session.on_pattern(layer, piece, attention_mask, heads=heads)
            parts.append(z_part)
            del piece
        for session, layer in watchers:
            session.end_pattern(layer)
        z, pattern = torch.cat(parts, dim=1), None
    else:
        z, pattern = attention(query, key, value, mask=mask, sinks=sinks, dropout_p=dropout,
                               need_pattern=bool(watchers), **math)
        if pieces is not None and pattern is not None:
            pieces.append(pattern)  # handed to the watchers, joined, at the module's exit (_packed_hooks)
        elif pattern is not None:
            for session, layer in watchers:
                session.on_pattern(layer, pattern, attention_mask)
    z = z.transpose(1, 2)  # (B, T, H, D)
    if id(module) not in _Z_AT_OUT:
        z = _edit_z(active, z)
    weights = pattern.to(query.dtype) if pattern is not None else None
    return z.contiguous(), weights


def _edit_z(active: list, z: torch.Tensor) -> torch.Tensor:
    for session, layer in active:
        z = session.edit_z(layer, z)
    return z


def _z_pre_hook(core: nn.Module, n_heads: int):
    """A forward pre-hook on an output projection whose input `[batch, pos, head * d_head]` is z
    (after whatever mixed the heads; a packed module's `[patch, head * d_head]`, one sequence): the
    sessions watching `core` edit it as `[b, pos, head, d]`."""
    def hook(module, args):
        active = [(s, s.layer_of[id(core)]) for _, s in _active_sessions() if id(core) in s.layer_of]
        if not active:
            return None
        flat = args[0]
        batched = flat if flat.dim() == 3 else flat.unsqueeze(0)  # (B, T, H * D)
        z = _edit_z(active, batched.view(*batched.shape[:-1], n_heads, flat.shape[-1] // n_heads))  # (B, T, H, D)
        return (z.reshape(flat.shape), *args[1:])
    return hook


def block_diagonal(pieces: list) -> torch.Tensor:
    """The patterns of a packed module's calls `[1, head, n_i, n_i]` (one image or window each, its
    patches next in the packed order) along the diagonal of one `[1, head, patch, patch]` map, zero
    between pieces."""
    size = sum(piece.shape[-1] for piece in pieces)
    joined = pieces[0].new_zeros(*pieces[0].shape[:2], size, size)
    start = 0
    for piece in pieces:
        end = start + piece.shape[-1]
        joined[..., start:end, start:end] = piece
        start = end
    return joined


def _packed_hooks(core: nn.Module) -> tuple:
    """A forward pre-hook and a forward hook on a packed module: the first opens the list of its
    pattern's pieces (one per call of the attention function), the second joins them along the
    diagonal and hands the map to the sessions watching `core`."""
    def enter(module, args):
        _PIECES[id(core)] = []

    def leave(module, args, output):
        pieces = _PIECES.pop(id(core), [])
        watchers = [(s, s.layer_of[id(core)]) for _, s in _active_sessions() if id(core) in s.layer_of]
        watchers = [(s, layer) for s, layer in watchers if s.wants_pattern(layer)]
        if not pieces or not watchers:
            return None
        pattern = block_diagonal(pieces)  # (1, H, P, P)
        for session, layer in watchers:
            session.on_pattern(layer, pattern, None)
        return None
    return enter, leave


def _chain(editors: list, method: str):
    """One kernel callback running `method` of every editing session in turn."""
    def edit(x: torch.Tensor) -> torch.Tensor:
        for session, layer in editors:
            x = getattr(session, method)(layer, x)
        return x
    return edit


def _heads_of(mask: Optional[torch.Tensor], heads: slice) -> Optional[torch.Tensor]:
    """The part of a `[batch, head or 1, query, key]` mask that a head group reads."""
    return mask[:, heads] if mask is not None and mask.dim() == 4 and mask.shape[1] > 1 else mask


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _headscope_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    _registered = True


def selection(model: nn.Module, sites: Optional[str] = None) -> Selection:
    """The attention sites `sites` names (`headscope.hf.sites.select`; None: the analysed stack)
    in a model whose attention goes through the interface; HeadscopeError naming the reason otherwise."""
    if not isinstance(model, nn.Module):
        hint = " (a Loaded: pass loaded.model)" if hasattr(model, "model") and hasattr(model, "tokenizer") else ""
        raise HeadscopeError(f"expected a transformers model, got {type(model).__name__}{hint}")
    check_on_interface(type(model), getattr(model.config, "model_type", "?"))
    return select(model, sites)


def layer_map(model: nn.Module, sites: Optional[str] = None) -> dict[int, int]:
    """`{id(core module): layer}` of the sites `sites` names (default: the analysed stack)."""
    return {id(core): layer for layer, core in selection(model, sites).cores.items()}


def _active_sessions() -> list[tuple[int, Session]]:
    """(entry number, session) of every routed model, in entry order."""
    return sorted((entry for state in list(_ROUTED.values()) for entry in state.sessions), key=lambda e: e[0])


def routed_models() -> list[nn.Module]:
    """The models that have at least one session active now."""
    return list(_ROUTED.keys())


def sessions_on(model: nn.Module) -> list[Session]:
    """The sessions active on `model`, in entry order (empty when it is not routed)."""
    state = _ROUTED.get(model)
    return [session for _, session in state.sessions] if state is not None else []


@contextmanager
def routed(model: nn.Module, session: Session) -> Iterator[Session]:
    """Run `model` through headscope's kernel with `session` active; always restores the model.

    Contexts nest, on one model or several: the first session on a model switches it to
    headscope's implementation, the last one to exit switches it back to what it had before.
    """
    _register()
    state = _ROUTED.get(model)
    if state is None:
        state = _Routing(model.config._attn_implementation)
        model.set_attn_implementation(IMPLEMENTATION)
        _ROUTED[model] = state
        for core, out in z_at_out(model):
            state.handles.append(out.register_forward_pre_hook(_z_pre_hook(core, head_sizes(model.config)[1])))
            state.z_at_out.append(id(core))
        for core, out, n_heads in packed_cores(model):
            enter, leave = _packed_hooks(core)
            state.handles += [out.register_forward_pre_hook(_z_pre_hook(core, n_heads)),
                              core.register_forward_pre_hook(enter), core.register_forward_hook(leave)]
            state.z_at_out.append(id(core))
        _Z_AT_OUT.update(state.z_at_out)
    entry = (next(_ENTRY), session)
    state.sessions.append(entry)
    calls = _kernel_calls
    try:
        yield session
    finally:
        session.attention_ran = _kernel_calls > calls
        state.sessions.remove(entry)
        if not state.sessions:
            del _ROUTED[model]
            for handle in state.handles:
                handle.remove()
            _Z_AT_OUT.difference_update(state.z_at_out)
            for core in state.z_at_out:
                _PIECES.pop(core, None)  # a forward pass that raised inside a packed module
            model.set_attn_implementation(state.previous)
