"""Statistics over probe examples.

- `bootstrap_mean_ci(values, n_resamples=1000, level=0.95, seed=0)`: mean and percentile
  bootstrap confidence interval (Efron & Tibshirani 1993) of each row of `values`, resampling
  probe examples with replacement. NaN entries (examples where a formula had no query) are
  left out of the row's mean.
"""
from __future__ import annotations

import torch

__all__ = ["bootstrap_mean_ci"]


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
