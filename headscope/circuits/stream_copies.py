"""Forward passes in which each receiver reads its own copy of the residual stream.

`split_run(target, graph, delta_for=None, embed=None)` is a context manager; inside it, every
forward pass of the model
- records every sender's output at every position, `run.senders[i]` `[batch, pos, d_model]`: the
  embedding (the first layer's input), each head's output after W_O (`hook_result`), each other
  writer's output;
- hands each receiver `r` of `graph` (`headscope.circuits.edges`) the copy `s_r + delta_for(r)` of
  the residual state `s_r` it reads, where `delta_for(r)` returns `[len(r.names), batch, pos,
  d_model]` or None (the stream as it is). A whole module (an MLP, the logits) reads
  `norm(s_r + delta)` in place of `norm(s_r)`. An attention block's 3 x H receivers (each head's
  query, key and value) read 3 x H copies: the block runs once on all copies to get their
  q, k and v (stopped right after, before any attention is computed), and the block's real call
  then uses head h's query from copy (h, q) and, under grouped-query attention, its own key and
  value from copies (h, k) and (h, v), its key/value head's slice, given to the kernel per
  query head. For a block, `delta_for` may instead return `(rows, which)`: `rows` `[copies,
  batch, pos, d_model]` the distinct deltas and `which[i]` the row that name i reads, so that
  names with the same delta share one copy;
- with `embed(ids_embedding) -> tensor`, replaces the embedding's output (EAP-IG's interpolation);
- where a norm stands between a head block and the stream (`graph.head_post`), replaces each
  head's output by its share of the norm's output at the run's frozen scale.
Deltas are added in the stream's own dtype (a bfloat16 model's copies are bfloat16; gradients
reach a float32 delta through the cast).
A pass must be run with `use_cache=False` (a cache would see the copies' keys).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Optional

import torch

from ..errors import HeadscopeError
from ..hf.hooks import model_hooks
from ..hf.route import Session, layer_map, routed
from .residual import close

__all__ = ["SplitRun", "split_run"]


class _Stop(Exception):
    """Ends the block's call on the copies once their q, k and v are known."""


class _Splitter(Session):
    """Harvests the copies' q, k, v in the block's first call; replaces them in its real call."""

    def __init__(self, layer_of: dict):
        self.layer_of = layer_of
        self.harvest: Optional[int] = None  # the layer whose copies are being run
        self.harvested = None
        self.pending: dict = {}  # layer -> (q, k, v) for its real call

    def edit_qkv(self, layer, q, k, v):
        if self.harvest == layer:
            self.harvested = (q, k, v)
            raise _Stop
        return self.pending.pop(layer, (q, k, v))


def _tiled(value, batch: int, copies: int):
    """`value` with every tensor of `batch` rows repeated `copies` times along its first axis."""
    if isinstance(value, torch.Tensor):
        return value.repeat(copies, *([1] * (value.dim() - 1))) if value.dim() and value.shape[0] == batch else value
    if isinstance(value, (tuple, list)):
        return type(value)(_tiled(v, batch, copies) for v in value)
    if isinstance(value, dict):
        return {k: _tiled(v, batch, copies) for k, v in value.items()}
    return value


class SplitRun:
    """What `split_run` keeps: `senders` `{index: [batch, pos, d_model]}` of the last pass."""

    def __init__(self):
        self.senders: dict = {}
        self.read: dict = {}  # id(norm or module) -> the residual state it read in this pass


