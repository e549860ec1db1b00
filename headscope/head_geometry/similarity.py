"""How alike heads' attention patterns are: Jensen-Shannon divergence, MDS map and clusters.

- `DivergenceAccumulator(layers, n_heads, top_k)`: fed one layer's pattern at a time
  (`add_layer`), batch by batch (`end_batch`); `divergence()` is the mean JS divergence between
  every pair of heads' attention rows over the counted queries, `[len(layers) * n_heads]` squared.
  `layers` are the model's own numbers of the layers that hold attention (a hybrid's 1 and 3 of
  4), or a count n for layers 0..n-1; head h of the i-th of them is index i * n_heads + h.
- `pattern_divergence(loaded, probe, batch_size, top_k)`: the same on a probe inside a Hugging
  Face model, through `capture(reduce=...)`; no layer's map outlives its reducer call.
- `classical_mds(distance, dims=2)`: Torgerson's classical multidimensional scaling.
- `average_linkage_clusters(divergence, threshold)`: agglomerative clusters.

What is computed (Clark et al. 2019 §6). For query rows P_a, P_b of two heads on the same input,
    JS(P_a, P_b) = H((P_a + P_b) / 2) - (H(P_a) + H(P_b)) / 2     in bits (0 same, 1 disjoint),
averaged over every counted query row of every example (a row counts when its query may see at
least two keys; rows are renormalised first, so sink logits do not count as a difference).
- Pairs within one layer: exact, from the layer's full pattern while it exists.
- Pairs across layers: the layers' patterns never coexist, so each row is kept as its `top_k`
  largest weights plus the rest mass r, taken as spread evenly over the row's other n - k
  allowed keys; JS is computed exactly between these sparse-plus-uniform rows. It is exact when
  the rest is 0 or even, and error grows with mass in a long tail. The same approximation is
  computed for within-layer pairs too, and `approximation_error` (mean |approx - exact| over
  them) tells how far to trust the cross-layer entries.
Memory per batch: `top_k` values and indices per row for every head of every layer.
"""
from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np
import torch

from ..errors import HeadscopeError
from ..hf.capture import capture

__all__ = ["DivergenceAccumulator", "pattern_divergence", "classical_mds", "average_linkage_clusters", "row_js"]

LN2 = math.log(2.0)


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in bits over the last axis."""
    return -torch.special.xlogy(p, p).sum(-1) / LN2


def row_js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JS divergence in bits between distributions on the last axis (broadcasting)."""
    return _entropy((p + q) / 2) - (_entropy(p) + _entropy(q)) / 2


