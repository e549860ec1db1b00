"""KV-cache policies from head scores: which key/value heads keep the full cache.

A policy gives every key/value head of every layer a value in [0, 1] and keeps the full cache
for the `n_full = max(1, round(keep * layers * kv_heads))` heads of highest value (ties broken
by layer, then head, the lower first); every other head streams: it keeps its first `sink` and
last `recent` keys (DuoAttention's streaming heads, `headscope.attention.streaming`).

Values from an analysis (`kv_policy`):
- `rank_by="retrieval"` (default): each query head's retrieval score (Wu et al. 2024;
  DuoAttention and HeadKV keep retrieval heads whole);
- `rank_by="razor"`: max(induction, duplicate_token) per query head (RazorAttention keeps
  induction and "echo" heads whole);
a score the analysis left undefined (NaN: no counted example) counts as the lowest. A key/value
head's value is the largest of the query heads that share it (under GQA one cached head serves
`n_heads / n_kv_heads` query heads; it must stay whole if any of them needs it). The scores are
query heads' scores are first scaled to [0, 1] by u = (s - min) / (max - min) over all heads (all 0
when every score is equal), then made strictly ordered: v = (1 - TIE_STEP) u + TIE_STEP (N - 1 -
r) / (N - 1), r the head's place in the order (u high first, ties: lower layer, then lower head
first), N the number of query heads. v differs from u by at most TIE_STEP = 1e-6, and no two
heads tie, so any tool that sorts the exported values (DuoAttention's quantile, kvpress's
argsort) picks the same heads as headscope even where many scores are equal (often 0). The
key/value heads' values, the largest of their query heads', are what the exported files hold.

- `KVPolicy`: values `[layer, kv_head]`, full `[layer, kv_head]` bool, sink, recent, keep, shape.
- `kv_policy(analysis, keep=0.25, rank_by="retrieval", sink=None, recent=None)`.
- `policy_from_values(values, keep, ...)`, `random_values(...)`, `default_window(parameters)`.
- `check_cached_per_head(family)`: the one-line refusal for families whose cache is not per key/value
  head (multi-head latent attention caches one latent per token that every head reads, so a
  streaming head frees nothing).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from ..errors import HeadscopeError, UsageError
from ..checks import check_analysis, check_count
from ..hf.adapters import ADAPTERS

__all__ = ["TIE_STEP", "strictly_ordered", "KVPolicy", "kv_policy", "policy_from_values", "cache_bytes", "full_count", "ranking_order", "check_keep", "check_cached_per_head", "RANKINGS", "default_window", "DUO_WINDOW", "SMALL_WINDOW",
           "SMALL_MODEL"]

RANKINGS = {"retrieval": ("retrieval",), "razor": ("induction", "duplicate_token")}
DUO_WINDOW = (128, 256)  # DuoAttention's sink and recent sizes
SMALL_WINDOW = (16, 64)  # for models below SMALL_MODEL parameters, whose prompts are short
SMALL_MODEL = 1_000_000_000
TIE_STEP = 1e-6  # the most the tie-breaking moves a value


def check_cached_per_head(family: str) -> None:
    """HeadscopeError in one line where the family's KV cache is not one per key/value head: multi-head
    latent attention (`Adapter.latent`) caches one low-rank latent and one rotary key per token, which
    every head reads, so no head's keys can be dropped alone and a per-head policy saves nothing."""
    if any(a.family == family and a.latent is not None for a in ADAPTERS):
        raise HeadscopeError(f"per-head KV-cache policies do not apply to {family}: its multi-head latent attention "
                             f"caches one latent per token that every head reads, so a streaming head frees no memory")


def default_window(parameters: Optional[int]) -> tuple[int, int]:
    """(sink, recent): DuoAttention's 128/256 from 1B parameters on, 16/64 below (or unknown size)."""
    return DUO_WINDOW if parameters is not None and parameters >= SMALL_MODEL else SMALL_WINDOW


