"""Head importance (Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than One?").

- `probe_loss(loaded, probe, batch_size, heads=())`: mean next-token cross-entropy on a probe,
  with the given heads zero-ablated.
- `head_importance(loaded, probe, batch_size)`: I_h = E_x |dL(x)/d xi_h| for every head, with a
  gate xi_h = 1 multiplying head h's output z (before W_O) and L(x) the mean next-token
  cross-entropy of example x; `[attention layers, n_heads]` (rows: `loaded.attention_layers`, all
  layers of a dense model, a hybrid's attention layers only), the raw proxy. One gate per example, so the
  absolute value is taken per example.
- `normalize_per_layer(importance)`: Michel et al.'s per-layer normalisation ("we normalize the
  importance scores by layer (using the l2 norm)", after Molchanov et al. 2017):
  I_h / ||I_layer(h)||_2, so every layer's scores have l2 norm 1 and a global pruning order does
  not simply strip the layers whose gradients are small first. A layer of zeros stays zeros.
- `pruning_curve(loaded, probe, importance, steps, seeds)`: loss as heads are zeroed in order
  of increasing importance (least important first, as in Michel et al.) vs in random orders.
Needs a model with a language-model head (causal LM): the loss is next-token prediction.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import HeadscopeError
from ..hf.capture import ablate
from ..hf.hooks import model_hooks

__all__ = ["probe_loss", "head_importance", "normalize_per_layer", "pruning_curve"]


def _check_lm(loaded) -> None:
    if not loaded.causal:
        raise HeadscopeError(f"{loaded.name} is not a causal language model: head importance needs a next-token loss")


def _example_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """`[batch]` mean next-token cross-entropy of each example."""
    logits = model(input_ids=ids).logits  # (B, T, V)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
    return loss.view(ids.shape[0], -1).mean(-1)


@torch.no_grad()
def probe_loss(loaded, probe, batch_size: int = 4, heads: Sequence[tuple[int, int]] = ()) -> float:
    """Mean next-token loss on `probe` with `heads` `[(layer, head)]` zero-ablated."""
    _check_lm(loaded)
    total, count = 0.0, 0
    for batch in probe.batches(batch_size, True, loaded.device):
        if heads:
            with ablate(loaded.model, list(heads), mode="zero"):
                losses = _example_losses(loaded.model, batch.input_ids)
        else:
            losses = _example_losses(loaded.model, batch.input_ids)
        total += float(losses.sum())
        count += losses.numel()
    return total / count


def head_importance(loaded, probe, batch_size: int = 4) -> np.ndarray:
    """Michel et al.'s proxy E_x |dL(x)/d xi_h| per head, `[len(loaded.attention_layers), n_heads]`
    (row i: the layer `loaded.attention_layers[i]`; every layer of a dense model)."""
    _check_lm(loaded)
    position = {layer: i for i, layer in enumerate(loaded.attention_layers)}
    total = torch.zeros(len(position), loaded.n_heads, dtype=torch.float64)
    count = 0
    for batch in probe.batches(batch_size, True, loaded.device):
        ids = batch.input_ids
        gates = torch.ones(ids.shape[0], len(position), loaded.n_heads, device=ids.device, requires_grad=True)

        def gate(z, hook):  # z (B, T, H, D); hook.name = "layers.{L}.attn.hook_z", L the model's number
            row = position[int(hook.name.split(".")[1])]
            return z * gates[:, row, None, :, None].to(z.dtype)

        with torch.enable_grad(), model_hooks(loaded.model, {"layers.*.attn.hook_z": gate}):
            losses = _example_losses(loaded.model, ids)  # (B,)
            (grad,) = torch.autograd.grad(losses.sum(), gates)  # (B, L, H): per example
        total += grad.abs().sum(0).double().cpu()
        count += ids.shape[0]
    return (total / count).numpy()


def normalize_per_layer(importance: np.ndarray) -> np.ndarray:
    """Each layer's importance divided by its l2 norm, same shape (zero layers stay zero).

    Args:
        importance: `[attention layers, n_heads]` from `head_importance`.
    Returns:
        A new array; within a layer the order of heads is unchanged.
    """
    scores = np.asarray(importance, dtype=np.float64)
    norms = np.linalg.norm(scores, axis=1, keepdims=True)  # (L, 1)
    return np.divide(scores, norms, out=np.zeros_like(scores), where=norms > 0)


def pruning_curve(loaded, probe, importance: np.ndarray, steps: int = 10, seeds: Sequence[int] = (0, 1, 2),
                  batch_size: int = 4):
    """Loss as heads are zeroed least-important first vs in random orders.

    Args:
        importance: `[attention layers, n_heads]` from `head_importance` (rows
            `loaded.attention_layers`: a hybrid's layers without attention are never ablated).
        steps: number of points after 0 (heads removed at round(i * n / steps)).
        seeds: random orders to compare.
    Returns:
        DataFrame: order ("importance" or "random"), seed (-1 for importance), removed (heads),
        fraction, loss.
    """
    import pandas as pd

    layers = loaded.attention_layers
    if importance.shape[0] != len(layers):
        raise HeadscopeError(f"importance has {importance.shape[0]} rows, {loaded.name} {len(layers)} attention "
                             f"layers ({', '.join(map(str, layers))})")
    heads = [(l, h) for l in layers for h in range(importance.shape[1])]
    orders = {("importance", -1): [heads[i] for i in np.argsort(importance.ravel(), kind="stable")]}
    for seed in seeds:
        perm = np.random.default_rng(seed).permutation(len(heads))
        orders[("random", seed)] = [heads[i] for i in perm]
    counts = sorted({round(i * len(heads) / steps) for i in range(steps + 1)})
    base = probe_loss(loaded, probe, batch_size)
    rows = []
    for (name, seed), order in orders.items():
        for n in counts:
            loss = base if n == 0 else probe_loss(loaded, probe, batch_size, order[:n])
            rows.append(dict(order=name, seed=seed, removed=n, fraction=n / len(heads), loss=loss))
    return pd.DataFrame(rows)
