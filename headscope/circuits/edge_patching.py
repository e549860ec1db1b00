"""Runs of the model in which only some edges carry their clean value (counterfactual ablation).

`Patched(target, graph, task, batch_size)`; `Patched.metric(kept)` is the task's mean metric when
only the edges `kept` marks (a boolean per edge, `Graph.edges()` order) are clean and every other
edge u -> r carries the corrupted run's value (`Patched.metrics([kept, ...])`: several circuits in
the same passes, each on its own copy of the batch); receiver r reads

    s_r + delta_r,   delta_r = -sum_{u dropped} (a_u - a_u^corrupted) = -dropped_r @ moved

with `dropped_r` `[names, upstream]` r's mask of dropped edges and `moved[u] = a_u - a_u^corrupted`
`[batch * pos * d_model]` (the sender's output in this pass minus the corrupted run's). How it
stays fast on a model of a few hundred senders:
- `moved[u]` is computed once per pass, when the first receiver that reads it runs, into one
  preallocated `[senders, batch, pos, d_model]` buffer (left unset where no receiver reads it);
- a receiver's delta is one matrix product of its mask's distinct rows, negated, with a run of
  that buffer (a view, no copy: the senders from the first to the last it drops from), written
  into a buffer reused by every receiver; identical rows of its mask (a head whose q, k and v
  all drop the same edges, every row of an empty circuit) are computed, and run through the
  attention block, once (`split_run` takes `(rows, which)`);
- consecutive receivers' products run as one (`_product_groups`, up to `ROWS_TOGETHER` rows):
  when the first of them reads, one product over the senders written so far gives each its
  share, and each adds its own product over the senders written since when it reads. A product
  of a few dozen rows is bound by reading `moved`, so two layers' rows cost little more than
  one's;
- where its distinct rows drop, or keep, only a few of its upstream senders (an MLP or the
  logits, one row; any receiver of a circuit that keeps almost everything or almost nothing),
  each row is summed from those senders alone instead: the dropped ones, or the running total
  of every upstream sender's `moved` (kept once per pass as the senders run) minus the kept
  ones, for a receiver whose upstream is every sender before it; unless that reads more than
  1 / `JOIN_RATIO` of its upstream, when its row joins its neighbours' product;
- a head block whose q, k and v come from its input through linear projections only
  (`receiver_grads.head_plans`, found once on the first batch) does not run on its copies: it
  runs on the stream once per round of heads whose projection columns do not overlap, each
  projection's output columns of the round's heads replaced by their copy times those weight
  rows (`split_run`'s `head_plans`); with grouped-query attention, a round per query head
  sharing a key/value head. Where the block's norm is an RMSNorm and the stream float32, a copy
  does not run the norm: its gain goes into those weight rows and the copy's per-row scale
  multiplies the product (`split_run`'s `norms`, checked against the module once per norm);
- a receiver that drops nothing reads the stream as it is;
- the LM head computes the logits at each prompt's answer position only
  (`headscope.circuits.target.read_positions`): the metric reads nothing else;
- the corrupted run's senders (and, for the kl metric, the clean run's logits at the answer
  positions) are kept between calls while they fit in `cache_bytes`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..errors import HeadscopeError
from .edges import Graph
from .receiver_grads import head_plans
from .target import Target, batches, output_logits, read_positions
from .stream_copies import _tiled, split_run

__all__ = ["Patched", "plain_senders", "sender_change", "CACHE_BYTES"]

CACHE_BYTES = 1 << 30  # the corrupted runs' senders kept between calls up to this size


def plain_senders(target: Target, graph: Graph, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """`(senders [S, batch, pos, d_model] in float32, logits)` of a plain pass on `inputs`."""
    with torch.no_grad(), split_run(target, graph) as run:
        logits = output_logits(target.model(**inputs, use_cache=False))
    return torch.stack([run.senders[i].detach().float() for i in range(len(graph.senders))]), logits


def sender_change(target: Target, graph: Graph, clean: dict, corrupted: dict,
                  positions: Optional[torch.Tensor] = None) -> tuple:
    """`(change [S, batch, pos, d_model] float32, clean logits, corrupted logits)`: every sender's
    corrupted output minus its clean one, added into one buffer as the two passes record them (no
    sender's output is kept beyond its own layer). With `positions` (`Target.inputs`'), the
    logits are computed there only (`read_positions`)."""
    buffer: list = []
    seen: set = set()

    def add(sign: float):
        def store(index: int, value: torch.Tensor) -> None:
            if not buffer:
                buffer.append(torch.zeros(len(graph.senders), *value.shape, dtype=torch.float32, device=value.device))
            buffer[0][index].add_(value.detach(), alpha=sign)
            seen.add((sign, index))
        return store

    logits = []
    with torch.no_grad():
        for inputs, sign in ((corrupted, 1.0), (clean, -1.0)):
            with split_run(target, graph, store=add(sign)), read_positions(target.model, positions) as head:
                logits.append(head.logits(target.model(**inputs, use_cache=False)))
    missing = [graph.senders[i][0] for i in range(len(graph.senders)) if (1.0, i) not in seen or (-1.0, i) not in seen]
    if missing:
        raise HeadscopeError(f"the model ran without writing {', '.join(missing[:3])}: its graph does not fit this run")
    return buffer[0], logits[1], logits[0]


SUM_MARGIN = 2  # a row sum reads a sender per call: chosen when it reads this many times fewer than the product


def _row_sums(rows: np.ndarray, upstream: np.ndarray, product: int) -> Optional[tuple]:
    """`(prefix, [(from_total, senders)])` per distinct row of a dropped mask `rows` `[C, upstream]`:
    the dropped senders, or (when `upstream` is the first senders, 0..prefix - 1) the kept ones
    to take from the running total, whichever is fewer; None when that reads more senders in
    all than `product` (the matrix product's run) / SUM_MARGIN."""
    prefix = len(upstream) if np.array_equal(upstream, np.arange(len(upstream))) else 0
    plan, reads = [], 0
    for row in rows:
        dropped, kept = upstream[row], upstream[~row]
        from_total = bool(prefix) and len(kept) < len(dropped)
        indices = kept if from_total else dropped
        plan.append((from_total, indices.tolist()))
        reads += len(indices)
    return (prefix if any(f for f, _ in plan) else 0, plan) if reads * SUM_MARGIN <= product else None


def _distinct_rows(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(rows, which)`: the distinct rows of a boolean `mask` in the order they first appear, and
    the one each row of `mask` is (`np.unique(mask, axis=0, return_inverse=True)` up to the
    rows' order, without its per-column record dtype: 25 ms of every patched run on SmolLM2)."""
    seen: dict = {}
    firsts, which = [], np.empty(len(mask), dtype=np.int64)
    for i, key in enumerate(np.packbits(mask, axis=1)):
        number = seen.setdefault(key.tobytes(), len(seen))
        if number == len(firsts):
            firsts.append(i)
        which[i] = number
    return mask[firsts], which


ROWS_TOGETHER = 64  # receivers' mask rows multiplied with the senders in one product, read once for all
JOIN_RATIO = 20  # a sender summed on its own costs about this many rows' share of a product's read of it


def _product_groups(graph: Graph, plans: dict) -> dict:
    """`{id(receiver): group}`: runs of consecutive receivers (the graph's order, the pass's) whose
    deltas come from one product, of at most `ROWS_TOGETHER` mask rows in all (a lone receiver is
    in no group). One product then gives every receiver of a run its share over the senders
    written when the run's first receiver reads: `moved`'s rows are read once instead of once per
    receiver, and a product of a few dozen rows is bound by reading them. A receiver whose rows
    would be summed from a few senders (an MLP's one row) joins a run where its sums would read
    more than 1 / `JOIN_RATIO` of its upstream: its row adds little to the run's product."""
    found, run, rows = {}, [], 0

    def close():
        if len(run) > 1 and any(plans[id(r)][4] is None for r in run):  # (some receiver's own product)
            group = tuple(run)
            found.update({id(r): group for r in group})

    for receiver in graph.receivers:
        plan = plans.get(id(receiver))
        if plan is None:
            continue
        sums = plan[4]
        if sums is not None and sum(len(indices) for _, indices in sums[1]) * JOIN_RATIO <= len(receiver.upstream):
            continue  # summed: cheaper than its share of a product
        if run and rows + len(plan[0]) > ROWS_TOGETHER:
            close()
            run, rows = [], 0
        run.append(receiver)
        rows += len(plan[0])
    close()
    return found


class Patched:
    """Measures the metric with some edges corrupted (module docstring)."""

    def __init__(self, target: Target, graph: Graph, task, batch_size: int, cache_bytes: int = CACHE_BYTES):
        self.target, self.graph, self.task = target, graph, task
        self.parts = batches(task.n, batch_size)
        self.cache_bytes = cache_bytes
        self.cached: dict = {}  # batch index -> (clean inputs, positions, reference logits or None, corrupted senders)
        self.spans = []  # per receiver: its slice of the edge mask
        start = 0
        for receiver in graph.receivers:
            width = len(receiver.names) * len(receiver.upstream)
            self.spans.append(slice(start, start + width))
            start += width
        self.n_edges = start
        self.head_plans: Optional[dict] = None  # found on the first batch, when a run first needs it
        self.norms: dict = {}  # the head blocks' norms applied inside their projection columns (`split_run`)

    def _batch(self, index: int, need_corrupted: bool):
        if index in self.cached:
            return self.cached[index]
        rows = self.task.subset(self.parts[index])
        clean, positions = self.target.inputs(rows, "clean")
        reference = None
        if self.task.metric == "kl":  # kept with the batch: the clean run's logits at the metric's positions only,
            # run as the patched runs are (a half-precision model's plain forward rounds differently)
            with torch.no_grad(), split_run(self.target, self.graph), \
                    read_positions(self.target.model, positions) as head:
                reference = self.target.aligned(head.logits(self.target.model(**clean, use_cache=False)))
        if not need_corrupted:
            return clean, positions, reference, None
        corrupted = plain_senders(self.target, self.graph, self.target.inputs(rows, "corrupted")[0])[0]
        held = sum(c[3].numel() * c[3].element_size() for c in self.cached.values())
        if held + corrupted.numel() * corrupted.element_size() <= self.cache_bytes:
            self.cached[index] = (clean, positions, reference, corrupted)
        return clean, positions, reference, corrupted

    def _plans(self, kept: np.ndarray) -> dict:
        """Per receiver that drops an edge: `(weights [C, hi - lo + 1] float, which [names], senders,
        lo, sums)`: the distinct rows of its dropped mask, negated, as weights over the senders
        lo..hi (a run of the `moved` buffer, so the product reads a view of it and is the delta),
        `which` the row each name reads, `senders` the ones some row drops (the only ones with a
        nonzero weight); `sums`, where adding a few senders per row reads fewer of them than the
        product, `(prefix, rows)`: each row as `(from_total, indices)`, minus the sum of `moved`
        over the dropped `indices` (from_total False), or the running total of the first `prefix`
        senders' `moved` (the receiver's whole upstream) minus the sum over the kept `indices`
        (True); else None."""
        plans = {}
        for receiver, span in zip(self.graph.receivers, self.spans):
            dropped = ~kept[span].reshape(len(receiver.names), len(receiver.upstream))
            if not dropped.any():
                continue
            rows, which = _distinct_rows(dropped)
            used = rows.any(axis=0)
            upstream = np.asarray(receiver.upstream)
            senders = upstream[used]
            lo, hi = int(senders.min()), int(senders.max())
            weights = torch.zeros(len(rows), hi - lo + 1)
            weights[:, torch.as_tensor(senders - lo)] = -torch.as_tensor(rows[:, used], dtype=torch.float32)
            plans[id(receiver)] = (weights, which.reshape(-1).tolist(), senders, lo, _row_sums(rows, upstream, hi - lo + 1))
        return plans

    def metric(self, kept: np.ndarray) -> float:
        """The task's mean metric with only `kept` edges clean."""
        return self.metrics([kept])[0]

    @torch.no_grad()
    def metrics(self, kept: list) -> list:
        """The task's mean metric with only `kept[j]` edges clean, for each circuit j, all of them in
        the same passes: each batch of prompts runs once with every circuit's copy of it side by side
        (`len(kept)` times the batch's rows), each copy's receivers reading that circuit's deltas.
        A circuit's metric equals its own run's (`metric`) up to float rounding."""
        kept = [np.asarray(k, dtype=bool) for k in kept]
        bad = next((k for k in kept if k.shape != (self.n_edges,)), None)
        if bad is not None:
            raise HeadscopeError(f"kept marks {bad.size} edges, the graph has {self.n_edges}")
        if not kept:
            return []
        plans = [self._plans(k) for k in kept]
        groups = [_product_groups(self.graph, plan) for plan in plans]  # the same for every batch
        copies = len(kept)
        totals = [0.0] * copies
        for index, part in enumerate(self.parts):
            clean, positions, reference, corrupted = self._batch(index, need_corrupted=any(plans))
            batch = part.stop - part.start
            if copies > 1:  # every circuit's copy of the batch, one after the other
                clean, positions = _tiled(clean, batch, copies), positions.repeat(copies)
            if any(plans) and self.head_plans is None:
                self.head_plans = head_plans(self.target, self.graph, clean)
            makers = [_Deltas(self.graph, plan, group, corrupted,
                              slice(j * batch, (j + 1) * batch) if copies > 1 else None) if plan else None
                      for j, (plan, group) in enumerate(zip(plans, groups))]
            with split_run(self.target, self.graph, _SideBySide(makers, batch),
                           head_plans=self.head_plans, norms=self.norms) as state, \
                    read_positions(self.target.model, positions) as head:  # (the metric reads no other logits)
                for maker in makers:
                    if maker is not None:
                        maker.state = state
                logits = self.target.aligned(head.logits(self.target.model(**clean, use_cache=False)))
            rows = self.task.subset(part)
            for j in range(copies):
                mine = logits[j * batch:(j + 1) * batch]
                totals[j] += float(rows.score(mine, reference=reference).double().sum())
        return [total / self.task.n for total in totals]


class _SideBySide:
    """`delta_for` of a pass over every circuit's copy of a batch (`Patched.metrics`): the one
    circuit's own deltas (`_Deltas.delta_for`), or the circuits' side by side along the batch:
    an MLP's (or the logits') in one buffer reused by every receiver (a receiver's delta is used
    up before the next one's is made), a head block's as `_Combined` rows."""

    def __init__(self, makers: list, batch: int):
        self.makers, self.batch = makers, batch
        self.buffer: Optional[torch.Tensor] = None

    def __call__(self, receiver):
        makers, batch = self.makers, self.batch
        if len(makers) == 1:
            return makers[0].delta_for(receiver) if makers[0] is not None else None
        own = [maker.delta_for(receiver) if maker is not None else None for maker in makers]
        if all(d is None for d in own):
            return None
        if receiver.kind == "heads":
            own = [d if d is None else (d if isinstance(d, tuple) else (d, list(range(len(d))))) for d in own]
            keys = [tuple(-1 if d is None else d[1][i] for d in own) for i in range(len(receiver.names))]
            combined: dict = {}
            which = [combined.setdefault(key, len(combined)) for key in keys]
            return _Combined([None if d is None else d[0] for d in own], list(combined), batch), which
        like = next(d for d in own if d is not None)
        shape = (1, len(makers) * batch, *like.shape[2:])
        if self.buffer is None or self.buffer.shape != shape or self.buffer.dtype != like.dtype:
            self.buffer = like.new_empty(shape)
        for j, d in enumerate(own):
            part = self.buffer[0, j * batch:(j + 1) * batch]
            if d is None:
                part.zero_()
            else:
                part.copy_(d[0])
        return self.buffer


class _Combined:
    """A head block's delta rows for every circuit's copy of a batch, side by side along the
    batch, without assembling them: row c is, for circuit j, `own[j][keys[c][j]]` (zero where
    the key is -1 or the circuit drops nothing there). `added_to(stream, c, out=)` writes
    `stream + row c` part by part (`headscope.circuits.stream_copies` reads them so);
    `dense()` assembles the rows."""

    def __init__(self, own: list, keys: list, batch: int):
        self.own, self.keys, self.batch = own, keys, batch

    def __len__(self) -> int:
        return len(self.keys)

    def _parts(self, c: int):
        for j, row in enumerate(self.keys[c]):
            yield slice(j * self.batch, (j + 1) * self.batch), (None if row < 0 else self.own[j][row])

    def added_to(self, stream: torch.Tensor, c: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        out = torch.empty_like(stream) if out is None else out
        for part, row in self._parts(c):
            if row is None:
                out[part] = stream[part]
            else:
                torch.add(stream[part], row.to(stream.dtype), out=out[part])
        return out

    def dense(self) -> torch.Tensor:
        like = next(o for o in self.own if o is not None)
        out = like.new_zeros((len(self.keys), len(self.keys[0]) * self.batch, *like.shape[2:]))
        for c in range(len(self.keys)):
            for part, row in self._parts(c):
                if row is not None:
                    out[c, part] = row
        return out


class _Deltas:
    """One circuit's deltas through one pass over one batch (`Patched.metrics`); `part` the rows
    of the pass that are this circuit's copy of the batch (None: all of them). `state`, the pass's
    `SplitRun`, is set once the pass starts."""

    def __init__(self, graph: Graph, plans: dict, groups: dict, corrupted: torch.Tensor, part: Optional[slice]):
        self.graph, self.plans, self.corrupted, self.part = graph, plans, corrupted, part
        self.state = None
        self.shape = corrupted.shape[1:]  # (B, T, D)
        self.moved = torch.empty_like(corrupted)  # (S, B, T, D); set as read
        self.ready = np.zeros(len(graph.senders), dtype=bool)
        self.running = [torch.zeros_like(self.moved[0]), 0]  # sum of moved[:count], count
        most = max(len(plan[0]) for plan in plans.values())
        # every delta is made here: a receiver's is used up (its copies made) before the next one's
        self.scratch = self.moved.new_empty((most, *self.shape))
        self.groups = groups  # `_product_groups`: id(receiver) -> its group, receivers in pass order
        widest = max((sum(len(plans[id(r)][0]) for r in g) for g in self.groups.values()), default=0)
        self.buffers = [self.moved.new_empty((widest, self.shape.numel())) for _ in range(2)] if self.groups else []
        self.group_of_buffer, self.group_counter, self.written_upto = [0, 0], 0, 0
        self.partial: dict = {}  # id(receiver) -> (its share of its group's product, senders then written,
        #                           the buffer holding it, the group number that wrote the buffer)

    def sender(self, u: int) -> torch.Tensor:
        value = self.state.senders[u]
        return value if self.part is None else value[self.part]

    def move(self, us) -> None:
        for u in us:
            if not self.ready[u]:
                torch.sub(self.sender(u).float(), self.corrupted[u], out=self.moved[u])
                self.ready[u] = True

    def summed(self, prefix, rows):
        """`[C, B, T, D]`: each row's -sum of moved over its dropped senders."""
        moved, running = self.moved, self.running
        if prefix:
            self.move(range(running[1], prefix))
            for u in range(running[1], prefix):
                running[0].add_(moved[u])
            running[1] = prefix
        out = self.scratch[:len(rows)]
        for row, (from_total, indices) in zip(out, rows):
            self.move(indices)
            if from_total:  # -(running total - kept) = kept - total
                torch.neg(running[0], out=row)
                for u in indices:
                    row.add_(moved[u])
            else:
                row.zero_()
                for u in indices:
                    row.sub_(moved[u])
        return out

    def set_run(self, first: int, stop: int) -> None:
        """Every sender first..stop - 1 of `moved` set (a weight 0 times an unset value could be
        NaN): moved where written, else 0 (not written yet in this pass, and so not dropped)."""
        for u in range(first, stop):
            if u in self.state.senders:
                self.move((u,))
            elif not self.ready[u]:
                self.moved[u].zero_()

    def product(self, receiver, weights, lo):
        """The receiver's delta by the product: its share of its group's product over the senders
        written when the group's first receiver ran, plus its own over the rest."""
        moved = self.moved
        group = self.groups.get(id(receiver))
        if group is not None and group[0] is receiver:
            self.start_group(group)
        held = self.partial.pop(id(receiver), None)
        stop = lo + weights.shape[1]
        if held is None or self.group_of_buffer[held[2]] != held[3]:  # alone (or its share overwritten)
            self.set_run(lo, stop)
            sources = moved[lo:stop].reshape(weights.shape[1], -1)  # a view
            return torch.mm(weights.to(moved.device), sources, out=self.scratch[:len(weights)].view(len(weights), -1))
        out, written, _, _ = held
        first = max(written, lo)
        if first < stop:  # the senders written since the group's product
            self.set_run(first, stop)
            out.addmm_(weights[:, first - lo:].to(moved.device), moved[first:stop].reshape(stop - first, -1))
        return out

    def start_group(self, group):
        """One product for every receiver of `group` over the senders written so far (read once
        for all of them), each receiver's share kept for its own call."""
        plans, moved = self.plans, self.moved
        while self.written_upto < len(self.graph.senders) and self.written_upto in self.state.senders:
            self.written_upto += 1
        written = self.written_upto
        first = min(plans[id(r)][3] for r in group)
        if written <= first:
            return
        stacked = torch.zeros(sum(len(plans[id(r)][0]) for r in group), written - first)
        offsets, at = [], 0
        for r in group:
            weights, lo = plans[id(r)][0], plans[id(r)][3]
            width = max(0, min(lo + weights.shape[1], written) - lo)
            stacked[at:at + len(weights), lo - first:lo - first + width] = weights[:, :width]
            offsets.append(at)
            at += len(weights)
        self.set_run(first, written)
        which = self.group_counter % 2  # two buffers: a group's shares last until its receivers ran
        self.group_counter += 1
        self.group_of_buffer[which] = self.group_counter
        out = self.buffers[which][:len(stacked)]
        torch.mm(stacked.to(moved.device), moved[first:written].reshape(written - first, -1), out=out)
        for r, offset in zip(group, offsets):
            self.partial[id(r)] = (out[offset:offset + len(plans[id(r)][0])], written, which, self.group_counter)

    def delta_for(self, receiver):
        plan = self.plans.get(id(receiver))
        if plan is None:
            return None
        weights, which, senders, lo, sums = plan
        if sums is not None and id(receiver) not in self.groups:
            delta = self.summed(*sums)
        else:
            delta = self.product(receiver, weights, lo)
        delta = delta.reshape(len(weights), *self.shape).to(self.sender(int(senders[0])).dtype)
        return (delta, which) if receiver.kind == "heads" else delta
