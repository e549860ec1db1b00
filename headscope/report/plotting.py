"""Plotly figures for notebooks and scripts, drawn by the report's own figure builders.

- `plot_labels(analysis)`: the label map (layer x head, coloured by label).
- `plot_scores(analysis, detector)`: one detector's scores, titled with their quantity, with the 95%
  CI and the control's scores in the hover.
- `plot_head(analysis, layer, head, probe=None, example=0)`: a head's pattern on a stored
  example, tokens on the axes (the report's head explorer, drawn in Python).
- `plot_section(source, detector)`: a detector's own report figure (`ReportSection.plot`);
  `plot_syntax(source)` is the syntactic detector's: best head per dependency relation vs its
  best baseline (offsets, position predictors, the control's best head), from an `Analysis`
  with syntax scores or a `headscope.detectors.syntax.standalone.SyntaxResult`.
- `plot_geometry_map(analysis)`, `plot_pruning(analysis)`: the report's MDS map of heads coloured
  by label and its pruning curve, from an analysis holding geometry (`headscope.add_geometry`).
- `plot_pattern(pattern, tokens, title=None, head=None, key_tokens=None)`: any captured map, e.g.
  `cap.patterns[layer][0]` (`[head, query, key]`, pick `head=`) or one `[query, key]` map;
  a cross-attention map takes the encoder's tokens as `key_tokens`.

Every function returns a `plotly.graph_objects.Figure` whose numbers are the report's
(`headscope.report.report_data`). plotly is imported only when a figure is built.
"""
from __future__ import annotations

import html
from typing import Optional

import numpy as np

from ..detectors.registry import report_section
from ..errors import HeadscopeError
from .data import detector_grids, label_grid
from .geometry_data import geometry_data
from .geometry_figures import geometry_map_figure, pruning_figure
from .figures import detector_figure, label_map_figure, pattern_figure
from .html import axis_tokens

__all__ = ["plot_labels", "plot_scores", "plot_head", "plot_section", "plot_syntax", "plot_pattern",
           "plot_geometry_map", "plot_pruning"]


def plot_labels(analysis):
    """The label map of an analysis, titled with the model's name.

    Args:
        analysis: a `headscope.analysis.Analysis`.
    Returns:
        A plotly `go.Figure` (`z` holds category numbers, `customdata` every detector's score).
    """
    return label_map_figure(label_grid(analysis), title=_plotly_text(str(analysis.meta.get("model", ""))))


def _geometry(analysis):
    data = geometry_data(analysis)
    if data is None:
        raise HeadscopeError("this analysis holds no geometry; attach it with headscope.add_geometry(analysis, loaded)")
    return data


def plot_geometry_map(analysis):
    """Every head on the MDS map of attention-pattern similarity, coloured by label (the report's map).

    Args:
        analysis: an `Analysis` with `.geometry`.
    Returns:
        A plotly `go.Figure`; each point's `customdata` is `[layer, head]`.
    Raises:
        HeadscopeError: the analysis holds no geometry.
    """
    return geometry_map_figure(_geometry(analysis), label_grid(analysis))


def plot_pruning(analysis):
    """Loss as heads are removed in importance order vs random orders (the report's curve).

    Raises:
        HeadscopeError: the analysis holds no geometry, or no pruning curve (no LM loss).
    """
    data = _geometry(analysis)
    if not data.curve:
        raise HeadscopeError("this analysis's geometry has no pruning curve (it needs a causal LM)")
    return pruning_figure(data)


def plot_scores(analysis, detector: str):
    """One detector's `[layer, head]` scores as a heatmap.

    Args:
        analysis: a `headscope.analysis.Analysis`.
        detector: a detector name from `analysis.detectors`, e.g. "induction".
    Returns:
        A plotly `go.Figure`.
    Raises:
        HeadscopeError: the analysis has no scores for `detector`.
    """

    for grid in detector_grids(analysis):
        if grid.detector == detector:
            return detector_figure(grid)
    raise HeadscopeError(f"this analysis has no scores for {detector!r}; detectors: {', '.join(analysis.detectors)}")


def plot_head(analysis, layer: int, head: int, probe: Optional[str] = None, example: int = 0):
    """One head's attention pattern on an example stored in the analysis.

    Args:
        analysis: a `headscope.analysis.Analysis` with `examples` (`analyze(explorer_examples=...)`).
        layer, head: the head.
        probe: only examples of this probe ("text", "repeated", ...); default: all, in stored order.
        example: position among those examples (0 = first).
    Returns:
        A plotly `go.Figure`: query on y, key on x (at cross-attention the decoder's and the
        encoder's tokens, `Example.key_tokens`), titled with the head's label.
    Raises:
        HeadscopeError: no such head or example.
    """

    if not (0 <= layer < analysis.n_layers and 0 <= head < analysis.n_heads):
        raise HeadscopeError(f"no head {layer}.{head}: the model has {analysis.n_layers} layers x {analysis.n_heads} heads")
    chosen = [e for e in analysis.examples if probe is None or e.probe == probe]
    if not 0 <= example < len(chosen):
        stored = ", ".join(sorted({e.probe for e in analysis.examples})) or "none"
        raise HeadscopeError(f"no example {example} of probe {probe or 'any'}: this analysis stores "
                             f"{len(chosen)} such examples (probes: {stored})")
    shown = chosen[example]
    grid = label_grid(analysis)
    label, passing = grid.labels[layer][head] or "no label", grid.passing[layer][head]
    title = f"layer {layer} head {head} — {label}" + (f" ({passing})" if passing and passing != label else "")
    title += f" · {shown.probe} #{shown.index}"
    return _pattern_figure(shown.pattern(layer, head), shown.tokens, _plotly_text(title), shown.key_tokens)


