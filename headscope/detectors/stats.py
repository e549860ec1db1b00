"""Statistics over probe examples.

- `bootstrap_mean_ci(values, n_resamples=1000, level=0.95, seed=0)`: mean and percentile
  bootstrap confidence interval (Efron & Tibshirani 1993) of each row of `values`, resampling
  probe examples with replacement. NaN entries (examples where a formula had no query) are
  left out of the row's mean.
- `bootstrap_ratio_ci(numerators, denominators, ...)`: a ratio of sums over examples (a patching
  effect: the summed change over the summed gap) and its percentile bootstrap interval, the
  examples resampled together for numerator and denominator.
- `random_head_draws(heads, excluded, n_heads, n_random, rng)`: the control of an ablation,
  random heads from the same layers (as many per layer), none of them `excluded`; shared by
  `headscope.validate` and `validate_retrieval`.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional

import torch

__all__ = ["bootstrap_mean_ci", "bootstrap_ratio_ci", "random_head_draws"]


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
    # Each resample as how often it draws each example: its sums are one product, not a gather
    # of rows x resamples x examples.
    drawn = _draw_counts(n_examples, n_resamples, seed)  # (resamples, examples)
    sums = filled @ drawn.T  # (rows, resamples)
    counts = present.double() @ drawn.T
    means = sums / counts.clamp(min=1)
    means = torch.where(counts > 0, means, mean[:, None].expand_as(means))
    alpha = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([alpha, 1 - alpha], dtype=means.dtype), dim=-1)
    nan = torch.full_like(mean, float("nan"))
    return (torch.where(n > 0, mean, nan), torch.where(n > 0, low, nan), torch.where(n > 0, high, nan), n)


def bootstrap_ratio_ci(numerators: torch.Tensor, denominators: torch.Tensor, n_resamples: int = 1000,
                       level: float = 0.95, seed: int = 0):
    """`sum_b numerators[:, b] / sum_b denominators[b]` per row, with a percentile bootstrap interval.

    Args:
        numerators: `[rows, examples]`.
        denominators: `[examples]`, shared by every row.
        n_resamples, level, seed: as `bootstrap_mean_ci`'s.
    Returns:
        `(ratio, low, high)`, each `[rows]` float64; a resample whose denominators sum to 0 is left out.
    """
    numerators, denominators = numerators.double(), denominators.double()
    counts = _draw_counts(denominators.shape[0], n_resamples, seed)  # (resamples, examples)
    tops, bottoms = numerators @ counts.T, counts @ denominators  # (rows, resamples), (resamples,)
    kept = bottoms != 0
    ratios = tops[:, kept] / bottoms[kept]
    ratio = numerators.sum(-1) / denominators.sum()
    if ratios.shape[1] == 0:
        return ratio, ratio.clone(), ratio.clone()
    alpha = (1 - level) / 2
    low, high = torch.quantile(ratios, torch.tensor([alpha, 1 - alpha], dtype=ratios.dtype), dim=-1)
    return ratio, low, high


def _draw_counts(n_examples: int, n_resamples: int, seed: int) -> torch.Tensor:
    """`[resamples, examples]` float64: how many times each resample (n_examples draws with
    replacement, seeded) takes each example."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_examples, (n_resamples, n_examples), generator=gen)
    return torch.zeros(n_resamples, n_examples, dtype=torch.float64).scatter_add_(
        1, idx, torch.ones(n_resamples, n_examples, dtype=torch.float64))


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
