"""What a detector is, and the registry that finds detectors by name.

A `Detector` scores every head of one layer from that layer's attention patterns on one probe
batch: `score(pattern [batch, head, query, key], batch) -> [batch, head]`, one number per
probe example (NaN where the example has no query the formula applies to). Scores lie in
[0, 1]; a head passes when its mean over examples is at least `threshold`. Detectors are pure:
they never modify the pattern they are given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Detector", "REGISTRY", "register", "masked_query_mean", "diagonal", "column", "mass_on_targets", "entropy"]


@dataclass(frozen=True)
class Detector:
    """A named head-scoring rule.

    Attributes:
        name: registry key, also the label of heads that pass.
        probe: which probe it reads ("text" or "repeated").
        threshold: score at which a head gets this label.
        formula: the formula in words, for reports and docs.
        source: the paper (and what the threshold rests on).
        fn: `(pattern, batch) -> [batch, head]` per-example scores.
        bidirectional_only: meaningless for causal models (e.g. next-token attention).
        lazy: `fn` also accepts a `LazyPattern` (it reads the pattern only through the
            accessors of this module).
        learned: passing claims the model learned the behaviour, so the label also needs the
            head's CI lower bound above the untrained control's best head (`headscope.labels`);
            False for resting behaviours (sink, uniform), which stay descriptive.
        gate: what must reach `threshold`: "score" (the mean) or "ci_low" (its CI lower bound,
            for scores that are held-out estimates, like the syntactic margin).
        quantity: what the score is, in words, for report columns ("attention mass", ...).
        variants: suffixes of a detector that scores several variants at once (the offsets of
            `positional`): `fn` then returns `[batch, head, variant]`, each head keeps the
            variant of highest mean score and is labelled `name:<variant>`
            (`headscope.detectors.variants.best_variant`). Empty for one-score detectors.
        opt_in: run only when named (`detectors=[...]`, `--detectors`), not among the defaults.
    """

    name: str
    probe: str
    threshold: float
    formula: str
    source: str
    fn: Callable
    bidirectional_only: bool = False
    lazy: bool = False
    learned: bool = True
    gate: str = "score"
    quantity: str = "attention mass"
    variants: tuple[str, ...] = ()
    opt_in: bool = False

    def score(self, pattern: torch.Tensor, batch) -> torch.Tensor:
        """Per-example scores `[batch, head]` (`[batch, head, variant]` with `variants`) of one
        layer's pattern `[batch, head, query, key]`."""
        return self.fn(pattern, batch)

    def __call__(self, target, batch=None, **kwargs):
        """Score heads of whatever a notebook has at hand.

        - `detector(pattern, probe_batch)`: per-example scores `[batch, head]` (the pure form).
        - `detector(loaded, **analyze_kwargs)`: runs `headscope.analyze` with this detector
          alone and returns its scores DataFrame (layer, head, detector, score, ci_low, ...).
        - `detector(patterns, input_ids=None, attention_mask=None, causal=True)`: patterns
          captured by the user (`cap.patterns`, a `{layer: [batch, head, query, key]}` dict, or
          one such tensor) -> DataFrame layer, head, detector, score (mean over examples).
        """
        if isinstance(target, torch.Tensor) and batch is not None:
            return self.score(target, batch)
        from .calling import score_loaded, score_patterns

        if hasattr(target, "model") and hasattr(target, "tokenizer"):
            return score_loaded(self, target, **kwargs)
        return score_patterns(self, target, **kwargs)

    def describe(self) -> dict:
        return {"formula": self.formula, "threshold": self.threshold, "source": self.source, "probe": self.probe,
                "learned": self.learned, "gate": self.gate, "quantity": self.quantity,
                "variants": list(self.variants)}


REGISTRY: dict[str, Detector] = {}


def register(detector: Detector) -> Detector:
    """Add a detector to the registry under its name."""
    REGISTRY[detector.name] = detector
    return detector


def masked_query_mean(values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Mean over the selected queries of each example.

    Args:
        values: `[batch, head, query]`.
        queries: `[batch, query]` bool, the queries the formula applies to.
    Returns:
        `[batch, head]`, NaN for examples with no selected query.
    """
    chosen = queries[:, None, :]
    count = chosen.sum(-1).to(values.dtype)
    total = torch.where(chosen, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def _is_lazy(pattern) -> bool:
    return not isinstance(pattern, torch.Tensor)


def diagonal(pattern, offset: int) -> torch.Tensor:
    """`[batch, head, n]` A[i, i + offset] (the order of `Tensor.diagonal(offset, -2, -1)`)."""
    if _is_lazy(pattern):
        return pattern.diagonal(offset)
    return pattern.diagonal(offset=offset, dim1=-2, dim2=-1)


def column(pattern, key: int) -> torch.Tensor:
    """`[batch, head, query]` A[:, key]."""
    return pattern.column(key) if _is_lazy(pattern) else pattern[..., key]


def mass_on_targets(pattern, targets: torch.Tensor) -> torch.Tensor:
    """`[batch, head, query]` sum of A[i, j] over keys j with `targets[b, i, j]` (`[batch, query, key]` bool)."""
    if _is_lazy(pattern):
        return pattern.mass(targets)
    return (pattern * targets[:, None].to(pattern.dtype)).sum(-1)


def entropy(pattern) -> torch.Tensor:
    """`[batch, head, query]` row entropy -sum_j A[i, j] ln A[i, j] in nats."""
    if _is_lazy(pattern):
        return pattern.entropy()
    # One head at a time, so no second full-size map is allocated.
    return torch.stack([-torch.special.xlogy(pattern[:, h], pattern[:, h]).sum(-1)
                        for h in range(pattern.shape[1])], dim=1)
