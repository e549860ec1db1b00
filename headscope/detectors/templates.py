"""Custom detectors in one call, from the attention pattern a head should have.

`detector(name, template=fn, probe="text", threshold=0.5)` builds and registers a `Detector`
whose `template(tokens) -> [query, key]` gives, for one example's token ids `[pos]`, the keys
each query should attend to (bool, or 0/1). Its per-example score is the attention mass on the
template, averaged over the queries the template gives a key:

    score = mean over real queries i with T_i != {} of  sum_{j in T_i} A[i, j]

T_i = {j : template[i, j]} restricted to the keys query i may see. A head's score is the mean
over probe examples (95% bootstrap CI), as for every detector; it reaches 1 for a head that
puts all its attention on the template. This is TransformerLens's `detect_head` with a
detection pattern (the "mul" measure, Nanda & Bloom 2022), except that queries without a
template key are left out instead of counting as 0, as headscope's induction score does.
The score reads only the template's entries, so it runs on the lazy path (no map computed).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..errors import HeadscopeError
from ..attention.pattern import Pattern
from ..probes.base import ProbeBatch
from .protocol import Detector, masked_query_mean
from .registry import register

__all__ = ["detector", "template_targets", "TEMPLATE_PROBES"]

TEMPLATE_PROBES = ("text", "repeated")  # the probes with pattern batches and token ids


def template_targets(template: Callable, batch: ProbeBatch, key: str) -> torch.Tensor:
    """`[batch, query, key]` bool: the template of every example, within the keys each real query may see."""
    def build():
        ids = batch.input_ids
        rows = [torch.as_tensor(template(ids[b].cpu())).to(torch.bool) for b in range(ids.shape[0])]
        for row in rows:
            if row.shape != (ids.shape[1], ids.shape[1]):
                raise HeadscopeError(f"template {key!r} returned {tuple(row.shape)}, not [query, key] = "
                                 f"({ids.shape[1]}, {ids.shape[1]})")
        return torch.stack(rows).to(ids.device) & batch.key_allowed()
    return batch.cached(f"template:{key}", build)


def detector(name: str, template: Callable, probe: str = "text", threshold: float = 0.5, *,
             formula: Optional[str] = None, source: str = "user-defined template", learned: bool = True,
             colour: Optional[str] = None, short: Optional[str] = None, opt_in: bool = False,
             replace: bool = False) -> Detector:
    """Register a detector that scores heads by their attention mass on an ideal pattern.

    Args:
        name: the registry name and the label of heads that pass (no ":" or ",").
        template: `fn(tokens [pos] long) -> [query, key]` bool (or 0/1): where the head should look.
        probe: the probe it reads: "text" (natural text) or "repeated" (random tokens repeated).
        threshold: the score at which a head gets the label.
        formula: the formula in words for reports (default: the template mass, named by `name`).
        source: where the idea comes from.
        learned: True when passing claims a learned behaviour (checked against the control).
        colour, short: the label's colour and cell abbreviation in reports (default: chosen there).
        opt_in: run only when named, not among the defaults.
        replace: allow `name` to be a built-in detector's, replacing it (else HeadscopeError).
    Returns:
        The registered `Detector`; `headscope analyze --detectors mypkg.module:name` imports it.
    """
    if not callable(template):
        raise HeadscopeError(f"detector {name!r}: template must be a function tokens [pos] -> [query, key] bool, "
                             f"got {template!r}")
    if probe not in TEMPLATE_PROBES:
        raise HeadscopeError(f"detector {name!r}: a template detector reads the {' or '.join(TEMPLATE_PROBES)} probe, "
                             f"got probe={probe!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise HeadscopeError(f"detector {name!r}: threshold is an attention mass, so it must be in (0, 1], got {threshold!r}")

    def score(pattern: Pattern, batch: ProbeBatch) -> torch.Tensor:
        targets = template_targets(template, batch, name)  # (B, Q, K)
        return masked_query_mean(pattern.mass(targets), targets.any(-1) & batch.attention_mask.bool())

    return register(Detector(
        name=name, probe=probe, threshold=threshold,
        formula=formula or f"mean over queries with a template key of the attention on the keys {name}'s template gives",
        source=source, fn=score, lazy=True, learned=learned, colour=colour, short=short, opt_in=opt_in,
        quantity="attention mass",
    ), replace=replace)
