"""Edge attribution patching (EAP, EAP-IG): every edge of a circuit's graph scored.

An edge u -> r is the part of receiver r's input that sender u wrote (`headscope.circuits.edges`).
Its score estimates the change of the task's metric M (summed over prompts, then divided by their
number) when that one edge carries the corrupted run's value instead of the clean one:

    score(u -> r) = (1 / n) sum_b (a_u^corrupted - a_u^clean) . g_r

with a_u the sender's output at every position and g_r the gradient of M with respect to r's
own copy of the residual stream (`headscope.circuits.stream_copies` runs the copies literally;
the scores take the same gradients from one ordinary backward pass,
`headscope.circuits.receiver_grads`):
- "eap" (Syed et al. 2023, arXiv 2310.10348): g_r on the clean run. Two forward passes (clean and
  corrupted activations) and one forward/backward pair.
- "eap-ig" (Hanna et al. 2024, arXiv 2403.17806): integrated gradients along the straight path
  from the corrupted to the clean input embeddings, g_r = (1 / S) sum_k dM/dr at the embeddings
  e_corrupted + (k / S)(e_clean - e_corrupted), S = `steps`. `riemann="left"` (the default)
  takes k = 0..S-1, starting at the corrupted run, as the EAP-IG code does (`get_scores_eap_ig`
  of Hanna et al.'s repository; MIB's "EAP-IG-inputs"); `riemann="right"` takes k = 1..S,
  ending at the clean run (so S = 1 is EAP). Two forward passes and S forward/backward pairs.
The scores are means over prompts of per-prompt scores, which `score_edges` keeps as well
(`Circuit.stability` resamples them); the prompts go through in micro-batches sized to a memory
budget (`micro_batch`, `scoring_bytes`), each pass's scores added as it ends. After the first
forward/backward pair the whole run is estimated from its time (`check_estimate`): over an hour
is warned about, over a day refused.

The KL metric (`-KL(p_clean || p)`) has a gradient of exactly 0 at the clean run, so EAP, and
EAP-IG with S = 1 on the right rule, would score every edge 0: they are refused in one line.

Faithfulness, measured by running the model with only some edges clean, is
`headscope.circuits.faithfulness`'s.
"""
from __future__ import annotations

import time
import warnings
from typing import Optional

import numpy as np
import torch

from ..checks import check_count
from ..errors import HeadscopeError, HeadscopeWarning, UsageError
from .edge_patching import sender_change
from .edges import Graph
from .receiver_grads import receiver_gradients
from .target import Target, batches, output_logits

__all__ = ["score_edges", "METHODS", "CIRCUIT_METHODS", "RIEMANN", "integration_points", "check_estimate",
           "WARN_SECONDS", "MAX_SECONDS", "scoring_bytes", "memory_budget", "micro_batch", "GRAPH_FLOATS"]

METHODS = ("eap", "eap-ig")
CIRCUIT_METHODS = METHODS  # the name the package exports (attribution has METHODS of its own)


def _embedding_of(model, inputs: dict) -> torch.Tensor:
    """What the input embedding module outputs for `inputs` (before anything else sees it)."""
    seen = {}
    handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: seen.setdefault("e", out.detach()))
    try:
        ids = inputs["decoder_input_ids"] if "decoder_input_ids" in inputs else inputs["input_ids"]
        model.get_input_embeddings()(ids)
    finally:
        handle.remove()
    return seen["e"]