def _first(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _with_first(args, kwargs, value):
    if args:
        return (value, *args[1:]), kwargs
    return args, dict(kwargs, hidden_states=value)


@contextmanager
def split_run(target, graph, delta_for: Optional[Callable] = None, embed: Optional[Callable] = None):
    """See the module docstring."""
    model = target.model
    run = SplitRun()
    splitter = _Splitter(layer_map(model, target.sites))
    modules = dict(model.named_modules())
    parts = graph.parts
    handles = []

    def keep_first_input(module, args, kwargs):
        run.senders[0] = _first(args, kwargs)

    def keep_results(value, hook):  # (B, T, H, D)
        layer = int(hook.name.split(".")[1])
        for h in range(value.shape[2]):
            run.senders[graph.head_sender[(layer, h)]] = value[:, :, h]

    def keep_output(index):
        def hook(module, args, output):
            value = output if isinstance(output, torch.Tensor) else output[0]
            run.senders[index] = value.view(run.senders[0].shape) if value.dim() == 2 else value  # flat rows
        return hook

    def keep_read(module, args, kwargs):
        run.read[id(module)] = _first(args, kwargs)

    def shares_after(layer, form):  # a post-attention norm: each head's share at the run's frozen scale
        @torch.no_grad()  # recorded values only: no gradient runs through a sender's record
        def hook(module, args, output):
            x = args[0].detach() if args else None
            y = (output if isinstance(output, torch.Tensor) else output[0]).detach()
            heads = [graph.head_sender[(layer, h)] for h in range(graph.n_heads)]
            results = torch.stack([run.senders[i].detach() for i in heads])  # (H, B, T, D)
            if x is None or not close(results.sum(0), x, results):
                raise HeadscopeError(f"layer {layer}'s attention output is not the sum of its heads' outputs (a bias "
                                     f"after W_O?), so their shares of its norm ({type(module).__name__}) are not "
                                     f"theirs alone")
            d = x.shape[-1]
            frozen = form.freeze(x.reshape(-1, d).float(), y.reshape(-1, d).float())
            for i, result in zip(heads, results):
                run.senders[i] = frozen.apply(result.reshape(-1, d).float()).reshape(result.shape).to(result.dtype)
        return hook

    def module_reader(receiver):
        def hook(module, args, kwargs):
            delta = delta_for(receiver) if delta_for is not None else None
            if delta is None:
                return None
            if receiver.norm is None:
                stream = _first(args, kwargs)
                return _with_first(args, kwargs, stream + delta[0].to(stream.dtype).reshape(stream.shape))
            stream = run.read[id(receiver.norm)]  # OPT's MLP reads its rows flat: [batch * pos, d_model]
            normed = receiver.norm(stream + delta[0].to(stream.dtype).reshape(stream.shape))
            run.read[id(receiver.norm)] = stream  # the record stays the stream itself for the norm's other readers
            return _with_first(args, kwargs, normed)
        return hook

    def head_reader(receiver):
        n_heads = graph.n_heads

        def hook(module, args, kwargs):
            if splitter.harvest is not None:  # the call on the copies, from below
                return None
            delta = delta_for(receiver) if delta_for is not None else None
            if delta is None:
                return None
            rows, which = delta if isinstance(delta, tuple) else (delta, range(len(delta)))
            stream = run.read[id(receiver.norm)] if receiver.norm is not None else _first(args, kwargs)
            copies = stream.unsqueeze(0) + rows.to(stream.dtype)  # (C, B, T, D), C = 3H or the distinct rows
            batch = stream.shape[0]
            flat = copies.reshape(-1, *stream.shape[1:])
            if receiver.norm is not None:
                flat = receiver.norm(flat)
                run.read[id(receiver.norm)] = stream  # a parallel block's MLP reads the same norm's record
            call_args, call_kwargs = _with_first(tuple(_tiled(a, batch, len(rows)) for a in args),
                                                 _tiled(kwargs, batch, len(rows)), flat)
            splitter.harvest = receiver.layer
            try:
                module(*call_args, **call_kwargs)
                raise HeadscopeError(f"layer {receiver.layer}'s attention block did not pass its q, k and v to "
                                     f"the attention function, so its heads cannot read copies of the stream")
            except _Stop:
                pass
            finally:
                splitter.harvest = None
            q, k, v = splitter.harvested
            splitter.harvested = None
            group = n_heads // k.shape[1]
            pick = lambda x, copy, head: x[copy * batch:(copy + 1) * batch, head]  # noqa: E731
            splitter.pending[receiver.layer] = (
                torch.stack([pick(q, which[3 * h], h) for h in range(n_heads)], dim=1),
                torch.stack([pick(k, which[3 * h + 1], h // group) for h in range(n_heads)], dim=1),
                torch.stack([pick(v, which[3 * h + 2], h // group) for h in range(n_heads)], dim=1))
            return None
        return hook

    def replace_embedding(module, args, output):
        return embed(output)

    try:
        first = modules[parts.layers[0][1]]
        handles.append(first.register_forward_pre_hook(keep_first_input, with_kwargs=True))
        for layer, writers in parts.writers.items():
            for writer in writers:
                if writer.kind != "heads":
                    source = writer.post_norm if writer.post_norm is not None else writer.module
                    handles.append(source.register_forward_hook(keep_output(graph.writer_sender[writer.path])))
        for receiver in graph.receivers:
            if receiver.norm is not None:
                handles.append(receiver.norm.register_forward_pre_hook(keep_read, with_kwargs=True))
            reader = head_reader(receiver) if receiver.kind == "heads" else module_reader(receiver)
            handles.append(receiver.module.register_forward_pre_hook(reader, with_kwargs=True))
        for layer, (post, form) in graph.head_post.items():
            handles.append(post.register_forward_hook(shares_after(layer, form)))
        if embed is not None:
            handles.append(model.get_input_embeddings().register_forward_hook(replace_embedding))
        with routed(model, splitter), model_hooks(model, {"layers.*.attn.hook_result": keep_results},
                                                  sites=target.sites):
            yield run
    finally:
        for handle in handles:
            handle.remove()
