"""Running one built probe through a model, every detector of the probe reducing each layer.

- `collect(loaded, probe, detectors, batch_size, ...)`: `Passes` (each detector's `Collected`, how
  the patterns were computed, the layers with sink logits, the lazy path's kernels).
  Batches run inside `capture(reduce=...)`; each layer's pattern goes to every detector's
  `reduce(layer, pattern, batch)` with the batch it was computed on, and only what the
  reducers return is kept (on the CPU). When every detector is `lazy` the layer runs the fused
  kernel and the reducers get a `LazyPattern`; otherwise each layer's map is computed, a group
  of heads at a time when it would exceed `MAP_BUDGET`.
- `collect_with_control(loaded, twin, probe, detectors, batch_size, timings, ...)`: the model's
  `Passes` and the control twin's values (None: no twin), each pass timed; what `analyze` and
  `run_syntax` run.
- `collect(..., explorer=(n, length))` also keeps, from the same pass, the maps of the probe's
  first n examples cut to `length` tokens (the report's head explorer) where a causal model's
  pass holds them (`Passes.explorer`); `analyze` otherwise runs a short pass for them.
- `Timings`: seconds per named step, `with timings.step("ov"): ...`, one place for the clock.
- Under torchrun the batches are dealt across processes and the results gathered in order
  (`headscope.loading.distributed`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import NamedTuple, Optional

import torch

from ..loading.distributed import gather, mine, rank_and_size
from ..loading import heap
from ..loading.heap import return_freed_heap
from ..loading.integrity import check_hidden_states
from ..hf.capture import capture, stack_layers
from ..errors import HeadscopeError
from ..probes.copy import Seq2SeqBatch
from .protocol import Collected, Progress

__all__ = ["collect", "collect_with_control", "Passes", "Timings", "Progress", "MAP_BUDGET"]

MAP_BUDGET = 256 * 2**20  # bytes of fp32 pattern computed at once before heads go in groups


class Passes(NamedTuple):
    """What one probe's passes through a model left."""

    values: dict  # detector name -> Collected
    how: str  # "lazy", "maps" or "maps, N heads at a time"
    sink_layers: list  # layers whose heads have learned sink logits
    kernels: list  # what computed the lazy path's row log-sum-exp (`lse_kernel`); [] for maps
    not_run: tuple = ()  # attention layers that never ran on the probe (mllama's cross-attention without an image)
    explorer: Optional[torch.Tensor] = None  # [example, layer, head, query, key] the first examples' maps, or None