def _pair_term(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One key's contribution to JS in bits: (p log(2p/(p+q)) + q log(2q/(p+q))) / 2."""
    s = (p + q).clamp(min=1e-30)
    return (torch.special.xlogy(p, 2 * p / s) + torch.special.xlogy(q, 2 * q / s)) / (2 * LN2)


class DivergenceAccumulator:
    """Mean pairwise JS divergence between heads' attention rows; see the module docstring.

    Args:
        layers: the model's numbers of the attention layers, in order, or their count n (layers
            0..n-1, a dense model).
        n_heads: heads per layer.
        top_k: keys kept per row for cross-layer pairs.

    Heads are numbered `position * n_heads + head`, position the layer's place in `layers`
    (`layer * n_heads + head` for a dense model).
    """

    def __init__(self, layers: Union[int, Sequence[int]], n_heads: int, top_k: int = 8):
        self.layers = tuple(range(layers)) if isinstance(layers, int) else tuple(int(l) for l in layers)
        self.n_layers, self.n_heads, self.top_k = len(self.layers), n_heads, top_k
        self._position = {layer: i for i, layer in enumerate(self.layers)}
        n = self.n_layers * n_heads
        self.exact_sum = torch.zeros(self.n_layers, n_heads, n_heads, dtype=torch.float64)
        self.approx_sum = torch.zeros(n, n, dtype=torch.float64)
        self.rows = 0
        self._batch: dict[int, tuple] = {}

    def add_layer(self, layer: int, pattern: torch.Tensor, allowed: torch.Tensor) -> None:
        """Count one layer's pattern `[batch, head, query, key]`; `allowed` `[batch, query, key]` bool.

        `layer` is the model's number of the layer (one of `layers`)."""
        if layer not in self._position:
            raise HeadscopeError(f"layer {layer} is not one of the accumulator's layers "
                                 f"{', '.join(map(str, self.layers))}")
        position = self._position[layer]
        allowed = allowed.to(pattern.device)
        counted = allowed.sum(-1) >= 2  # (B, Tq)
        p = pattern.detach().float().masked_fill(~allowed[:, None], 0.0)
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-30)
        rows = p.permute(1, 0, 2, 3)[:, counted]  # (H, R, Tk)
        n_keys = allowed.sum(-1)[counted].float()  # (R,)
        for a in range(self.n_heads):  # exact JS of head a against every head of the layer
            self.exact_sum[position, a] += row_js(rows[a:a + 1], rows).sum(-1).double().cpu()  # (H,)
        k = min(self.top_k, rows.shape[-1])
        values, index = rows.topk(k, dim=-1)  # (H, R, k)
        rest = (1 - values.sum(-1)).clamp(min=0)  # (H, R)
        self._batch[layer] = (values, index, rest, n_keys, rows.shape[-1])

    def end_batch(self) -> None:
        """Cross-layer (and, for the error estimate, within-layer) pairs from this batch's top-k rows."""
        if not self._batch:
            return
        missing = [l for l in self.layers if l not in self._batch]
        if missing:  # a head's index is its layer's position: every layer must be in the batch
            raise HeadscopeError(f"layers {', '.join(map(str, missing))} gave no pattern in this batch")
        layers = self.layers
        values = torch.cat([self._batch[l][0] for l in layers])  # (N, R, k)
        index = torch.cat([self._batch[l][1] for l in layers])
        rest = torch.cat([self._batch[l][2] for l in layers])  # (N, R)
        n_keys, width = self._batch[layers[0]][3], self._batch[layers[0]][4]
        k = values.shape[-1]
        spread = rest / (n_keys - k).clamp(min=1)  # (N, R): weight of each key outside the top k
        for a in range(values.shape[0]):
            dense = spread[a, :, None].expand(-1, width).clone()  # (R, Tk): head a's approximate row
            dense.scatter_(-1, index[a], values[a])
            in_a = torch.zeros_like(dense, dtype=torch.bool).scatter_(-1, index[a], True)
            p_at_b = dense.expand(values.shape[0], -1, -1).gather(-1, index)  # (N, R, k)
            matched = in_a.expand(values.shape[0], -1, -1).gather(-1, index)  # (N, R, k)
            u_a, u_b = spread[a][None, :, None], spread[:, :, None]  # (1, R, 1), (N, R, 1)
            over_b = _pair_term(p_at_b, values).sum(-1)  # b's top keys (a exact or spread there)
            over_a = _pair_term(values[a][None], u_b).sum(-1)  # a's top keys, b spread ...
            over_a = over_a - (_pair_term(p_at_b, u_b) * matched).sum(-1)  # ... minus those in b's top
            outside = (n_keys[None] - k - (~matched).sum(-1)).clamp(min=0)  # keys in neither top k
            total = over_b + over_a + outside * _pair_term(u_a[..., 0], u_b[..., 0])  # (N, R)
            self.approx_sum[a] += total.sum(-1).double().cpu()
        self.rows += values.shape[1]
        self._batch.clear()

    def divergence(self) -> torch.Tensor:
        """`[N, N]` mean JS in bits: exact within layers, top-k approximation across them."""
        js = self.approximate()
        h = self.n_heads
        for i in range(self.n_layers):  # i: the layer's position in `layers`
            block = self.exact_sum[i] / max(self.rows, 1)
            js[i * h:(i + 1) * h, i * h:(i + 1) * h] = (block + block.T) / 2
        return js.clamp(min=0)

    def approximate(self) -> torch.Tensor:
        """`[N, N]` the top-k approximation for every pair (symmetrised)."""
        js = self.approx_sum / max(self.rows, 1)
        return (js + js.T) / 2

    def approximation_error(self) -> float:
        """Mean |approximate - exact| over within-layer pairs (bits)."""
        exact, approx = self.divergence(), self.approximate()
        h = self.n_heads
        diffs = [(exact - approx)[l * h:(l + 1) * h, l * h:(l + 1) * h].abs() for l in range(self.n_layers)]
        mask = ~torch.eye(h, dtype=torch.bool)
        return float(torch.stack([d[mask] for d in diffs]).mean())


