"""What every detector promises, checked on any one: `check_detector(detector)`.

- Its fields are ones headscope can use (`protocol.check_detector`, run when a `Detector` is made).
- The registry holds it under its name, or holds nothing of that name (`register` it to use it
  by name).
- A pattern detector is pure and shaped: called on a random pattern `[batch, head, query, key]`
  with a probe batch, it returns per-example scores `[batch, head]` (`[batch, head, variant]`
  with `variants`) of floats, finite or NaN, and
  leaves the pattern as it was (one well-known head detector zeroes its caller's patterns).
  A detector that runs its own passes (`Detector.run`) or reads treebank arcs is checked on its
  fields and name only: a pattern is not what it reads.
The built-in detectors' tests run it on every built-in; run it on your own in its tests.
"""
from __future__ import annotations

import torch

from ..errors import HeadscopeError
from ..probes.base import ProbeBatch
from .protocol import Detector, check_detector as check_fields
from .registry import REGISTRY

__all__ = ["check_detector"]

SHAPE = (2, 3, 12)  # batch, head, positions: odd sizes, so a swapped axis shows


def check_detector(detector) -> None:
    """Check the contract every detector keeps: usable fields, a registry entry that is this
    detector (or none), and, for a pattern detector, `[batch, head]` scores from a pattern it
    leaves untouched.

    Args:
        detector: a `Detector` (a built-in, `headscope.detector(...)`'s or your own).

    Returns:
        None; a `HeadscopeError` names the first broken promise.
    """
    if not isinstance(detector, Detector):
        raise HeadscopeError(f"check_detector takes a Detector, not a {type(detector).__name__}")
    check_fields(detector)
    if REGISTRY.get(detector.name, detector) is not detector:
        raise HeadscopeError(f"detector {detector.name!r}: the registry holds another detector of that name")
    if detector.run is not None or detector.probe == "treebank":
        return
    n_batch, n_heads, n_positions = SHAPE
    generator = torch.Generator().manual_seed(0)
    pattern = torch.softmax(torch.randn(n_batch, n_heads, n_positions, n_positions, generator=generator), -1)
    ids = torch.randint(3, 9, (n_batch, n_positions), generator=generator)
    batch = ProbeBatch(ids, torch.ones_like(ids, dtype=torch.bool), True, 1)
    before, ids_before = pattern.clone(), ids.clone()
    scores = detector(pattern, batch)
    if not torch.equal(pattern, before) or not torch.equal(batch.input_ids, ids_before):
        raise HeadscopeError(f"detector {detector.name!r} changed its input: a detector reads the pattern and "
                             f"the batch and returns new scores")
    expected = (n_batch, n_heads) + ((len(detector.variants),) if detector.variants else ())
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != expected:
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        wanted = "[batch, head, variant]" if detector.variants else "[batch, head]"
        raise HeadscopeError(f"detector {detector.name!r} returned {shape} for a [batch, head, query, key] "
                             f"pattern of {tuple(pattern.shape)}; a detector returns {wanted} scores")
    if not scores.is_floating_point() or torch.isinf(scores).any():
        raise HeadscopeError(f"detector {detector.name!r} returned {scores.dtype} scores with infinities; "
                             f"scores are floats, finite or NaN (NaN: nothing to score)")