def plot_syntax(source):
    """Best head per dependency relation next to its best baseline (the report's figure).

    Args:
        source: an `Analysis` whose `syntax` is set, or a `headscope.detectors.syntax.standalone.SyntaxResult`.
    Returns:
        A plotly `go.Figure`; the head bars' `customdata` is `[layer, head]`.
    Raises:
        HeadscopeError: an analysis without syntax scores.
    """
    return plot_section(source, "syntactic")


def plot_section(source, detector: str):
    """A detector's own report figure (`Detector.report.plot`), e.g. the syntactic detector's bars.

    Args:
        source: an `Analysis`, or a result the detector's section knows how to draw.
        detector: a registered detector name.
    Returns:
        A plotly `go.Figure`.
    Raises:
        HeadscopeError: the detector has no report section, or `source` lacks its table.
    """
    section = report_section(detector)
    if section is None:
        raise HeadscopeError(f"detector {detector!r} has no report section of its own")
    return section.plot(source)


def plot_pattern(pattern, tokens, title: Optional[str] = None, head: Optional[int] = None, key_tokens=None):
    """Any attention map with its tokens on the axes.

    Args:
        pattern: `[query, key]`, or `[head, query, key]` with `head=` (e.g. `cap.patterns[layer][0]`);
            a torch tensor (any device or dtype) or an array.
        tokens: one string per position, e.g. `[tokenizer.decode([t]) for t in input_ids[0]]`;
            the queries' only where `key_tokens` is given.
        title: figure title (plain text; escaped here).
        head: which head of a `[head, query, key]` map.
        key_tokens: one string per key position where the keys are other tokens than the
            queries (cross-attention: the encoder's input, e.g. `cap.patterns` of
            `capture(model, sites="decoder.cross")`).
    Returns:
        A plotly `go.Figure`: query on y, key on x.
    Raises:
        HeadscopeError: a shape that does not match the tokens, or a missing or bad `head`.
    """
    values = _as_array(pattern)
    if values.ndim == 3:
        if head is None:
            raise HeadscopeError(f"pattern has shape {tuple(values.shape)} [head, query, key]: pass head=")
        if not 0 <= head < values.shape[0]:
            raise HeadscopeError(f"head {head} is out of range: the pattern has {values.shape[0]} heads")
        values = values[head]
    elif values.ndim != 2:
        hint = " (index the batch first, e.g. cap.patterns[layer][0])" if values.ndim == 4 else ""
        raise HeadscopeError(f"pattern must be [query, key] or [head, query, key], got shape {tuple(values.shape)}{hint}")
    elif head is not None:
        raise HeadscopeError("head= needs a [head, query, key] pattern; this one is [query, key]")
    tokens = [str(t) for t in tokens]
    key_tokens = None if key_tokens is None else [str(t) for t in key_tokens]
    keys = tokens if key_tokens is None else key_tokens
    if values.shape != (len(tokens), len(keys)):
        fits = (f"{len(tokens)} tokens" if key_tokens is None
                else f"{len(tokens)} query and {len(key_tokens)} key tokens")
        raise HeadscopeError(f"a [query, key] pattern of shape {tuple(values.shape)} does not fit {fits}")
    return _pattern_figure(values, tokens, _plotly_text(title or ""), key_tokens)


def _pattern_figure(pattern, tokens: list, title: str, key_tokens=None):
    """The report's explorer figure, with tokens shown exactly as the report's explorer shows them."""

    shown, ticks = axis_tokens(tokens)
    if key_tokens is None:
        return pattern_figure(pattern, shown, ticks, title)
    key_shown, key_ticks = axis_tokens(key_tokens)
    return pattern_figure(pattern, shown, ticks, title, key_shown, key_ticks)


def _as_array(pattern) -> np.ndarray:
    if hasattr(pattern, "detach"):  # a torch tensor, possibly on a GPU or in bfloat16
        pattern = pattern.detach().float().cpu().numpy()
    return np.asarray(pattern, dtype=np.float64)


def _plotly_text(text: str) -> str:
    """Plain text made safe for plotly's pseudo-HTML (titles)."""
    return html.escape(text, quote=False)
