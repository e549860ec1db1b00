"""What a detector is (`Detector`, `Collected`, `Finding`), and `resolve`, which finds one by
name or by `mypkg.module:name` (the registry is `headscope.detectors.registry`).

A `Detector` turns one layer's attention pattern on one probe batch into per-example values,
and all of a probe's values into rows of the scores table:

    reduce(layer, pattern, batch) -> values        # pattern: a `headscope.attention.pattern.Pattern`
    finalize(model, control, probe, seed) -> Finding

`headscope.analyze` is a loop over `(probe, detectors)`: each probe's batches run through the
model (and the control twin) inside `capture(reduce=...)`, every detector of the probe reduces
each layer as soon as it is computed, and `finalize` gets what the batches left (`Collected`).
The default `reduce` is `fn(pattern, batch) -> [batch, head]`, one score per probe example and
head (NaN where the example has no query the formula applies to); the default `finalize` is
the mean over examples with a 95% percentile-bootstrap CI (`headscope.detectors.stats`), for the model and
for the control. Detectors are pure: they never modify the pattern they are given.

Some detectors cannot be written as `pattern -> values`: they read the model's logits as well
(retrieval heads count only the answer tokens the model predicts) or need attention rows at
lengths where no map fits. Such a detector carries `run`, and runs its own forward passes:

    run(loaded, control, probe, seed, progress) -> Finding

`analyze` builds its probe as usual (a probe kind in `headscope.probes.kinds`; `NeedleProbe`
for retrieval) and calls `run` with the control twin it resolved for every detector, instead of
`capture(reduce=...)` and `finalize`. The rows it returns are the same `SCORE_COLUMNS` (and
labels follow the same rule); its `fn` is never called on a pattern, and calling the detector on
one is an error that says how to run it.

A detector also carries what the rest of headscope needs to know about it: its probe,
threshold, formula, source, what its score is (`quantity`), whether it claims a learned
behaviour or describes a resting one (`learned`), its colour and abbreviation in reports, and
how `headscope.validate` checks it (on its own probe; `icl_check`), whether the OV qualifier
reads its labels (`ov_qualified`) and what it adds to the report (`report`, a
`headscope.detectors.section.ReportSection`: its tables, figures, HTML, header lines and
warnings). Nothing else names it.
"""
from __future__ import annotations

import importlib
import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, Optional

import pandas as pd
import torch

from ..errors import HeadscopeError
from ..tables import SCORE_COLUMNS
from ..attention.pattern import Pattern, as_pattern
from ..attention.site_kinds import SITE_KINDS
from ..probes.base import ProbeBatch
from ..probes.kinds import PROBE_KINDS
from .section import ReportSection
from .stats import bootstrap_mean_ci
from .registry import REGISTRY, get, register
from .variants import best_variant

__all__ = ["Detector", "check_detector", "is_colour", "Collected", "Finding", "resolve", "masked_query_mean",
           "score_patterns", "SCORE_COLUMNS", "SITE_KINDS", "Progress"]

Progress = Callable[[str, int, int], None]  # fn(stage, done, total), called as forward passes finish


@dataclass
class Collected:
    """What one model's forward passes over a probe left for one detector.

    Attributes:
        batches: the probe's batches, in order (CPU).
        values: per batch, `{layer: reduce output}` (CPU).
        n_layers, n_heads: the model's shape.
        layers: the layers that hold attention, in the model's numbering (default: all
            `n_layers`; a hybrid's attention-free layers have no values).
    """

    batches: list[ProbeBatch]
    values: list[dict[int, torch.Tensor]]
    n_layers: int
    n_heads: int
    layers: Optional[tuple[int, ...]] = None

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(range(self.n_layers)) if self.layers is None else tuple(self.layers)

    def per_layer(self) -> dict[int, torch.Tensor]:
        """`{layer: [example, ...]}`: the batches' values joined on the example axis."""
        return {layer: torch.cat([b[layer] for b in self.values]) for layer in self.attention_layers}


