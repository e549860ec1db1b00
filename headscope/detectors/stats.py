"""Statistics over probe examples.

- `bootstrap_mean_ci(values, n_resamples=1000, level=0.95, seed=0)`: mean and percentile
  bootstrap confidence interval (Efron & Tibshirani 1993) of each row of `values`, resampling
  probe examples with replacement. NaN entries (examples where a formula had no query) are
  left out of the row's mean.
- `random_head_draws(heads, excluded, n_heads, n_random, rng)`: the control of an ablation,
  random heads from the same layers (as many per layer), none of them `excluded`; shared by
  `headscope.validate` and `validate_retrieval`.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional

import torch

__all__ = ["bootstrap_mean_ci", "random_head_draws"]


def bootstrap_mean_ci(values: torch.Tensor, n_resamples: int = 1000, level: float = 0.95, seed: int = 0):
    """Mean and bootstrap CI over the last axis.

    Args:
        values: `[rows, examples]` scores (NaN = missing).
        n_resamples: bootstrap resamples.
        level: confidence level.
        seed: resampling seed.
    Returns:
        `(mean, low, high, n)`, each `[rows]`; n counts the non-missing examples.
    """
    values = values.double()
    present = ~torch.isnan(values)
    n = present.sum(-1)
    filled = torch.where(present, values, torch.zeros_like(values))
    mean = filled.sum(-1) / n.clamp(min=1)
    n_examples = values.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_examples, (n_resamples, n_examples), generator=gen)
    sums = filled[:, idx].sum(-1)  # (rows, resamples)
    counts = present[:, idx].sum(-1)
    means = sums / counts.clamp(min=1)
    means = torch.where(counts > 0, means, mean[:, None].expand_as(means))
    alpha = (1 - level) / 2
    low = torch.quantile(means, alpha, dim=-1)
    high = torch.quantile(means, 1 - alpha, dim=-1)
    nan = torch.full_like(mean, float("nan"))
    return (torch.where(n > 0, mean, nan), torch.where(n > 0, low, nan), torch.where(n > 0, high, nan), n)


def random_head_draws(heads: Iterable[tuple[int, int]], excluded, n_heads: int, n_random: int,
                      rng) -> Optional[list[list[tuple[int, int]]]]:
    """Random heads to ablate against `heads`: from the same layers, as many per layer.

    Args:
        heads: `[(layer, head), ...]` the heads being checked.
        excluded: `(layer, head)` pairs never drawn (the checked heads, or every head of the label).
        n_heads: heads per layer.
        n_random: how many draws.
        rng: a `numpy.random.Generator`; each draw takes, layer by layer in ascending order,
            `rng.choice(pool, count, replace=False)` from the layer's other heads.
    Returns:
        `n_random` draws, each `[(layer, head), ...]` sorted by layer then head; None when a
        layer has fewer heads outside `excluded` than `heads` has there.
    """
    per_layer = Counter(layer for layer, _ in heads)
    pools = {layer: [h for h in range(n_heads) if (layer, h) not in excluded] for layer in per_layer}
    if any(len(pools[layer]) < count for layer, count in per_layer.items()):
        return None
    draws = []
    for _ in range(n_random):
        draw = []
        for layer in sorted(per_layer):
            picked = rng.choice(pools[layer], size=per_layer[layer], replace=False)
            draw += [(layer, int(h)) for h in sorted(picked)]
        draws.append(draw)
    return draws