def score_edges(target: Target, graph: Graph, task, method: str = "eap-ig", steps: int = 5, batch_size: int = 8,
                progress=None, riemann: str = "left", max_memory: Optional[int] = None
                ) -> tuple[np.ndarray, dict, dict, np.ndarray]:
    """`(scores, passes, metrics, per_prompt)`: every edge's score (module docstring) in
    `graph.edges()` order, the passes spent (over all prompts), the clean and corrupted runs' mean
    metrics, and the per-prompt scores `[n, edges]` (float32) whose mean is `scores`.

    Prompts go through in micro-batches of at most `batch_size`, fewer where `scoring_bytes`
    says they would not fit in `max_memory` bytes (default: `memory_budget`)."""
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    steps, points = integration_points(method, steps, riemann)
    if task.metric == "kl" and points == [1.0]:
        what = "EAP" if method == "eap" else "EAP-IG with one step on the right rule"
        raise UsageError(f"{what} takes the gradient at the clean run only, where the kl metric's gradient is exactly "
                         f"0, so every score would be 0: use method='eap-ig' (its left rule starts at the corrupted "
                         f"run) or another metric")
    model = target.model
    per_prompt = {id(r): torch.zeros(task.n, len(r.names), len(r.upstream), dtype=torch.float64)
                  for r in graph.receivers}
    metrics = {"clean": 0.0, "corrupted": 0.0}
    parts = batches(task.n, micro_batch(target, graph, task, batch_size, max_memory))
    plans: dict = {}  # each head block's way through its projections, found in the first pass
    stage = f"circuit ({method}: {len(points)} gradient{'s' if len(points) > 1 else ''} x {len(parts)} batches)"
    for done, part in enumerate(parts):
        rows = task.subset(part)
        clean, positions = target.inputs(rows, "clean")  # (the metric reads the logits at these only)
        corrupted, _ = target.inputs(rows, "corrupted")
        change, clean_logits, corrupted_logits = sender_change(target, graph, clean, corrupted, positions)  # (S, B, T, D)
        # (no float32 copy here: the logits are one position per prompt seen at every position, and
        # Task.score reads its own position in float32)
        reference = target.aligned(clean_logits) if task.metric == "kl" else None
        for name, logits in (("clean", clean_logits), ("corrupted", corrupted_logits)):
            metrics[name] += float(rows.score(target.aligned(logits), reference=reference).double().sum())
        del clean_logits, corrupted_logits, logits  # (the loop's name held the corrupted run's logits)
        flat = change.flatten(2)  # (S, B, T * D)
        e_clean, e_corrupted = _embedding_of(model, clean), _embedding_of(model, corrupted)

        def measured(logits, rows=rows, reference=reference):
            return rows.score(target.aligned(logits), reference=reference).sum()

        for point, alpha in enumerate(points):
            mixed = None if alpha == 1.0 else (lambda e, a=alpha: e_corrupted + a * (e_clean - e_corrupted))
            started = time.monotonic()
            for receiver, names, grad in receiver_gradients(target, graph, clean, measured, embed=mixed, plans=plans,
                                                            positions=positions):
                upstream = _senders(flat, receiver.upstream).transpose(0, 1)  # (B, U, T * D)
                found = torch.bmm(upstream, grad.flatten(2).permute(1, 2, 0))  # (B, U, names)
                per_prompt[id(receiver)][part, names] += found.transpose(1, 2).double().cpu() / steps
            if done == 0 and point == 0:
                check_estimate(time.monotonic() - started, len(parts) * len(points))
            if progress is not None:  # one forward/backward pair: steps x batches of them in all
                progress(stage, done * len(points) + point + 1, len(parts) * len(points))
    prompts = torch.cat([per_prompt[id(r)].reshape(task.n, -1) for r in graph.receivers], dim=1)  # (n, edges)
    scores = prompts.mean(0).numpy()
    means = {name: value / task.n for name, value in metrics.items()}
    return scores, {"forward": 2 + steps, "backward": steps}, means, prompts.float().numpy()


def _senders(flat: torch.Tensor, indices: list) -> torch.Tensor:
    """`flat[indices]`, a view when the indices run consecutively (as a receiver's upstream does)."""
    if indices and indices == list(range(indices[0], indices[0] + len(indices))):
        return flat[indices[0]:indices[0] + len(indices)]
    return flat[indices]