@dataclass
class Finding:
    """A detector's contribution to an analysis.

    Attributes:
        rows: DataFrame with `SCORE_COLUMNS`, one row per head.
        names: `{(layer, head, detector): label}` where a head's label is not the detector's
            name ("positional:-2", "syntactic:obj").
        meta: entries added to the analysis's `meta` (e.g. "syntax_best").
        tables: extra tables set on the `Analysis` by attribute name (e.g. "syntax").
    """

    rows: pd.DataFrame
    names: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Detector:
    """A named head-scoring rule and what headscope needs to know about it.

    Attributes:
        name: registry key, also the label of heads that pass.
        probe: the probe it reads ("text", "repeated", "treebank"; `headscope.probes.kinds`).
        threshold: value at which a head gets this label.
        formula: the formula in words, for reports and docs.
        source: the paper (and what the threshold rests on).
        fn: `(pattern, batch) -> [batch, head]` per-example scores, `pattern` a
            `headscope.attention.pattern.Pattern`.
        applies_to: the kinds of attention site the detector reads (`SITE_KINDS`): "causal"
            (a decoder's self-attention), "bidirectional" (an encoder's), "cross" (decoder
            queries over encoder positions). Default: causal and bidirectional self-attention;
            next-token attention is bidirectional only, sink and uniform also read cross-attention,
            alignment only cross-attention (`registry.defaults_for`).
        lazy: `fn` reads the pattern only through entries and row statistics (`diagonal`,
            `column`, `mass`, `entropy`), which a `LazyPattern` computes without the map.
        row_entropy: `fn` reads each row's entropy (`entropy()`): on the lazy path the layer's
            kernel call computes it beside z where it can, instead of a second call.
        learned: passing claims the model learned the behaviour, so the label also needs the
            head's CI lower bound above the untrained control's best head (`headscope.detectors.labels`);
            False for resting behaviours (sink, uniform), which stay descriptive and yield to
            detectors with `outranks_resting`.
        outranks_resting: a head that passes this detector and a resting one is labelled by
            this one: it is measured on a probe built to show the behaviour (induction and
            duplicate-token heads rest on the first token of natural text).
        gate: what must reach `threshold`: "score" (the mean) or "ci_low" (its CI lower bound,
            for scores that are held-out estimates, like the syntactic margin).
        quantity: what the score is, in words, for report columns ("attention mass", ...).
        variants: suffixes of a detector that scores several variants at once (the offsets of
            `positional`): `fn` then returns `[batch, head, variant]`, each head keeps the
            variant of highest mean score and is labelled `name:<variant>`
            (`headscope.detectors.variants.best_variant`). Empty for one-score detectors.
        opt_in: run only when named (`detectors=[...]`, `--detectors`), not among the defaults.
        colour: the label's colour in reports (None: one of the report's spare colours).
        short: the abbreviation in label-map cells (None: the first five letters).
        icl_check: `headscope.validate` also measures the in-context learning score (Olsson et
            al. 2022) with this label's heads ablated.
        report_rule: `(topic, sentence)` the report adds to its labelling rules, with
            `{threshold:g}` and `{control}` (" and above the control's best head ..." or ".")
            filled in; empty for detectors the general rules cover.
        run: `(loaded, control, probe, seed, progress) -> Finding` for a detector that runs its
            own forward passes over its built probe (`control`: the twin `analyze` resolved, or
            None; `progress`: `fn(stage, done, total)` or None); `analyze` calls it instead of
            `reduce`/`finalize`. None for pattern detectors.
        ov_qualified: the label claims the head copies what it attends to, so the report
            qualifies it by the head's OV circuit ("copies" / "no OV copying",
            `headscope.detectors.labels.ov_qualifier`).
        report: the detector's own report section (`ReportSection`: its data read from the
            analysis's tables, figures, HTML, header lines, warnings); None for detectors the
            general sections cover.
    """

    name: str
    probe: str
    threshold: float
    formula: str
    source: str
    fn: Callable
    applies_to: tuple[str, ...] = ("causal", "bidirectional")
    lazy: bool = False
    row_entropy: bool = False
    learned: bool = True
    outranks_resting: bool = False
    gate: str = "score"
    quantity: str = "attention mass"
    variants: tuple[str, ...] = ()
    opt_in: bool = False
    colour: Optional[str] = None
    short: Optional[str] = None
    icl_check: bool = False
    report_rule: tuple[str, ...] = ()
    run: Optional[Callable] = None
    ov_qualified: bool = False
    report: Optional[ReportSection] = None

    def __post_init__(self):
        check_detector(self)

    @property
    def bidirectional_only(self) -> bool:
        """Whether it reads bidirectional self-attention but not causal (next-token attention);
        `applies_to` says which sites it reads."""
        return "bidirectional" in self.applies_to and "causal" not in self.applies_to

    def score(self, pattern, batch) -> torch.Tensor:
        """Per-example scores `[batch, head]` (`[batch, head, variant]` with `variants`) of one
        layer's pattern (a tensor `[batch, head, query, key]` or a `Pattern`). A batch on another
        device than the pattern's is read on the pattern's (a copy; `analyze` moves it once)."""
        pattern = as_pattern(pattern)
        if batch.input_ids.device != pattern.device:
            batch = batch.to(pattern.device)
        return self.fn(pattern, batch)

    def reduce(self, layer: int, pattern: Pattern, batch: ProbeBatch) -> torch.Tensor:
        """What `analyze` keeps of one layer's pattern on one batch: the per-example scores, fp32."""
        return self.score(pattern, batch).float()

    def finalize(self, model: Collected, control: Optional[Collected], probe, seed: int) -> Finding:
        """Mean over examples with a 95% bootstrap CI per head, and the control's scores (the
        same head's, `control`, and the best head's, `control_max`); NaN without a control."""
        values = model.per_layer()
        names = {}
        if self.variants:  # one score per head: its best variant, chosen per model
            values, chosen = best_variant(values, self.variants)
            names = {(l, h, self.name): f"{self.name}:{v}" for (l, h), v in chosen.items()}
        rows = self._bootstrap(values, model.attention_layers, model.n_heads, seed)
        if control is None:
            return Finding(rows.assign(control=float("nan"), control_max=float("nan")), names)
        twin = control.per_layer()
        if self.variants:
            twin, _ = best_variant(twin, self.variants)
        twin_rows = self._bootstrap(twin, model.attention_layers, model.n_heads, seed)
        return Finding(rows.assign(control=twin_rows.score.to_numpy(), control_max=float(twin_rows.score.max())), names)

    def _bootstrap(self, per_layer, layers: tuple[int, ...], n_heads: int, seed: int) -> pd.DataFrame:
        values = torch.stack([per_layer[layer] for layer in layers])  # (L, N, H), attention layers only
        rows = values.permute(0, 2, 1).reshape(len(layers) * n_heads, -1)  # (L*H, N)
        mean, low, high, n = bootstrap_mean_ci(rows, seed=seed)
        return pd.DataFrame({
            "layer": torch.tensor(layers).repeat_interleave(n_heads).numpy(),
            "head": torch.arange(n_heads).repeat(len(layers)).numpy(),
            "detector": self.name, "score": mean.numpy(), "ci_low": low.numpy(), "ci_high": high.numpy(),
            "n": n.numpy(),
        })

    def __call__(self, target, batch=None, **kwargs):
        """Score heads of patterns a notebook has at hand.

        - `detector(pattern, probe_batch)`: per-example scores `[batch, head]` (the pure form).
        - `detector(patterns, input_ids=None, attention_mask=None, causal=True, key_mask=None)`: patterns
          captured by the user (`cap.patterns`, a `{layer: [batch, head, query, key]}` dict, or
          one such tensor) -> DataFrame layer, head, detector, score (mean over examples);
          see `score_patterns`.
        A loaded model is scored by `headscope.analyze(loaded, detectors=[name])`: running a
        model is the pipeline's job, and a detector stays a function of patterns.
        """
        if self.run is not None:
            raise HeadscopeError(f"detector {self.name!r} runs its own forward passes on the {self.probe} probe; "
                                 f"score a loaded model with headscope.analyze(loaded, detectors=[{self.name!r}])")
        if batch is not None:
            return self.score(target, batch)
        if hasattr(target, "model") and hasattr(target, "tokenizer"):
            raise HeadscopeError(f"a detector scores patterns; score a loaded model with "
                                 f"headscope.analyze(loaded, detectors=[{self.name!r}]).scores")
        return score_patterns(self, target, **kwargs)

    def describe(self) -> dict:
        """What `meta["detectors"]` keeps of the detector (and the report reads)."""
        return {"formula": self.formula, "threshold": self.threshold, "source": self.source, "probe": self.probe,
                "learned": self.learned, "outranks_resting": self.outranks_resting, "gate": self.gate,
                "quantity": self.quantity, "variants": list(self.variants), "colour": self.colour,
                "short": self.short, "icl_check": self.icl_check, "report_rule": list(self.report_rule),
                "ov_qualified": self.ov_qualified}