@torch.no_grad()
def pattern_divergence(loaded, probe, batch_size: int = 4, top_k: int = 8) -> DivergenceAccumulator:
    """Run `probe` (a `ProbeSet`) through `loaded` and accumulate pairwise JS of all its attention heads
    (a hybrid's attention layers only, `loaded.attention_layers`, in order).

    Args:
        loaded: a `headscope.Loaded`.
        probe: e.g. `headscope.probes.base.text_probe(loaded.tokenizer, 8, 128)`.
        batch_size: examples per forward pass.
        top_k: keys kept per row for cross-layer pairs.
    Returns:
        The filled `DivergenceAccumulator`.
    """
    acc = DivergenceAccumulator(loaded.attention_layers, loaded.n_heads, top_k)
    for batch in probe.batches(batch_size, loaded.causal, loaded.device):
        allowed = batch.key_allowed()  # (B, Tq, Tk)
        with capture(loaded.model, reduce=lambda layer, pattern, mask: acc.add_layer(layer, pattern, allowed)):
            loaded.probe_pass(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long())
        acc.end_batch()
    return acc


def classical_mds(distance: np.ndarray, dims: int = 2) -> np.ndarray:
    """Classical (Torgerson) MDS: coordinates `[n, dims]` whose distances approximate `distance`.

    B = -1/2 J D^2 J with J = I - 11^T / n; coordinates = top eigenvectors * sqrt(eigenvalues)
    (negative eigenvalues, from a non-Euclidean D, are clipped to 0).
    """
    d2 = np.asarray(distance, dtype=np.float64) ** 2
    n = d2.shape[0]
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ d2 @ j
    eigval, eigvec = np.linalg.eigh(b)
    order = np.argsort(eigval)[::-1][:dims]
    return eigvec[:, order] * np.sqrt(np.clip(eigval[order], 0, None))


def average_linkage_clusters(divergence: np.ndarray, threshold: float) -> np.ndarray:
    """Agglomerative clustering with average linkage: merge the two clusters whose mean pairwise
    divergence is smallest while it is below `threshold` (Lance-Williams update). Returns a
    cluster id per item, numbered 0, 1, ... in order of each cluster's first member."""
    link = np.array(divergence, dtype=np.float64)
    n = link.shape[0]
    np.fill_diagonal(link, np.inf)
    members = {i: [i] for i in range(n)}
    alive = np.ones(n, dtype=bool)
    while alive.sum() > 1:
        masked = np.where(alive[:, None] & alive[None, :], link, np.inf)
        x, y = np.unravel_index(np.argmin(masked), masked.shape)
        if masked[x, y] >= threshold:
            break
        nx, ny = len(members[x]), len(members[y])
        link[x] = link[:, x] = (nx * link[x] + ny * link[y]) / (nx + ny)  # mean over member pairs
        link[x, x] = np.inf
        members[x] += members.pop(y)
        alive[y] = False
    labels = np.empty(n, dtype=int)
    for cid, group in enumerate(sorted(members.values(), key=min)):
        labels[group] = cid
    return labels
