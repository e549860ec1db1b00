"""How much a circuit would change with other prompts of the same task: bootstrap Jaccard.

- `stability(prompt_scores, sizes=(1, 5), n_boot=100, seed=0, level=0.95)`: for each size, the
  Jaccard overlap of the top `size`% of edges by |score| between the circuits of two independent
  bootstrap resamples of the prompts, over `n_boot` such pairs; mean and percentile interval.

Formula. With per-prompt edge scores P `[n, edges]` (an edge's score is their mean,
`headscope.circuits.eap`), a resample draws n prompts with replacement, w_i = how often prompt i
was drawn, and scores the edges by (1 / n) sum_i w_i P_i, exactly the scores of a circuit found
on those prompts (EAP and EAP-IG are sums over prompts). For each pair (A, B) of independent
resamples, J = |top_k(A) & top_k(B)| / |top_k(A) | top_k(B)|, k = max(1, round(edges * size / 100)).
A circuit is stable when J stays high; Méloux et al. 2025 (arXiv 2510.00845) found J = 0.39 for
IOI circuits of Llama-3.2-1B and suggest J >= 0.8 before trusting one circuit.
"""
from __future__ import annotations

import numpy as np

from ..checks import check_count, check_seed
from ..errors import HeadscopeError, UsageError

__all__ = ["stability", "STABILITY_SIZES"]

STABILITY_SIZES = (1, 5)  # percent of the edges


def stability(prompt_scores, sizes=STABILITY_SIZES, n_boot: int = 100, seed: int = 0, level: float = 0.95):
    """Bootstrap Jaccard of a circuit's top edges (module docstring).

    Args:
        prompt_scores: `[n, edges]` per-prompt edge scores (`Circuit.prompt_scores`).
        sizes: circuit sizes in percent of the edges, each in (0, 100].
        n_boot: pairs of resamples.
        seed: the resamples' seed.
        level: the interval's coverage.
    Returns:
        DataFrame (size, n_edges, jaccard, jaccard_lo, jaccard_hi, n_boot, n_prompts).
    """
    import pandas as pd

    scores = np.asarray(prompt_scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[0] < 2 or scores.shape[1] < 1:
        raise HeadscopeError(f"stability resamples prompts: it needs per-prompt scores of at least 2 prompts, got "
                             f"shape {list(scores.shape)}")
    if not np.isfinite(scores).all():
        raise HeadscopeError("the per-prompt scores hold NaN or infinite values; they cannot be ranked")
    check_count("n_boot", n_boot, most=100_000)
    check_seed(seed)
    try:
        chosen = sorted({float(s) for s in sizes})
    except (TypeError, ValueError):
        raise UsageError(f"sizes are percentages of the edges in (0, 100], got {sizes!r}") from None
    if not chosen or any(not 0 < s <= 100 for s in chosen):
        raise UsageError(f"sizes are percentages of the edges in (0, 100], got {sizes!r}")
    n, n_edges = scores.shape
    rng = np.random.default_rng(seed)
    weights = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(2 * n_boot)])  # (2B, n)
    magnitude = np.abs(weights @ scores)  # (2B, edges), n times each resample's scores
    alpha = (1 - level) / 2
    rows = []
    for size in chosen:
        k = max(1, int(round(n_edges * size / 100)))
        top = np.zeros(magnitude.shape, dtype=bool)
        top[np.arange(len(magnitude))[:, None], np.argsort(-magnitude, axis=1, kind="stable")[:, :k]] = True
        a, b = top[0::2], top[1::2]
        jaccard = (a & b).sum(1) / (a | b).sum(1)
        rows.append(dict(size=size, n_edges=k, jaccard=float(jaccard.mean()),
                         jaccard_lo=float(np.quantile(jaccard, alpha)),
                         jaccard_hi=float(np.quantile(jaccard, 1 - alpha)),
                         n_boot=n_boot, n_prompts=n))
    return pd.DataFrame(rows)