@dataclass(eq=False)
class KVPolicy:
    """Which key/value heads keep the full KV cache; the rest keep `sink` + `recent` keys.

    Attributes:
        values: `[layer, kv_head]` float in [0, 1], the ranking (higher = kept first).
        full: `[layer, kv_head]` bool, the heads that keep the full cache.
        sink, recent: keys a streaming head keeps at the start and at the end.
        keep: the fraction of key/value heads asked to be full.
        n_heads: query heads per layer (the model's shape; `values.shape` gives the rest).
        model: the model the scores came from; rank_by: what ranked the heads.
        head_values: `[layer, head]` the query heads' values (each key/value head's value is
            the largest of its query heads'); when read from a file without them, each query
            head carries its key/value head's value.
    """

    values: np.ndarray
    full: np.ndarray
    sink: int
    recent: int
    keep: float
    n_heads: int
    model: str = ""
    rank_by: str = "retrieval"
    head_values: Optional[np.ndarray] = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.head_values is None:
            self.head_values = np.repeat(self.values, self.n_heads // self.values.shape[1], axis=1)

    @property
    def n_layers(self) -> int:
        return self.values.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.values.shape[1]

    @property
    def streaming(self) -> list[tuple[int, int]]:
        """`[(layer, kv_head)]` of the heads that stream."""
        return [(int(l), int(h)) for l, h in zip(*np.nonzero(~self.full))]

    def with_keep(self, keep: float) -> "KVPolicy":
        """The same values thresholded at another keep fraction."""
        return replace(policy_from_values(self.values, keep, self.n_heads, self.sink, self.recent, self.model,
                                          self.rank_by), head_values=self.head_values, meta=dict(self.meta))

    def kv_bytes(self, n_tokens: int, d_head: int, bytes_per_value: int) -> int:
        """Bytes a cache of one sequence of `n_tokens` keeps (`cache_bytes`)."""
        return cache_bytes(self.full, n_tokens, self.sink, self.recent, d_head, bytes_per_value)

    def __eq__(self, other) -> bool:
        return (isinstance(other, KVPolicy) and self.values.shape == other.values.shape
                and np.array_equal(self.values, other.values) and np.array_equal(self.full, other.full)
                and (self.sink, self.recent, self.n_heads) == (other.sink, other.recent, other.n_heads))

    def __repr__(self) -> str:
        return (f"KVPolicy({self.model or 'model'}: {int(self.full.sum())} of {self.full.size} key/value heads full, "
                f"sink={self.sink}, recent={self.recent}, ranked by {self.rank_by})")


def cache_bytes(full: np.ndarray, n_tokens: int, sink: int, recent: int, d_head: int, bytes_per_value: int) -> int:
    """Bytes of keys and values a cache of one sequence of `n_tokens` keeps:
    2 x d_head x bytes_per_value x (full heads x T + streaming heads x min(T, sink + recent))."""
    n_full = int(np.count_nonzero(full))
    kept = n_full * n_tokens + (np.size(full) - n_full) * min(n_tokens, sink + recent)
    return int(2 * d_head * bytes_per_value * kept)


def full_count(keep: float, n_kv_total: int) -> int:
    """Heads kept full: max(1, round(keep x key/value heads)), Python's round (half to even)."""
    return max(1, int(round(check_keep(keep) * n_kv_total)))


def ranking_order(values: np.ndarray) -> np.ndarray:
    """Flat `[layer * kv_head]` indices, highest value first; ties: the lower (layer, head) first."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    return np.lexsort((np.arange(flat.size), -flat))


def check_keep(keep: float) -> float:
    keep = float(keep)
    if not 0.0 < keep <= 1.0:
        raise UsageError(f"keep is the fraction of key/value heads kept full, in (0, 1]; got {keep:g}")
    return keep


def policy_from_values(values, keep: float, n_heads: int, sink: int, recent: int, model: str = "",
                       rank_by: str = "retrieval") -> KVPolicy:
    """The policy keeping the top `keep` fraction of heads by `values` `[layer, kv_head]` in [0, 1]."""
    keep = check_keep(keep)
    if sink < 0 or recent < 1:
        raise UsageError(f"a streaming head needs sink >= 0 and recent >= 1, got sink={sink}, recent={recent}")
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 2 and values.shape[1] and n_heads % values.shape[1]:
        raise HeadscopeError(f"{n_heads} query heads cannot share {values.shape[1]} key/value heads evenly")
    if values.ndim != 2 or values.size == 0:
        raise HeadscopeError(f"head values must be a [layer, kv_head] table, got shape {values.shape}")
    if np.isnan(values).any() or values.min() < 0 or values.max() > 1:
        raise HeadscopeError("head values must lie in [0, 1]")
    full = np.zeros(values.size, dtype=bool)
    full[ranking_order(values)[:full_count(keep, values.size)]] = True
    return KVPolicy(values, full.reshape(values.shape), int(sink), int(recent), keep, int(n_heads), model, rank_by)


def scale_unit(scores: np.ndarray) -> np.ndarray:
    """(s - min) / (max - min), NaN taken as the minimum; all zeros when every score is equal."""
    scores = np.asarray(scores, dtype=np.float64)
    if np.isnan(scores).all():
        return np.zeros_like(scores)
    low, high = np.nanmin(scores), np.nanmax(scores)
    scores = np.where(np.isnan(scores), low, scores)
    return np.zeros_like(scores) if high == low else (scores - low) / (high - low)


def strictly_ordered(values: np.ndarray) -> np.ndarray:
    """(1 - TIE_STEP) v + TIE_STEP (N - 1 - r) / (N - 1), r each entry's place in `ranking_order`."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return values.copy()
    place = np.empty(values.size)
    place[ranking_order(values)] = np.arange(values.size)
    spread = (values.size - 1 - place) / (values.size - 1)
    return ((1 - TIE_STEP) * values.ravel() + TIE_STEP * spread).reshape(values.shape)


def kv_head_scores(query_scores: np.ndarray, n_kv: int) -> np.ndarray:
    """`[layer, kv_head]`: the largest score of the query heads sharing each key/value head."""
    n_layers, n_heads = query_scores.shape
    if n_heads % n_kv:
        raise HeadscopeError(f"{n_heads} query heads cannot share {n_kv} key/value heads evenly")
    return query_scores.reshape(n_layers, n_kv, n_heads // n_kv).max(axis=-1)  # (L, KV)


def kv_policy(analysis, keep: float = 0.25, rank_by: str = "retrieval", sink: Optional[int] = None,
              recent: Optional[int] = None) -> KVPolicy:
    """A KV-cache policy from an analysis's head scores.

    Args:
        analysis: an `Analysis` (`headscope.analyze` or `Analysis.load`) with the ranking's
            detectors among its scores.
        keep: fraction of key/value heads that keep the full cache, in (0, 1].
        rank_by: "retrieval" (default) or "razor" (max of induction and duplicate_token).
        sink, recent: keys a streaming head keeps (default `default_window(parameters)`).
    Returns:
        A `KVPolicy` (see the module docstring for the formula).
    """
    check_analysis(analysis, "kv_policy")
    if sink is not None:
        check_count("sink", sink, least=0)
    if recent is not None:
        check_count("recent", recent, least=1)
    keep = check_keep(keep)
    if rank_by not in RANKINGS:
        raise UsageError(f"unknown ranking {rank_by!r}; use one of {', '.join(RANKINGS)}")
    meta = analysis.meta
    check_cached_per_head(str(meta.get("family", "")))
    n_layers, n_heads = int(meta["n_layers"]), int(meta["n_heads"])
    n_kv = int(meta.get("n_kv_heads") or n_heads)
    scores = analysis.scores
    per_detector = []
    for name in RANKINGS[rank_by]:
        rows = scores[scores.detector == name]
        if rows.empty:
            raise HeadscopeError(f"the analysis has no {name!r} scores, which rank_by={rank_by!r} needs; run "
                                 f"headscope analyze with --detectors {','.join(RANKINGS[rank_by])}")
        table = np.full((n_layers, n_heads), np.nan)
        table[rows.layer.to_numpy(int), rows["head"].to_numpy(int)] = rows.score.to_numpy(float)
        per_detector.append(table)
    with np.errstate(all="ignore"):
        query_scores = np.nanmax(np.stack(per_detector), axis=0) if len(per_detector) > 1 else per_detector[0]
    head_values = strictly_ordered(scale_unit(query_scores))  # (L, H) in [0, 1], no ties; NaN -> lowest
    values = kv_head_scores(head_values, n_kv)  # (L, KV): the strongest query head of each
    default_sink, default_recent = default_window(meta.get("parameters"))
    policy = policy_from_values(values, keep, n_heads, default_sink if sink is None else sink,
                                default_recent if recent is None else recent, str(meta.get("model", "")), rank_by)
    return replace(policy, head_values=head_values, meta={"rank_by": rank_by, "detectors": list(RANKINGS[rank_by])})
