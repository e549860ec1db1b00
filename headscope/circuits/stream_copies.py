"""Forward passes in which each receiver reads its own copy of the residual stream.

`split_run(target, graph, delta_for=None, embed=None)` is a context manager; inside it, every
forward pass of the model
- records every sender's output at every position, `run.senders[i]` `[batch, pos, d_model]`: the
  embedding (the first layer's input), each head's output after W_O (`hook_result`), each other
  writer's output; with `store=`, hands each to `store(i, output)` as soon as it is final instead
  of keeping it (so a caller can add it into one buffer while the pass goes on);
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
  names with the same delta share one copy; `rows` may also be an object of `len(rows)` rows
  that writes `stream + rows[c]` itself (`rows.added_to(stream, c, out=)`) and gives the tensor on
  `rows.dense()` (deltas assembled from parts, copied only where the block runs on its copies);
- with `norms` (a dict the caller keeps between runs), a head block whose heads take their q, k
  and v by projection columns (`head_plans`) applies an RMSNorm on a float32 stream inside those
  columns instead of running it on every copy (`_RMSForm`, checked against the module once);
- with `embed(ids_embedding) -> tensor`, replaces the embedding's output (EAP-IG's interpolation);
- where a norm stands between a head block and the stream (`graph.head_post`), replaces each
  head's output by its share of the norm's output at the run's frozen scale.
Deltas are added in the stream's own dtype (a bfloat16 model's copies are bfloat16; gradients
reach a float32 delta through the cast).
A pass must be run with `use_cache=False` (a cache would see the copies' keys).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Optional

import torch

from ..errors import HeadscopeError
from ..hf.hooks import model_hooks
from ..hf.route import Session, layer_map, routed
from ..head_geometry.norm_gains import norm_gain
from .residual import close, is_norm, norm_form

__all__ = ["SplitRun", "split_run"]


class _Harvested(Exception):
    """Carries the copies' q, k and v out of the attention block's call on them (see `_Splitter`)."""

    def __init__(self, qkv):
        super().__init__()
        self.qkv = qkv


class _Splitter(Session):
    """The routing session of a split run: the attention kernel hands it every block's q, k and v.

    In a block's call on the copies (`harvest` set to its layer) it takes their q, k and v and
    leaves the call there, before any attention is computed: a module's forward can only be left
    early by raising, so it raises `_Harvested`, which `harvest_qkv` catches at once. In the
    block's real call it hands the kernel the per-head q, k and v picked from the copies.
    """

    def __init__(self, layer_of: dict):
        self.layer_of = layer_of
        self.harvest: Optional[int] = None  # the layer whose copies are being run
        self.pending: dict = {}  # layer -> (q, k, v) for its real call
        self.after: dict = {}  # layer -> what to undo once its real call has its q, k and v

    def edit_qkv(self, layer, q, k, v):
        if self.harvest == layer:
            raise _Harvested((q, k, v))
        undo = self.after.pop(layer, None)
        if undo is not None:
            undo()
        return self.pending.pop(layer, (q, k, v))

    def undo_all(self) -> None:
        """Undoes what a real call left pending (a pass that stopped before reaching it)."""
        while self.after:
            self.after.popitem()[1]()

    def harvest_qkv(self, layer: int, module, args, kwargs):
        """The q, k and v `[batch', heads, pos, d_head]` of `module(*args, **kwargs)`, the block
        of `layer` called on the copies, with nothing after them computed."""
        self.harvest = layer
        try:
            module(*args, **kwargs)
        except _Harvested as harvested:
            return harvested.qkv
        finally:
            self.harvest = None
        raise HeadscopeError(f"layer {layer}'s attention block did not pass its q, k and v to the attention "
                             f"function, so its heads cannot read copies of the stream")


COPIES_AT_MOST = 2  # distinct input rows up to which a head block runs on them rather than by columns


def _tiled(value, batch: int, copies: int):
    """`value` with every tensor of `batch` rows repeated `copies` times along its first axis."""
    if isinstance(value, torch.Tensor):
        return value.repeat(copies, *([1] * (value.dim() - 1))) if value.dim() and value.shape[0] == batch else value
    if isinstance(value, (tuple, list)):
        return type(value)(_tiled(v, batch, copies) for v in value)
    if isinstance(value, dict):
        return {k: _tiled(v, batch, copies) for k, v in value.items()}
    return value


def _overlap(edits: list, width: int) -> bool:
    """Whether two of `edits` `[(columns, ...)]` set the same one of `width` output columns."""
    seen = torch.zeros(width, dtype=torch.bool)
    for cols, *_ in edits:
        if seen[cols].any():
            return True
        seen[cols] = True
    return False


def _replaced(edits, base: list, module, args, output):
    """A projection's output with the columns of `edits` `[(columns, value)]` set to `value`
    (computed from a head's copy of the stream with those weight rows). `base` keeps the
    projection's own output (its first call in a block's rounds) for `_reuse`."""
    if not base:
        base.append(output)
    output = output.clone()
    for cols, value in edits:
        output[..., cols] = value.reshape(*output.shape[:-1], -1)
    return output


def _reuse(base: list, *args, **kwargs):
    """A projection's forward in a block's later rounds: its output on the stream, kept from the
    first round (the input is the same stream in every round), a copy of its own."""
    return base[0].clone()


def _first(args, kwargs):
    return args[0] if args else kwargs["hidden_states"]


def _with_first(args, kwargs, value):
    if args:
        return (value, *args[1:]), kwargs
    return args, dict(kwargs, hidden_states=value)


class _RMSForm:
    """An RMSNorm as `gain * x * inverse_rms(x)`, so that a copy's projection columns can take the
    gain in their weight rows and the per-row scale after the product: `norm(x) @ W[cols].T =
    (x @ (gain * W[cols]).T) * inverse_rms(x)`, the norm's elementwise passes over the copy
    replaced by one reduction. Equal to the module's output to float rounding (checked on a
    stream when made)."""

    def __init__(self, gain: torch.Tensor, eps: float):
        self.gain, self.eps = gain, eps

    def inverse_rms(self, x: torch.Tensor) -> torch.Tensor:
        """`[rows, 1]`: 1 / sqrt(mean(x^2) + eps) of `x` `[rows, d]` (one pass over x)."""
        length = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return torch.rsqrt(length.square_().div_(x.shape[-1]).add_(self.eps))

    @classmethod
    @torch.no_grad()
    def of(cls, norm, stream: torch.Tensor) -> Optional["_RMSForm"]:
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if not isinstance(eps, float) or not is_norm(norm, stream.shape[-1]) or norm.weight.device != stream.device:
            return None  # (a weight elsewhere: an offloaded model's, moved in by its hooks when it runs)
        d = stream.shape[-1]
        form = norm_form(norm, d, torch.float32, stream.device)
        if form.centred or bool(form.bias.abs().max() > 0):
            return None
        made = cls(norm_gain(norm, d).to(stream.device), eps)
        x = stream.reshape(-1, d)
        own = norm(stream).reshape(-1, d).float()
        mine = x * made.gain * made.inverse_rms(x)
        return made if torch.allclose(mine, own, rtol=1e-5, atol=1e-6 * float(own.abs().max())) else None


class SplitRun:
    """One split run's hooks and what they keep.

    Attributes:
        senders: `{index: [batch, pos, d_model]}`, every sender's output in the last pass.
        read: `{id(norm or module): [batch, pos, d_model]}`, the residual state each receiver's
            norm (or the module itself) read in the last pass.

    The hooks, in the order a pass meets them: the first layer's input is sender 0
    (`keep_first_input`); each norm records the stream it reads (`keep_read`); each receiver
    swaps its input for its copy (`read_module`, `read_heads`); each writer records its output
    (`keep_output`, `keep_results` for the heads); a norm after the heads turns their outputs into
    shares of its output (`keep_head_shares`).
    """

    def __init__(self, target, graph, delta_for: Optional[Callable] = None, embed: Optional[Callable] = None,
                 store: Optional[Callable] = None, head_plans: Optional[dict] = None, norms: Optional[dict] = None):
        self.target, self.graph = target, graph
        self.delta_for, self.embed, self.store = delta_for, embed, store
        self.head_plans = head_plans or {}
        self.norms = norms  # id(norm) -> `_RMSForm` or None, kept by the caller between runs; None: never fused
        self.splitter = _Splitter(layer_map(target.model, target.sites))
        self.senders: dict = {}
        self.read: dict = {}
        self.shape: Optional[torch.Size] = None  # the stream's [batch, pos, d_model]

    def release(self) -> None:
        """Drops the callbacks and the pass's tensors. A caller's `delta_for` usually reads the run
        it was given (`with split_run(...) as state`), a reference cycle that would otherwise hold
        every buffer the callback reaches until the garbage collector runs."""
        self.delta_for = self.embed = self.store = None
        self.read.clear()
        self.splitter.pending.clear()

    def _keep(self, index: int, value: torch.Tensor) -> None:
        if self.store is None:
            self.senders[index] = value
        else:
            self.store(index, value)

    def _delta(self, receiver):
        return self.delta_for(receiver) if self.delta_for is not None else None

    # -- what the senders wrote ------------------------------------------------------------------

    def keep_first_input(self, module, args, kwargs):
        first = _first(args, kwargs)
        self.shape = first.shape
        self._keep(0, first)

    def keep_results(self, value, hook):  # (B, T, H, D)
        layer = int(hook.name.split(".")[1])
        later = layer in self.graph.head_post  # kept until its norm turns them into shares
        for h in range(value.shape[2]):
            index = self.graph.head_sender[(layer, h)]
            if later:
                self.senders[index] = value[:, :, h]
            else:
                self._keep(index, value[:, :, h])

    def keep_output(self, index: int, module, args, output):
        value = output if isinstance(output, torch.Tensor) else output[0]
        self._keep(index, value.view(self.shape) if value.dim() == 2 else value)  # flat rows

    @torch.no_grad()  # recorded values only: no gradient runs through a sender's record
    def keep_head_shares(self, layer: int, form, module, args, output):
        """A norm after the heads: each head's output becomes its share of the norm's output at the
        run's frozen scale."""
        x = args[0].detach() if args else None
        y = (output if isinstance(output, torch.Tensor) else output[0]).detach()
        heads = [self.graph.head_sender[(layer, h)] for h in range(self.graph.n_heads)]
        results = torch.stack([self.senders[i].detach() for i in heads])  # (H, B, T, D)
        if x is None or not close(results.sum(0), x, results):
            raise HeadscopeError(f"layer {layer}'s attention output is not the sum of its heads' outputs (a bias "
                                 f"after W_O?), so their shares of its norm ({type(module).__name__}) are not "
                                 f"theirs alone")
        d = x.shape[-1]
        frozen = form.freeze(x.reshape(-1, d).float(), y.reshape(-1, d).float())
        for i, result in zip(heads, results):
            if self.store is not None:
                del self.senders[i]
            self._keep(i, frozen.apply(result.reshape(-1, d).float()).reshape(result.shape).to(result.dtype))

    # -- what the receivers read ------------------------------------------------------------------

    def keep_read(self, module, args, kwargs):
        self.read[id(module)] = _first(args, kwargs)

    def read_module(self, receiver, module, args, kwargs):
        """A whole module (an MLP, the logits) reads `norm(stream + delta)`."""
        delta = self._delta(receiver)
        if delta is None:
            return None
        if receiver.norm is None:
            stream = _first(args, kwargs)
            return _with_first(args, kwargs, stream + delta[0].to(stream.dtype).reshape(stream.shape))
        stream = self.read[id(receiver.norm)]  # OPT's MLP reads its rows flat: [batch * pos, d_model]
        normed = receiver.norm(stream + delta[0].to(stream.dtype).reshape(stream.shape))
        self.read[id(receiver.norm)] = stream  # the record stays the stream itself for the norm's other readers
        return _with_first(args, kwargs, normed)

    def read_heads(self, receiver, module, args, kwargs):
        """An attention block's heads: the block runs on the copies up to their q, k and v, and its
        real call then takes each head's q, k and v from that head's copies."""
        if self.splitter.harvest is not None:  # the call on the copies, from below
            return None
        delta = self._delta(receiver)
        if delta is None:
            return None
        rows, which = delta if isinstance(delta, tuple) else (delta, range(len(delta)))
        stream = self.read[id(receiver.norm)] if receiver.norm is not None else _first(args, kwargs)
        plan = self.head_plans.get(id(module))
        if plan is not None and len(rows) > COPIES_AT_MOST:  # fewer distinct rows: the block on them is cheaper
            picked = self._by_columns(receiver, module, args, kwargs, stream, rows, which, plan)
            if picked is not None:
                self.splitter.pending[receiver.layer] = picked
                return None
        if not isinstance(rows, torch.Tensor):  # rows given by parts (`added_to`): the tensor itself
            rows = rows.dense()
        copies = stream.unsqueeze(0) + rows.to(stream.dtype)  # (C, B, T, D), C = 3H or the distinct rows
        batch = stream.shape[0]
        flat = copies.reshape(-1, *stream.shape[1:])
        if receiver.norm is not None:
            flat = receiver.norm(flat)
            self.read[id(receiver.norm)] = stream  # a parallel block's MLP reads the same norm's record
        call_args, call_kwargs = _with_first(tuple(_tiled(a, batch, len(rows)) for a in args),
                                             _tiled(kwargs, batch, len(rows)), flat)
        q, k, v = self.splitter.harvest_qkv(receiver.layer, module, call_args, call_kwargs)
        n_heads = self.graph.n_heads
        group = n_heads // k.shape[1]

        def pick(x, copy, head):
            return x[copy * batch:(copy + 1) * batch, head]

        self.splitter.pending[receiver.layer] = (
            torch.stack([pick(q, which[3 * h], h) for h in range(n_heads)], dim=1),
            torch.stack([pick(k, which[3 * h + 1], h // group) for h in range(n_heads)], dim=1),
            torch.stack([pick(v, which[3 * h + 2], h // group) for h in range(n_heads)], dim=1))
        return None

    def _rms_form(self, norm, stream: torch.Tensor):
        """`norm` as an `_RMSForm` where the caller keeps them (`norms`) and it is one: an RMSNorm
        (no centring, no bias) on a float32 stream whose epsilon it names, its output on this
        stream matching `x * gain / sqrt(mean(x^2) + eps)`; else None (the module runs itself)."""
        if self.norms is None or norm is None or stream.dtype != torch.float32:
            return None
        key = id(norm)
        if key not in self.norms:
            self.norms[key] = _RMSForm.of(norm, stream)
        return self.norms[key]

    def _by_columns(self, receiver, module, args, kwargs, stream, rows, which, plan):
        """Each head's q, k and v from its own copy without running the block on the copies: the
        block runs on the stream itself, once per round of `plan` (`headscope.circuits.receiver_grads.HeadPlan`:
        heads whose projection columns do not overlap), with each projection's output columns of
        the round's heads replaced by their copy (`stream + rows[which[name]]`, through the norm)
        times those weight rows. The copies are made and multiplied one at a time, each while it
        is in cache. None where a round's parts overlap in a projection (the caller then runs the
        copies)."""
        columns, rounds = plan.plan.support, plan.plan.rounds
        n_heads = self.graph.n_heads
        schedule = []  # per round: its (head, part)s and, per projection, [(columns, head, part)]
        for r in range(max(len(parts) for parts in rounds)):
            assigned = [(h, part) for part in range(3) if r < len(rounds[part]) for h in rounds[part][r]]
            edits = [[] for _ in plan.projections]
            for h, part in assigned:
                for j, cols in enumerate(columns[part][h]):
                    if cols is not None:
                        edits[j].append((cols, h, part))
            if any(_overlap(e, weight.shape[0]) for e, (_, weight, _) in zip(edits, plan.projections)):
                return None
            schedule.append((assigned, edits))
        reads: dict = {}  # copy -> [(projection index, columns, head, part)]
        for _, edits in schedule:
            for j, edit in enumerate(edits):
                for cols, h, part in edit:
                    reads.setdefault(which[3 * h + part], []).append((j, cols, h, part))
        values = {}  # (projection index, head, part) -> the copy's value on those columns
        form = self._rms_form(receiver.norm, stream)
        copy_buffer = torch.empty_like(stream)  # each copy, one at a time (used up before the next)
        for copy, wanted in reads.items():
            given = torch.add(stream, rows[copy].to(stream.dtype), out=copy_buffer) \
                if isinstance(rows, torch.Tensor) else rows.added_to(stream, copy, out=copy_buffer)
            if form is None and receiver.norm is not None:
                given = receiver.norm(given)
            given = given.reshape(-1, given.shape[-1])
            # with the form, norm(x) @ W = (x @ (g * W)) / rms(x): the norm's gain in the weight rows
            scale = form.inverse_rms(given) if form is not None else None
            for j, cols, h, part in wanted:
                _, weight, bias = plan.projections[j]
                rows_used = weight[cols].to(given.dtype)
                if scale is not None:
                    value = torch.mm(given, (rows_used * form.gain).t()).mul_(scale)
                else:
                    value = given @ rows_used.t()
                values[(j, h, part)] = value if bias is None else value + bias[cols].to(value.dtype)
        if receiver.norm is not None:
            self.read[id(receiver.norm)] = stream  # the norm's record stays the stream (its hook saw the copies)
        results = []
        bases = [[] for _ in plan.projections]  # each projection's output on the stream, from the first round
        reused: list = []  # (projection, its instance's own forward or None) while it gives its base

        def restore():
            for projection, own in reused:
                if own is None:
                    del projection.forward
                else:
                    projection.forward = own
            reused.clear()

        def reuse_bases():  # later calls on the same stream: the first round's outputs
            for (projection, _, _), base in zip(plan.projections, bases):
                if base and all(p is not projection for p, _ in reused):
                    reused.append((projection, projection.__dict__.get("forward")))  # (accelerate's own kept)
                    projection.forward = partial(_reuse, base)

        try:
            for assigned, edits in schedule:
                reuse_bases()
                handles = [projection.register_forward_hook(
                               partial(_replaced, [(cols, values[(j, h, part)]) for cols, h, part in edit], base))
                           for j, (edit, (projection, _, _), base) in enumerate(zip(edits, plan.projections, bases))
                           if edit]
                try:
                    q, k, v = self.splitter.harvest_qkv(receiver.layer, module, args, kwargs)
                finally:
                    for handle in handles:
                        handle.remove()
                results.append((assigned, q, k, v))
        except BaseException:
            restore()
            raise
        # the block's real call, on the same stream, takes the projections' outputs from the first round
        # too (its q, k and v are replaced by the picks); they are restored when it hands them over
        reuse_bases()
        if reused:
            self.splitter.after[receiver.layer] = restore
        group = n_heads // results[0][2].shape[1]
        source = {}  # (head, part) -> the round whose value it takes
        for r, (assigned, *_) in enumerate(results):
            source.update({key: r for key in assigned})
        picked = []
        for part in range(3):
            rows = []
            for h in range(n_heads):
                value = results[source.get((h, part), 0)][1 + part]
                rows.append(value[:, h] if part == 0 else value[:, h // group])
            picked.append(torch.stack(rows, dim=1))
        return tuple(picked)

    def replace_embedding(self, module, args, output):
        return self.embed(output)

    # -- putting the hooks on the model --------------------------------------------------------------

    def install(self, handles: list) -> None:
        """Registers every hook, appending each handle to `handles` as it is made."""
        graph, parts = self.graph, self.graph.parts
        modules = dict(self.target.model.named_modules())
        handles.append(modules[parts.layers[0][1]].register_forward_pre_hook(self.keep_first_input, with_kwargs=True))
        for layer, writers in parts.writers.items():
            for writer in writers:
                if writer.kind != "heads":
                    source = writer.post_norm if writer.post_norm is not None else writer.module
                    handles.append(source.register_forward_hook(
                        partial(self.keep_output, graph.writer_sender[writer.path])))
        for receiver in graph.receivers:
            if receiver.norm is not None:
                handles.append(receiver.norm.register_forward_pre_hook(self.keep_read, with_kwargs=True))
            reader = self.read_heads if receiver.kind == "heads" else self.read_module
            handles.append(receiver.module.register_forward_pre_hook(partial(reader, receiver), with_kwargs=True))
        for layer, (post, form) in graph.head_post.items():
            handles.append(post.register_forward_hook(partial(self.keep_head_shares, layer, form)))
        if self.embed is not None:
            handles.append(self.target.model.get_input_embeddings().register_forward_hook(self.replace_embedding))


@contextmanager
def split_run(target, graph, delta_for: Optional[Callable] = None, embed: Optional[Callable] = None,
              store: Optional[Callable] = None, head_plans: Optional[dict] = None, norms: Optional[dict] = None):
    """See the module docstring; yields the `SplitRun`."""
    run = SplitRun(target, graph, delta_for, embed, store, head_plans, norms)
    handles: list = []
    results = {"layers.*.attn.hook_result": run.keep_results}
    try:
        run.install(handles)
        with routed(target.model, run.splitter), model_hooks(target.model, results, sites=target.sites):
            yield run
    finally:
        run.splitter.undo_all()
        for handle in handles:
            handle.remove()
        run.release()
