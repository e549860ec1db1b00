"""Head detectors, registered by name.

Each detector reduces one layer's pattern `[batch, head, query, key]` on one probe batch to
per-example values and finalizes them into rows of the scores table; see
`headscope.detectors.protocol.Detector`.

- `registry`: `REGISTRY` (name -> Detector), `get(name)`, `names()`, `defaults(causal)`,
  `defaults_for(kind)` (per site kind: causal, bidirectional, cross),
  `register(detector)`, and `BUILTINS`, the explicit list of built-in detectors, imported the
  first time the registry is read. Importing this package registers nothing and loads no torch.
- `protocol`: `Detector` (its fields checked when made: `check_detector`), `Collected`, `Finding`,
  `resolve(spec)` (a name or `mypkg.module:name`).
- `patterns/`: one module per pattern detector: induction, duplicate_token (formulas shared in
  copying.py), previous_token, next_token, self_token (formula shared in offsets.py), sink,
  uniform, positional (argmax at offset k, one variant per offset; see `variants`), rare_word,
  alignment (cross-attention: the argmax advances with the query).
- `syntax/`: syntactic (word attention against dependency arcs, `syntax/`), retrieval (needle copying,
  Wu et al. 2024; runs its own passes, `Detector.run`; `retrieval/`).
- `labels` (the label rules), `stats` (bootstrap intervals), `templates` (`headscope.detector`:
  your own detector from a template), `variants`.
- Your own: `headscope.detector(name, template=...)` or any `register(Detector(...))` (a built-in's
  name only with `replace=True`); the CLI imports a module named as `--detectors mypkg.module:name`.
- From a notebook, a detector is called on captured patterns (`previous_token(cap.patterns)`).

The names below are re-exported lazily (`from headscope.detectors import induction`); the
retrieval detector is `REGISTRY["retrieval"]` (`retrieval` here is its subpackage). The pattern
detectors live in `patterns/`, not here, so that importing one cannot replace the package's
attribute of the same name with the module.
"""
from .._lazy import lazy_exports

_EXPORTS = {
    "REGISTRY": "registry", "BUILTINS": "registry", "register": "registry", "get": "registry", "names": "registry",
    "defaults": "registry", "defaults_for": "registry", "Detector": "protocol", "resolve": "protocol",
    "induction": "patterns.induction", "duplicate_token": "patterns.duplicate_token", "previous_token": "patterns.previous_token",
    "next_token": "patterns.next_token", "positional": "patterns.positional", "rare_word": "patterns.rare_word", "self_attention": "patterns.self_token",
    "sink": "patterns.sink", "uniform": "patterns.uniform", "alignment": "patterns.alignment",
    "syntactic": "syntax.detector",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