GATES = ("score", "ci_low")


def check_detector(detector: Detector) -> None:
    """HeadscopeError naming the first field of `detector` that headscope could not use later
    (checked when a `Detector` is made, so a bad one never reaches `analyze` or a report)."""
    name = detector.name
    if not isinstance(name, str) or not name.strip() or name != name.strip() or any(c in name for c in ":,\n\r\t"):
        raise HeadscopeError(f"a detector name must be a non-empty string without ':', ',', tabs, line breaks "
                             f"or outer spaces, got {name!r}")
    where = f"detector {name!r}"
    if detector.probe not in PROBE_KINDS:
        raise HeadscopeError(f"{where}: unknown probe {detector.probe!r}; use one of {', '.join(PROBE_KINDS)}")
    threshold = detector.threshold
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold):
        raise HeadscopeError(f"{where}: threshold must be a finite number, got {threshold!r}")
    if not callable(detector.fn):
        raise HeadscopeError(f"{where}: fn must be a function (pattern, batch) -> [batch, head], got {detector.fn!r}")
    if detector.run is not None and not callable(detector.run):
        raise HeadscopeError(f"{where}: run must be a function or None, got {detector.run!r}")
    kinds = detector.applies_to
    if not isinstance(kinds, tuple) or not kinds or not all(kind in SITE_KINDS for kind in kinds) \
            or len(set(kinds)) != len(kinds):
        raise HeadscopeError(f"{where}: applies_to must be a non-empty tuple of distinct site kinds from "
                             f"{', '.join(SITE_KINDS)}, got {kinds!r}")
    if detector.gate not in GATES:
        raise HeadscopeError(f"{where}: gate must be one of {', '.join(GATES)}, got {detector.gate!r}")
    for field_name in ("formula", "source", "quantity"):
        if not isinstance(getattr(detector, field_name), str):
            raise HeadscopeError(f"{where}: {field_name} must be a string, got {getattr(detector, field_name)!r}")
    if not isinstance(detector.variants, tuple) or not all(isinstance(v, str) and v for v in detector.variants):
        raise HeadscopeError(f"{where}: variants must be a tuple of non-empty strings, got {detector.variants!r}")
    if detector.short is not None and (not isinstance(detector.short, str) or not detector.short.strip()):
        raise HeadscopeError(f"{where}: short must be a non-empty string or None, got {detector.short!r}")
    if detector.colour is not None and not is_colour(detector.colour):
        raise HeadscopeError(f"{where}: colour {detector.colour!r} is not a colour; use a CSS name ('teal'), "
                             f"'#1f77b4' or 'rgb(31, 119, 180)'")
    rule = detector.report_rule
    if not isinstance(rule, tuple) or len(rule) not in (0, 2) or not all(isinstance(part, str) for part in rule):
        raise HeadscopeError(f"{where}: report_rule must be () or a (topic, sentence) pair of strings, got {rule!r}")
    if detector.report is not None and not isinstance(detector.report, ReportSection):
        raise HeadscopeError(f"{where}: report must be a ReportSection or None, got {type(detector.report).__name__}")


