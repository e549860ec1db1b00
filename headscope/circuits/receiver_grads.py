"""Every receiver's gradient from one ordinary backward pass: no copy of the stream per receiver.

EAP's g_r (`headscope.circuits.eap`) is the gradient of the metric M with respect to a change
delta_r of receiver r's own copy of the residual stream; `stream_copies` takes that literally and
runs every receiver on its own copy. At delta = 0 every copy equals the stream s, so the chain
rule gives the same vector without the copies:

    g_r = J_r(s)^T dM/dy_r

with y_r what r makes of its copy and J_r the Jacobian of s -> y_r:
- a head's query, key or value (`a{L}.h{h}.q`, `.k`, `.v`): y_r is that head's q (k, v: its
  key/value head's, as this query head uses it: grouped-query keys and values are expanded to
  one per query head before the attention function) where the attention function receives it,
  after the norm, the projection, rotary and any q/k norm. dM/dy_r is the ordinary backward
  pass's gradient there, restricted to head h and to q (k, v); its product with J_r is a
  vector-Jacobian product through the block's own s -> (q, k, v), head by head
  (`torch.autograd.grad(..., is_grads_batched=True)`). Where every path from the
  block's input x to its q, k and v starts with a linear projection of x (`nn.Linear`, GPT-2's
  `Conv1D`: checked on the autograd graph, per block and pass), the product stops at the
  projections' outputs and crosses each projection as a product with only the weight rows a
  row's gradient is non-zero on (a head's own columns), heads whose columns do not overlap
  pulled back together (`_Plan`): the same sum without the other heads' zero terms, so a block
  costs about one projection's backward instead of 3 x H;
- a whole module (an MLP, the logits): y_r is its input, norm(s) or s itself, made a node of its
  own so that its gradient is this reader's alone (a parallel block's attention and MLP read
  the same norm output); the product goes back through the norm.

The forward pass keeps what a plain forward/backward pass keeps with the gradient taken at the
first layer's input and no weight's gradient (weights are held out of the graph while it runs);
what is added at any time is one head group's products.

`receiver_gradients(target, graph, inputs, metric_of, embed=None, heads_at_once=None, plans=None)`
yields `(receiver, names, g)`: `names` a slice of `receiver.names`, `g` `[len(names), batch,
pos, d_model]` float32, each gradient once; a receiver the metric does not reach is skipped.
`head_plans(target, graph, inputs)` gives the blocks' projection columns to patched runs
(`headscope.circuits.stream_copies`), which compute each head's q, k and v from its own copy
with them.
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Callable, Iterator, NamedTuple, Optional

import torch

from ..attention.kernel import expand_kv
from ..hf.route import Session, layer_map, routed
from .stream_copies import _first, _with_first
from .target import read_positions

__all__ = ["receiver_gradients", "head_plans", "HeadPlan"]


class _Inputs(Session):
    """Keeps what each receiver reads in one pass: every head's q, k and v (keys and values one
    per query head), each module receiver's own input node, the stream every norm read, each
    head block's input and the projections that read it."""

    def __init__(self, layer_of: dict):
        self.layer_of = layer_of
        self.qkv: dict = {}  # layer -> (q, k, v) `[batch, head, pos, d_head]`
        self.own: dict = {}  # id(receiver) -> its input, a node of its own
        self.read: dict = {}  # id(norm or block) -> the stream it read
        self.block_input: dict = {}  # id(block) -> its first input
        self.projections: dict = {}  # id(block) -> [(projection, its output)] of the projections reading it
        self.root: Optional[torch.Tensor] = None  # the first layer's input, where the pass's graph starts

    def edit_qkv(self, layer, q, k, v):
        n_heads = q.shape[1]
        self.qkv[layer] = (q, expand_kv(k, n_heads), expand_kv(v, n_heads))
        return self.qkv[layer]

    def keep_read(self, module, args, kwargs):
        self.read[id(module)] = _first(args, kwargs)

    def keep_block_input(self, module, args, kwargs):
        self.block_input[id(module)] = _first(args, kwargs)
        self.projections[id(module)] = []

    def keep_projection(self, block, module, args, output):
        if args and args[0] is self.block_input.get(id(block)) and isinstance(output, torch.Tensor) \
                and output.requires_grad:  # (a projection run without a gradient passes none on)
            self.projections[id(block)].append((module, output))

    def own_input(self, receiver, module, args, kwargs):
        given = _first(args, kwargs)
        self.own[id(receiver)] = mine = given.view_as(given)
        return _with_first(args, kwargs, mine)