class Timings:
    """Seconds spent per named step, since the clock started (`total()`)."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str):
        """Time the block and add it to `name` (a step timed twice accumulates); a block that
        raises is not counted."""
        start = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def total(self) -> None:
        """Set "total" to the seconds since the clock started (again after a later step)."""
        self.seconds["total"] = time.perf_counter() - self.started

    def rounded(self) -> dict[str, float]:
        return {name: round(value, 3) for name, value in self.seconds.items()}

EXPLORER = "explorer maps"  # the reducers' key for the explorer examples' maps (no detector's name)
TRIM_EVERY = 6  # heap not held: at least this many layer reductions between two returns of the freed heap
TRIM_TOKENS = 6 * 4096  # and at least this many tokens through them (each reduction's batch x queries, summed)
HELD_CHECK_TOKENS = 4096  # heap held: tokens through the reductions between two reads of its free bytes


def _head_chunk(batch: int, length: int, n_heads: int, budget: int = MAP_BUDGET) -> Optional[int]:
    """Heads per group so one group's map stays under `budget` bytes (None: all heads at once)."""
    per_head = batch * length * length * 4
    chunk = max(1, budget // per_head)
    return None if chunk >= n_heads else int(chunk)


class _Reducers:
    """The capture reducer: every detector's `reduce` on the batch now running, moved once per
    device (with a device map each layer has its own)."""

    def __init__(self, detectors):
        self.detectors = detectors
        self.batch = None
        self.on: dict = {}
        self.calls = self.tokens = 0  # reductions and their tokens since the heap was last given back
        self.free_limit: Optional[int] = None  # held heap: the free bytes kept (set at the pass's first reading)

    def start(self, batch, explorer_rows=None, explorer_len: int = 0) -> None:
        """The batch the next layers run on; `explorer_rows` (indices into it) are the examples
        whose maps, cut to `explorer_len` tokens, each layer also keeps."""
        self.batch, self.on = batch, {}
        self.explorer_rows, self.explorer_len = explorer_rows, explorer_len

    def __call__(self, layer, pattern, attention_mask) -> dict:
        device = pattern.device
        if device not in self.on:
            self.on[device] = self.batch.to(device)
        reduced = {det.name: det.reduce(layer, pattern, self.on[device]).cpu() for det in self.detectors}
        if self.explorer_rows is not None:
            reduced[EXPLORER] = _corner(pattern, self.explorer_rows, self.explorer_len).cpu()
        self._give_back_heap()
        return reduced

    def _give_back_heap(self) -> None:
        """After a layer's reductions: give freed heap back where it has grown too large.

        Held (`headscope.loading.heap.heap_held`): when the heap's free bytes pass
        `held_free_limit` of what was free at the pass's first reading; a pass's own
        temporaries stay for the next layer, fragmentation beyond them goes back. The free bytes
        are read once HELD_CHECK_TOKENS tokens have gone through the reductions since the last
        reading (each reading walks the heap's free blocks: up to 1 ms), so a treebank's small
        batches read them every few layers.
        Not held (glibc before 2.33, a process with its own MALLOC_* settings): the layers'
        temporaries are mostly below glibc's self-raising mmap threshold, so freed they stay in
        the heap; fragmented, they can make the process grow layer over layer (up to +300 MiB
        over SmolLM2's plain forward at 1024 x 4). Given back every TRIM_EVERY layers, the
        growth stays within a few layers' temporaries; each return costs the pages the next
        layers fault in again (after every layer: +0.7 s on that forward's 8 s). Small batches
        (a treebank's sentences) must also have run TRIM_TOKENS tokens, which spares them a
        return every few layers (each a walk over the heap: 1.8 ms, 0.35 s of a 7.8 s pass).
        """
        self.calls += 1
        self.tokens += self.batch.input_ids.numel()
        if heap.holding():
            if self.tokens < HELD_CHECK_TOKENS:
                return
            self.calls = self.tokens = 0
            free = heap.free_heap_bytes()
            if self.free_limit is None:
                self.free_limit = heap.held_free_limit(free)
            elif free > self.free_limit:
                return_freed_heap()
            return
        if self.calls >= TRIM_EVERY and self.tokens >= TRIM_TOKENS:
            return_freed_heap()
            self.calls = self.tokens = 0


def _corner(pattern, rows: torch.Tensor, length: int) -> torch.Tensor:
    """`[len(rows), head, length, length]` fp32: the map of examples `rows` on their first
    `length` queries and keys (a `LazyPattern` computes only that corner)."""
    if isinstance(pattern, torch.Tensor):
        return pattern[rows.to(pattern.device), :, :length, :length].float()
    return pattern.corner(rows, length)


def _explorer_rows(loaded, probe, batches, explorer) -> tuple[Optional[dict], int]:
    """`({batch index: rows}, length)`: the rows of the batches holding the explorer's examples
    (`probe.explorer_ids(n, length)`) and their length, when this pass's maps are theirs: a
    causal model with one input, so the map of an example's first `length` tokens does not depend
    on the tokens after them, and the batches hold each example's tokens unpadded at its start,
    in order. `(None, 0)` otherwise (or nothing asked)."""
    if not explorer or not explorer[0] or not loaded.causal or loaded.two_inputs:
        return None, 0
    ids = probe.explorer_ids(*explorer)
    if ids is None or not len(ids):
        return None, 0
    length, wanted, seen = ids.shape[1], {}, 0  # seen: examples in the batches before this one
    for index, batch in enumerate(batches):
        if seen >= len(ids):
            break
        if isinstance(batch, Seq2SeqBatch) or batch.input_ids.shape[1] < length:
            return None, 0
        rows = range(min(batch.input_ids.shape[0], len(ids) - seen))
        for row in rows:
            if not (torch.equal(batch.input_ids[row, :length].cpu(), ids[seen + row].cpu())
                    and bool(batch.attention_mask[row, :length].all())):
                return None, 0
        wanted[index] = torch.tensor(list(rows))
        seen += batch.input_ids.shape[0]
    return (wanted, length) if seen >= len(ids) else (None, 0)


@torch.no_grad()
def collect(loaded, probe, detectors, batch_size: int, progress: Optional[Progress] = None, lazy: bool = True,
            stage: Optional[str] = None, map_budget: int = MAP_BUDGET, explorer: Optional[tuple] = None):
    """Every detector's reduced values over a built probe's batches.

    Args:
        loaded: a `Loaded` model (or the control twin).
        probe: a built probe (`ProbeSet`, `TreebankSet`).
        detectors: the detectors reading this probe.
        batch_size: examples per forward pass.
        progress: `fn(stage, done, total)` as batches finish.
        lazy: allow the fused kernel when every detector is lazy.
        stage: the progress stage (default "probe NAME").
        map_budget: on the maps path, the bytes of fp32 pattern one layer may compute at once;
            a layer whose map is larger runs in head groups.
        explorer: `(n, length)`: also keep the maps of the probe's first n examples cut to
            `length` tokens, where this pass holds them (`Passes.explorer`; None when not).
    Returns:
        `Passes`.
    """
    batches = probe.batches(batch_size, loaded.causal, "cpu")
    todo = [i for i in range(len(batches)) if mine(i)]
    report = progress if rank_and_size()[0] == 0 else None
    stage = stage or f"probe {probe.name}"
    if report:
        report(stage, 0, len(todo))
    lazy = lazy and all(d.lazy for d in detectors)
    longest = max((b.input_ids.shape for b in batches), key=lambda shape: shape[0] * shape[1] ** 2, default=None)
    chunk = _head_chunk(longest[0], longest[1], loaded.n_heads, map_budget) if longest is not None and not lazy else None
    if loaded.two_inputs and not (batches and isinstance(batches[0], Seq2SeqBatch)):
        raise HeadscopeError(f"the {probe.name} probe gives one input, but {loaded.sites} sites read an encoder's and a "
                             f"decoder's: build it through headscope.probes.copy")
    reducers = _Reducers(detectors)
    shown, shown_len = _explorer_rows(loaded, probe, batches, explorer)
    done = []
    kind = loaded.site_kind
    entropy = lazy and any(d.row_entropy for d in detectors)
    with heap.heap_held(), capture(loaded.model, reduce=reducers, chunk_heads=chunk, lazy=lazy, sites=loaded.sites,
                                   entropy=entropy) as cap:
        for n, i in enumerate(todo):
            batch = batches[i]
            two = isinstance(batch, Seq2SeqBatch)  # an encoder-decoder's batch: both inputs, the site's view
            reducers.start(batch.for_site(kind) if two else batch, shown.get(i) if shown else None, shown_len)
            inputs = batch.model_inputs(loaded.device) if two else {
                "input_ids": batch.input_ids.to(loaded.device),
                "attention_mask": batch.attention_mask.long().to(loaded.device)}
            out = loaded.probe_pass(**inputs)
            _check_finite(loaded, out, inputs, f"{stage}, batch {i + 1} of {len(batches)}")
            done.append((i, {layer: results.pop() for layer, results in cap.results.items()}))
            if report:
                report(stage, n + 1, len(todo))
    per_batch = gather(done)  # [{layer: {detector: values}}] in batch order
    maps = _explorer_maps(loaded, per_batch) if shown else None
    how = "lazy" if lazy else ("maps" if chunk is None else f"maps, {chunk} heads at a time")
    sink_layers = sorted(layer for layer, extras in cap.extras.items() if "sinks" in extras)
    kernels = sorted({e.split(":", 1)[1] for extras in cap.extras.values() for e in extras if e.startswith("lse:")})
    ran = tuple(layer for layer in loaded.attention_layers if all(layer in b for b in per_batch))
    collected = {det.name: Collected(batches, [{layer: b[layer][det.name] for layer in ran} for b in per_batch],
                                     loaded.n_layers, loaded.n_heads, ran) for det in detectors}
    return Passes(collected, how, sink_layers, kernels, tuple(sorted(set(loaded.attention_layers) - set(ran))), maps)


def _explorer_maps(loaded, per_batch: list) -> Optional[torch.Tensor]:
    """`[example, layer, head, query, key]` the explorer maps the reducers kept (taken out of
    `per_batch`), in batch order, stacked over layers as `headscope.analysis.explorer.explorer_maps`
    stacks its own (`stack_layers`)."""
    pieces: dict = {}
    for results in per_batch:
        for layer, values in results.items():
            if EXPLORER in values:
                pieces.setdefault(layer, []).append(values.pop(EXPLORER))
    if not pieces:
        return None
    return stack_layers({layer: torch.cat(maps) for layer, maps in pieces.items()}, loaded.n_layers)


def _check_finite(loaded, out, inputs: dict, where: str) -> None:
    """HeadscopeError when the batch's last hidden state is NaN or inf at a real token; the batch
    then runs once more with every layer's output kept, to name the layer it started in. (An
    encoder-decoder's last hidden state is its decoder's, read at the decoder's real tokens.)"""
    last = getattr(out, "last_hidden_state", None)
    mask = inputs.get("decoder_attention_mask", inputs["attention_mask"])
    if last is None or torch.isfinite(last[mask.bool()]).all():
        return
    again = loaded.probe_pass(**inputs, output_hidden_states=True)
    check_hidden_states(getattr(again, "decoder_hidden_states", None) or again.hidden_states, mask.bool(), where)
    raise HeadscopeError(f"non-finite activations (NaN or inf) in the model's output on {where}")


def collect_with_control(loaded, twin, probe, detectors, batch_size: int, timings, progress: Optional[Progress] = None,
                         lazy: bool = True, stage: Optional[str] = None, map_budget: int = MAP_BUDGET,
                         explorer: Optional[tuple] = None):
    """`collect` on the model, then on the control twin.

    Args:
        loaded, probe, detectors, batch_size, progress, lazy, map_budget, explorer: as for
            `collect` (the explorer's maps are the model's, not the twin's).
        twin: the control `Loaded`, or None.
        timings: a `Timings`; the passes count as "probe_NAME" and
            "probe_NAME_control".
        stage: the progress stage (default "probe NAME"; the twin's is "STAGE (control)").
    Returns:
        `(the model's Passes, the twin's values ({} without a twin))`.
    """
    stage = stage or f"probe {probe.name}"
    with timings.step(f"probe_{probe.name}"):
        passes = collect(loaded, probe, detectors, batch_size, progress, lazy, stage=stage, map_budget=map_budget,
                         explorer=explorer)
    twin_values = {}
    if twin is not None:
        with timings.step(f"probe_{probe.name}_control"):
            twin_values = collect(twin, probe, detectors, batch_size, progress, lazy, stage=f"{stage} (control)",
                                  map_budget=map_budget).values
    return passes, twin_values