def is_colour(value) -> bool:
    """Whether plotly (and so the report) accepts `value` as one colour."""
    if not isinstance(value, str):
        return False
    try:
        from _plotly_utils.basevalidators import ColorValidator  # plotly's own check, without importing plotly
    except ImportError:  # a plotly that moved it: the report's own check remains
        return bool(value.strip())
    return ColorValidator.perform_validate_coerce(value) is not None


def resolve(spec: str) -> Detector:
    """A detector by registered name, or by `mypkg.module:name`: the module is imported (a
    module that defines detectors registers them as it loads) and its attribute `name`, a
    `Detector`, is registered if it is not yet. How `--detectors` finds your own detectors.
    """
    if ":" not in spec:
        return get(spec)
    module_name, attribute = spec.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise HeadscopeError(f"cannot import {module_name!r} for detector {spec!r}: {err}") from None
    except Exception as err:  # the module itself fails: a SyntaxError, an error raised at import
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) and err.lineno else ""
        raise HeadscopeError(f"importing {module_name!r} for detector {spec!r} failed{where}: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}; fix that module") from None
    found = getattr(module, attribute, None)
    if not isinstance(found, Detector):
        raise HeadscopeError(f"{spec!r} is not a detector: {module_name} has no Detector named {attribute!r}")
    return found if REGISTRY.get(found.name) is found else register(found)


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