def _batched_grad(outputs, inputs, rows):
    """`torch.autograd.grad` of `outputs` for every row of cotangents at once: a list, per input,
    of `[len(rows), *input.shape]` (None where the outputs do not depend on it)."""
    try:
        return list(torch.autograd.grad(outputs, inputs, grad_outputs=[torch.stack(r) for r in zip(*rows)],
                                        retain_graph=True, allow_unused=True, is_grads_batched=True))
    except RuntimeError:  # an operation without a batching rule: one row at a time
        singles = [torch.autograd.grad(outputs, inputs, grad_outputs=list(row), retain_graph=True, allow_unused=True)
                   for row in rows]
        return [None if found[0] is None else torch.stack(found) for found in zip(*singles)]


def _weight_rows(module, output: torch.Tensor, given: torch.Tensor) -> Optional[torch.Tensor]:
    """The projection's weight as `[out, in]` (output = given @ W.T + b), None if it is not a
    plain linear map of that shape (a quantised or adapted layer)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    shape = (output.shape[-1], given.shape[-1])
    if isinstance(module, torch.nn.Linear) and tuple(weight.shape) == shape:
        return weight.detach()
    if type(module).__name__ == "Conv1D" and tuple(weight.shape) == shape[::-1]:  # GPT-2's: given @ W + b
        return weight.detach().t()
    return None


def _only_through(ys, stops, given: torch.Tensor, root: torch.Tensor, most: int = 4096) -> bool:
    """Whether every path of the autograd graph from `ys` towards the pass's `root` (the first
    layer's input) passes through one of the nodes `stops` before reaching `given`: the projections
    are the whole way in. Paths to weights (leaves other than `root`) do not matter."""
    bad = given.grad_fn
    if bad is None:
        return False
    seen: set = set()
    todo = [y.grad_fn for y in ys]
    while todo:
        node = todo.pop()
        if node is None or node in stops or node in seen:
            continue
        if node is bad or len(seen) > most:
            return False
        seen.add(node)
        if getattr(node, "variable", None) is root:  # the input embeddings, reached around the projections
            return False
        todo.extend(n for n, _ in node.next_functions if n is not None)
    return True


def _columns(mask: torch.Tensor):
    """The indices where `mask` is True: a slice when they run consecutively."""
    columns = mask.nonzero().squeeze(1)
    first, last = int(columns[0]), int(columns[-1]) + 1
    return slice(first, last) if last - first == len(columns) else columns


def _direct_path(kept: "_Inputs", block, ys) -> Optional[tuple]:
    """`(outputs, weights)` of the block's projections (`_weight_rows`) when every path from its
    input to `ys` starts with one of them (`_only_through`), else None."""
    given = kept.block_input[id(block)]
    projections = kept.projections.get(id(block), [])
    weights = [_weight_rows(module, output, given) for module, output in projections]
    outputs = [output for _, output in projections]
    if not projections or any(w is None for w in weights) or not all(y.requires_grad for y in ys) or \
            not _only_through(ys, {output.grad_fn for output in outputs}, given, kept.root):
        return None
    return outputs, weights


class _Plan:
    """How a head block's q, k and v gradients cross its projections, found once per block.

    `support[part][h]`: per projection, the output columns where head h's q (part 0), k (1) or
    v (2) gradient can be non-zero, read off one pull-back of random gradients, head by head.
    `rounds[part]`: the heads in groups whose supports do not overlap; one pull-back of a
    group's gradients together then holds each head's own on its own columns (a vector-Jacobian
    product is linear in the gradient). Heads whose paths mix (a q/k norm over all heads)
    overlap everywhere and get a round each.
    """

    def __init__(self, ys, outputs, n_heads: int):
        self.support = [[None] * n_heads for _ in range(3)]
        self.rounds = [[] for _ in range(3)]
        for part in range(3):
            probe = torch.randn_like(ys[part])
            rows = [(_only_head(probe, h),) for h in range(n_heads)]
            found = _batched_grad([ys[part]], outputs, rows)
            nonzero = [None if f is None else f.reshape(n_heads, -1, f.shape[-1]).ne(0).any(dim=1) for f in found]
            taken = []  # per round: per projection, the columns its heads hold
            for h in range(n_heads):
                marks = [None if m is None or not m[h].any() else m[h] for m in nonzero]
                if all(m is None for m in marks):
                    continue
                self.support[part][h] = [None if m is None else _columns(m) for m in marks]
                for number, held in enumerate(taken):
                    if not any(m is not None and c is not None and (m & c).any() for m, c in zip(marks, held)):
                        self.rounds[part][number].append(h)
                        taken[number] = [c if m is None else m if c is None else m | c for m, c in zip(marks, held)]
                        break
                else:
                    self.rounds[part].append([h])
                    taken.append(marks)


def _graph_pass(target, graph, inputs: dict, metric_of: Optional[Callable], embed: Optional[Callable] = None,
                positions: Optional[torch.Tensor] = None):
    """`(kept, metric)`: one forward pass with a graph from the first layer's input (weights held
    out of it), keeping what every receiver reads (`_Inputs`); `metric_of(logits)` or None. With
    `positions`, the logits are computed there only (`read_positions`)."""
    model = target.model
    kept = _Inputs(layer_map(model, target.sites))

    def mixed_embedding(module, args, output):
        return embed(output)

    def root(module, args, kwargs):  # the graph starts at the stream's start, as a plain backward's does
        kept.root = _first(args, kwargs).detach().requires_grad_(True)
        return _with_first(args, kwargs, kept.root)

    with ExitStack() as hooks:
        def hook(handle):
            hooks.callback(handle.remove)

        for param in [p for p in model.parameters() if p.requires_grad]:  # no weight's gradient is wanted
            param.requires_grad_(False)
            hooks.callback(param.requires_grad_, True)
        first = dict(model.named_modules())[graph.parts.layers[0][1]]
        hook(first.register_forward_pre_hook(root, with_kwargs=True))

        for receiver in graph.receivers:
            if receiver.norm is not None:
                hook(receiver.norm.register_forward_pre_hook(kept.keep_read, with_kwargs=True))
            if receiver.kind == "heads":
                block = receiver.module
                hook(block.register_forward_pre_hook(kept.keep_block_input, with_kwargs=True))
                for inner in block.modules():
                    if inner is not block and (isinstance(inner, torch.nn.Linear) or type(inner).__name__ == "Conv1D"):
                        hook(inner.register_forward_hook(
                            lambda module, args, output, b=block: kept.keep_projection(b, module, args, output)))
            else:
                hook(receiver.module.register_forward_pre_hook(
                    lambda module, args, kwargs, r=receiver: kept.own_input(r, module, args, kwargs), with_kwargs=True))
        if embed is not None:
            hook(model.get_input_embeddings().register_forward_hook(mixed_embedding))
        hooks.enter_context(torch.enable_grad())
        hooks.enter_context(routed(model, kept))
        head = hooks.enter_context(read_positions(model, positions if metric_of is not None else None))
        logits = head.logits(model(**inputs, use_cache=False))
        return kept, (metric_of(logits) if metric_of is not None else None)


class HeadPlan(NamedTuple):
    """A head block's way through its projections (`head_plans`): `plan` (`_Plan`, every part
    found) and `projections` `[(module, weight [out, in], bias or None)]`."""

    plan: "_Plan"
    projections: list


def head_plans(target, graph, inputs: dict) -> dict:
    """`{id(block): HeadPlan}` of every head block whose q, k and v come from its input through
    linear projections only (checked on the autograd graph of one pass on `inputs`), each head's
    columns found; blocks where they do not are left out."""
    kept, _ = _graph_pass(target, graph, inputs, None)
    found = {}
    for receiver in graph.receivers:
        if receiver.kind != "heads" or receiver.layer not in kept.qkv:
            continue
        block, ys = receiver.module, kept.qkv[receiver.layer]
        direct = _direct_path(kept, block, ys)
        if direct is None:
            continue
        outputs, weights = direct
        modules = [module for module, _ in kept.projections[id(block)]]
        biases = [None if getattr(m, "bias", None) is None else m.bias.detach() for m in modules]
        found[id(block)] = HeadPlan(_Plan(ys, outputs, ys[0].shape[1]), list(zip(modules, weights, biases)))
    return found


def receiver_gradients(target, graph, inputs: dict, metric_of: Callable, embed: Optional[Callable] = None,
                       heads_at_once: Optional[int] = None, plans: Optional[dict] = None,
                       positions: Optional[torch.Tensor] = None) -> Iterator[tuple]:
    """See the module docstring. `metric_of(logits)` is the scalar to differentiate; `embed(e)`
    replaces the input embedding's output (EAP-IG's interpolation); `heads_at_once` heads' rows
    (3 each) cross the norm together (default: one head's at a time, the least memory);
    `plans` keeps each block's `_Plan` between passes of the same graph (default: found again);
    `positions` (`Target.inputs`'), where the metric reads the logits: the LM head computes
    them there only (`headscope.circuits.target.read_positions`)."""
    plans = {} if plans is None else plans
    kept, metric = _graph_pass(target, graph, inputs, metric_of, embed, positions)

    wanted, where = [], {}
    for receiver in graph.receivers:
        ys = kept.qkv.get(receiver.layer) if receiver.kind == "heads" else (kept.own.get(id(receiver)),)
        if ys is None or any(y is None or not y.requires_grad for y in ys):
            continue
        where[id(receiver)] = (len(wanted), ys)
        wanted.extend(ys)
    grads = list(torch.autograd.grad(metric, wanted, retain_graph=True, allow_unused=True)) if wanted else []
    del metric
    shape = _shape(inputs, target)
    for receiver in graph.receivers:
        if id(receiver) not in where:
            continue
        start, ys = where[id(receiver)]
        dy = grads[start:start + len(ys)]
        grads[start:start + len(ys)] = [None] * len(ys)  # each gradient freed once used
        if all(d is None for d in dy):
            continue
        dy = [torch.zeros_like(y) if d is None else d for y, d in zip(ys, dy)]
        if receiver.kind != "heads":
            stream = kept.read[id(receiver.norm)] if receiver.norm is not None else None
            g = dy[0] if stream is None else torch.autograd.grad(ys[0], stream, dy[0], retain_graph=True,
                                                                  allow_unused=True)[0]
            if g is not None:
                yield receiver, slice(0, 1), g.detach().float().reshape(1, *shape)
            continue
        yield from _head_gradients(receiver, kept, ys, dy, shape, heads_at_once, plans)


def _through_norm(norm, stream: torch.Tensor, given: torch.Tensor, rows: torch.Tensor) -> Optional[torch.Tensor]:
    """`rows` `[rows, *given.shape]`, gradients at the norm's output `given`, pulled back to its
    input `stream`: the norm's vector-Jacobian product mapped over the rows (`torch.func`), or
    the autograd graph's, row by row, where the norm does not map."""
    try:
        _, pull = torch.func.vjp(norm, stream.detach())
        found, = torch.func.vmap(pull)(rows)
        return found
    except Exception:  # a norm torch.func cannot map: the pass's own graph
        return _batched_grad([given], [stream], [(row,) for row in rows])[0]


def _head_gradients(receiver, kept: _Inputs, ys, dy, shape, heads_at_once: Optional[int],
                    plans: dict) -> Iterator[tuple]:
    """A head block's receivers: its q, k and v gradients pulled back to the stream it reads."""
    block = receiver.module
    given = kept.block_input[id(block)]
    stream = kept.read[id(receiver.norm)] if receiver.norm is not None else given
    direct = _direct_path(kept, block, ys)
    n_heads = ys[0].shape[1]
    step = heads_at_once or 1
    if direct:
        outputs, weights = direct
        plan = plans.get(id(block))
        if plan is None:
            plan = plans[id(block)] = _Plan(ys, outputs, n_heads)
        at_input = torch.zeros((3 * n_heads, *given.shape), dtype=given.dtype, device=given.device)
        flat = at_input.view(3 * n_heads, -1, given.shape[-1])
        for part in range(3):
            for heads in plan.rounds[part]:
                wanted = torch.zeros_like(dy[part])
                wanted[:, heads] = dy[part][:, heads]
                found = torch.autograd.grad([ys[part]], outputs, [wanted], retain_graph=True, allow_unused=True)
                for h in heads:
                    for grad, weight, columns in zip(found, weights, plan.support[part][h]):
                        if grad is not None and columns is not None:
                            flat[3 * h + part] += grad.reshape(flat.shape[1], -1)[:, columns] @ weight[columns]
    # (3 x H, batch, pos, d_model): every row, so that the scores take them in one product; a float32
    # block's rows at its input take their own values at the stream in place
    out = at_input if direct and at_input.dtype == torch.float32 and tuple(at_input.shape[1:]) == tuple(shape) \
        else None
    for first in range(0, n_heads, step):
        heads = range(first, min(n_heads, first + step))
        if direct:
            rows = at_input[3 * heads.start:3 * heads.stop]
            g = rows if stream is given else _through_norm(receiver.norm, stream, given, rows)
        else:
            rows = [tuple(_only_head(dy[j], h) if j == part else torch.zeros_like(dy[j]) for j in range(3))
                    for h in heads for part in range(3)]  # the head's q, k and v rows, in `receiver.names` order
            g = _batched_grad(ys, [stream], rows)[0]
        if g is not None:
            if out is None:
                out = torch.zeros((3 * n_heads, *shape), dtype=torch.float32, device=g.device)
            out[3 * heads.start:3 * heads.stop] = g.detach().reshape(3 * len(heads), *shape)
        elif out is not None:  # the stream does not reach these rows
            out[3 * heads.start:3 * heads.stop] = 0.0
    if out is not None:
        yield receiver, slice(0, 3 * n_heads), out.detach()


def _only_head(grad: torch.Tensor, head: int) -> torch.Tensor:
    out = torch.zeros_like(grad)
    out[:, head] = grad[:, head]
    return out


def _shape(inputs: dict, target) -> tuple:
    """`(batch, pos, d_model)` of a receiver's gradient (a norm may hold the stream as flat rows)."""
    ids = inputs["decoder_input_ids" if target.two_inputs else "input_ids"]
    return ids.shape[0], ids.shape[1], target.d_model