# Floats a prompt's token holds while a circuit is scored, per layer and d_model, beyond the senders'
# change: the forward graph a backward pass keeps (a plain forward/backward of SmolLM2-135M in
# float32 holds about 17 x layers x d_model per token; 24 leaves room for wider MLPs).
GRAPH_FLOATS = 24


def scoring_bytes(target: Target, graph: Graph, length: int) -> int:
    """An estimate of the memory one prompt of `length` tokens needs while its edges are scored:
    per token, the senders' change (senders x d_model float32), the forward graph kept for the
    backward pass (`GRAPH_FLOATS` x layers x d_model in the model's dtype) and one head block's
    gradient rows (2 x 3 x heads x d_model float32); per prompt, the logits at its answer position
    three times (the run's, their float32 copy and its log-softmax: the LM head reads that
    position only, `headscope.circuits.target.read_positions`)."""
    model = target.model
    weight = next(model.parameters())
    vocab = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else 0
    layers = len(graph.parts.layers)
    d = int(target.d_model)
    floats = len(graph.senders) * d + 6 * graph.n_heads * d
    return length * (4 * floats + weight.element_size() * GRAPH_FLOATS * layers * d) + 4 * 3 * vocab


def memory_budget(device) -> int:
    """The default memory a circuit's scoring may take, in bytes: half of what the device has
    free (a GPU's free memory, `torch.cuda.mem_get_info`; the CPU's MemAvailable)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 8 << 30  # no way to ask: 8 GiB


def micro_batch(target: Target, graph: Graph, task, batch_size: int, max_memory: Optional[int] = None) -> int:
    """Prompts per pass: `batch_size`, or fewer where `scoring_bytes` of them exceed
    `max_memory` (default `memory_budget`); HeadscopeError when not even one prompt fits."""
    check_count("batch_size", batch_size)
    if max_memory is not None:
        check_count("max_memory", max_memory)
    budget = memory_budget(next(target.model.parameters()).device) if max_memory is None else max_memory
    length = int(task.clean.shape[1]) + (1 if target.two_inputs else 0)
    each = scoring_bytes(target, graph, length)
    if each > budget:
        raise HeadscopeError(f"one prompt of {length} tokens needs about {_size(each)} to score this model's edges, "
                             f"over the {_size(budget)} allowed (max_memory): allow more or use shorter prompts")
    return max(1, min(batch_size, budget // each))


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.3g} {unit}"
    return f"{count} bytes"


RIEMANN = ("left", "right")
WARN_SECONDS = 3600  # an estimate above this is warned about, naming it
MAX_SECONDS = 86400  # and above this (a day on this machine) refused after the first pass


def check_estimate(seconds_per_pass: float, passes: int, kind: str = "forward/backward passes",
                   instead: str = "use fewer steps or prompts", doing: str = "this circuit") -> None:
    """After the first pass (a forward/backward pair, or a patched run: `kind`): HeadscopeError
    when `passes` of them would take over `MAX_SECONDS` (saying what to do `instead`), a warning
    naming the estimate over `WARN_SECONDS`."""
    total = seconds_per_pass * passes
    what = f"{passes} {kind} at about {seconds_per_pass:.3g} s each: about {total / 3600:.1f} hours on this machine"
    if total > MAX_SECONDS:
        raise HeadscopeError(f"{doing} would take {what}; {instead}")
    if total > WARN_SECONDS:
        warnings.warn(f"{doing} will take {what}", HeadscopeWarning, stacklevel=3)


def integration_points(method: str, steps, riemann: str = "left") -> tuple[int, list]:
    """`(S, [alpha_k])`: the interpolation coefficients at which EAP-IG takes its gradients
    (module docstring); EAP is the single point 1 (the clean run)."""
    if riemann not in RIEMANN:
        raise UsageError(f"unknown Riemann rule {riemann!r}; choose one of {', '.join(RIEMANN)}")
    if method == "eap":
        return 1, [1.0]
    check_count("steps", steps)
    first = 0 if riemann == "left" else 1
    return steps, [k / steps for k in range(first, first + steps)]