def score_patterns(detector: Detector, patterns, input_ids=None, attention_mask=None, causal: bool = True,
                   content_start: int = 0, key_mask=None):
    """Mean score per head of captured patterns.

    Args:
        detector: a `Detector`.
        patterns: `{layer: [batch, head, query, key]}` (e.g. `cap.patterns`) or one tensor
            (`[batch, head, query, key]` or `[head, query, key]`, reported as layer 0).
        input_ids: `[batch, pos]` tokens the patterns were computed on; needed by detectors
            that compare tokens (induction, duplicate_token).
        attention_mask: `[batch, pos]`, 1 for real tokens (default all real).
        causal: whether the model was causal.
        content_start: index of the first non-special token (1 after a BOS).
        key_mask: `[batch, key]` the encoder's attention mask, 1 for real positions: the
            patterns are cross-attention (decoder queries, `input_ids` and `attention_mask`
            the decoder's). Patterns with more keys than queries are read as cross-attention
            with every key real when it is not given.
    Returns:
        pandas DataFrame layer, head, detector, score (and variant, the head's best one, for
        detectors with variants such as positional).
    """
    layers = patterns if isinstance(patterns, dict) else {0: patterns}
    rows = []
    for layer, pattern in layers.items():
        pattern = pattern[None] if pattern.dim() == 3 else pattern  # (B, H, Q, K)
        b, _, q, k = pattern.shape
        ids = input_ids
        if ids is None:
            if detector.probe == "repeated":
                raise HeadscopeError(f"detector {detector.name!r} compares tokens: pass input_ids=")
            ids = torch.zeros(b, q, dtype=torch.long)
        ids = torch.as_tensor(ids).reshape(b, q).to(pattern.device)
        mask = (torch.ones_like(ids, dtype=torch.bool) if attention_mask is None
                else torch.as_tensor(attention_mask).bool().to(pattern.device))
        keys = None
        if key_mask is not None or k != q:  # cross-attention: keys over the encoder's positions
            keys = (torch.ones(b, k, dtype=torch.bool, device=pattern.device) if key_mask is None
                    else torch.as_tensor(key_mask).bool().reshape(b, k).to(pattern.device))
        batch = ProbeBatch(ids, mask, causal and keys is None, content_start, key_mask=keys)
        per_example = detector.score(pattern.float(), batch)  # (B, H[, V])
        chosen = {}
        if detector.variants:
            scores, chosen = best_variant({int(layer): per_example}, detector.variants)
            per_example = scores[int(layer)]
        means = per_example.nanmean(dim=0)
        rows += [{"layer": int(layer), "head": h, "detector": detector.name, "score": float(s),
                  **({"variant": chosen[(int(layer), h)]} if chosen else {})}
                 for h, s in enumerate(means.tolist())]
    columns = ["layer", "head", "detector", "score"] + (["variant"] if detector.variants else [])
    return pd.DataFrame(rows, columns=columns)
