"""Edge attribution patching (EAP, EAP-IG): every edge of a circuit's graph scored.

An edge u -> r is the part of receiver r's input that sender u wrote (`headscope.circuits.edges`).
Its score estimates the change of the task's metric M (summed over prompts, then divided by their
number) when that one edge carries the corrupted run's value instead of the clean one:

    score(u -> r) = (1 / n) sum_b (a_u^corrupted - a_u^clean) . g_r

with a_u the sender's output at every position and g_r the gradient of M with respect to r's
own copy of the residual stream (`headscope.circuits.stream_copies`):
- "eap" (Syed et al. 2023, arXiv 2310.10348): g_r on the clean run. Two forward passes (clean and
  corrupted activations) and one forward/backward pair.
- "eap-ig" (Hanna et al. 2024, arXiv 2403.17806): integrated gradients along the straight path
  from the corrupted to the clean input embeddings, g_r = (1 / S) sum_k dM/dr at the embeddings
  e_corrupted + (k / S)(e_clean - e_corrupted), S = `steps`. `riemann="left"` (the default)
  takes k = 0..S-1, starting at the corrupted run, as the EAP-IG code does (`get_scores_eap_ig`
  of Hanna et al.'s repository; MIB's "EAP-IG-inputs"); `riemann="right"` takes k = 1..S,
  ending at the clean run (so S = 1 is EAP). Two forward passes and S forward/backward pairs.
The scores are means over prompts of per-prompt scores, which `score_edges` keeps as well
(`Circuit.stability` resamples them). After the first forward/backward pair the whole run is
estimated from its time (`check_estimate`): over an hour is warned about, over a day refused.

The KL metric (`-KL(p_clean || p)`) has a gradient of exactly 0 at the clean run, so EAP, and
EAP-IG with S = 1 on the right rule, would score every edge 0: they are refused in one line.

Faithfulness, measured by running the model with only some edges clean, is
`headscope.circuits.faithfulness`'s.
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from ..checks import check_count
from ..errors import HeadscopeError, HeadscopeWarning, UsageError
from .edge_patching import plain_senders
from .edges import Graph
from .stream_copies import split_run
from .target import Target, batches, output_logits

__all__ = ["score_edges", "METHODS", "CIRCUIT_METHODS", "RIEMANN", "integration_points", "check_estimate",
           "WARN_SECONDS", "MAX_SECONDS"]

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
                progress=None, riemann: str = "left") -> tuple[np.ndarray, dict, dict, np.ndarray]:
    """`(scores, passes, metrics, per_prompt)`: every edge's score (module docstring) in
    `graph.edges()` order, the passes spent (over all prompts), the clean and corrupted runs' mean
    metrics, and the per-prompt scores `[n, edges]` (float32) whose mean is `scores`."""
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
    parts = batches(task.n, batch_size)
    stage = f"circuit ({method}: {len(points)} gradient{'s' if len(points) > 1 else ''} x {len(parts)} batches)"
    for done, part in enumerate(parts):
        rows = task.subset(part)
        clean, _ = target.inputs(rows, "clean")
        corrupted, _ = target.inputs(rows, "corrupted")
        clean_senders, clean_logits = plain_senders(target, graph, clean)
        corrupted_senders, corrupted_logits = plain_senders(target, graph, corrupted)
        change = corrupted_senders - clean_senders  # (S, B, T, D)
        del corrupted_senders
        reference = target.aligned(clean_logits).float() if task.metric == "kl" else None
        for name, logits in (("clean", clean_logits), ("corrupted", corrupted_logits)):
            metrics[name] += float(rows.score(target.aligned(logits).float(), reference=reference).double().sum())
        e_clean, e_corrupted = _embedding_of(model, clean), _embedding_of(model, corrupted)
        grads = {id(r): 0.0 for r in graph.receivers}
        for point, alpha in enumerate(points):
            leaves = {}

            def delta_for(receiver):
                shape = (len(receiver.names), *clean_senders.shape[1:])
                leaves[id(receiver)] = torch.zeros(shape, dtype=clean_senders.dtype, device=clean_senders.device,
                                                   requires_grad=True)
                return leaves[id(receiver)]

            mixed = None if alpha == 1.0 else (lambda e, a=alpha: e_corrupted + a * (e_clean - e_corrupted))
            started = time.monotonic()
            with torch.enable_grad(), split_run(target, graph, delta_for, embed=mixed):
                logits = output_logits(model(**clean, use_cache=False))
                metric = rows.score(target.aligned(logits).float(), reference=reference).sum()
                found = torch.autograd.grad(metric, [leaves[id(r)] for r in graph.receivers], allow_unused=True)
            for receiver, grad in zip(graph.receivers, found):
                if grad is not None:
                    grads[id(receiver)] = grads[id(receiver)] + grad.detach()
            if done == 0 and point == 0:
                check_estimate(time.monotonic() - started, len(parts) * len(points))
            if progress is not None:  # one forward/backward pair: steps x batches of them in all
                progress(stage, done * len(points) + point + 1, len(parts) * len(points))
        for receiver in graph.receivers:
            grad = grads[id(receiver)]
            if isinstance(grad, float):
                continue
            upstream = change[receiver.upstream].double()  # (U, B, T, D)
            per_prompt[id(receiver)][part] += torch.einsum("ubtd,rbtd->bru", upstream,
                                                            grad.double() / steps).cpu()
    prompts = torch.cat([per_prompt[id(r)].reshape(task.n, -1) for r in graph.receivers], dim=1)  # (n, edges)
    scores = prompts.mean(0).numpy()
    means = {name: value / task.n for name, value in metrics.items()}
    return scores, {"forward": 2 + steps, "backward": steps}, means, prompts.float().numpy()


RIEMANN = ("left", "right")
WARN_SECONDS = 3600  # an estimate above this is warned about, naming it
MAX_SECONDS = 86400  # and above this (a day on this machine) refused after the first pass


def check_estimate(seconds_per_pass: float, passes: int) -> None:
    """After the first forward/backward pair: HeadscopeError when `passes` of them would take over
    `MAX_SECONDS`, a warning naming the estimate over `WARN_SECONDS`."""
    total = seconds_per_pass * passes
    what = (f"{passes} forward/backward passes at about {seconds_per_pass:.3g} s each: about "
            f"{total / 3600:.1f} hours on this machine")
    if total > MAX_SECONDS:
        raise HeadscopeError(f"this circuit would take {what}; use fewer steps or prompts")
    if total > WARN_SECONDS:
        warnings.warn(f"this circuit will take {what}", HeadscopeWarning, stacklevel=3)


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
