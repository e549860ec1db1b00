"""The syntactic detector's part of the report (`Detector.report` of `syntactic`).

- `SyntaxSection`: the `headscope.detectors.section.ReportSection` the report asks for: its data,
  figure, HTML, the "Treebank" header line and the skipped-detector warning of older analyses.
- `syntax_best(analysis)`: the best head per relation (`SyntaxBest`), from `meta["syntax_best"]`
  or the `syntax` table.
- `syntax_relations(analysis)`: every significant relation of each head labelled syntactic
  (`SyntaxRelation`).
- `syntax_figure(rows)`: best head per relation vs its baseline (grouped bars), div `SYNTAX_ID`.
- `treebank_text(meta)`: the treebank and how many of its sentences are natural.
- Types: `SyntaxData` (the section's data), `SyntaxBest`, `SyntaxRelation`.
"""
from __future__ import annotations

import html
from types import SimpleNamespace
from typing import NamedTuple, Optional

import numpy as np

from ...errors import HeadscopeError
from ..section import (
    ReportSection, analysis_table, cell_flag, cell_number, cell_text, figure_style, plotly_text,
)

__all__ = ["FEW_ARCS", "SECTION", "SyntaxSection", "SyntaxData", "SyntaxBest", "SyntaxRelation", "syntax_best", "syntax_relations",
           "syntax_figure", "treebank_text", "SYNTAX_ID", "SYNTAX_TABLE"]

SYNTAX_ID = "hs-syntax"
SYNTAX_TABLE = "syntax"  # the analysis table the detector's finalize leaves (`Finding.tables`)
FEW_ARCS = "no head is labelled syntactic"  # in the note of a treebank too small for the held-out rule


class SyntaxBest(NamedTuple):
    """The most accurate head for one dependency relation and the baseline it must beat."""

    relation: str
    layer: int
    head: int
    direction: str
    accuracy: float
    baseline_accuracy: float
    baseline_kind: str  # the predictor that sets the baseline ("offset -1", "control 2.3", ...)
    n: int
    held_out_margin: float  # NaN when the pair was chosen on neither half
    significant: bool


class SyntaxRelation(NamedTuple):
    """One significant (relation, direction) of a head labelled syntactic (a `syntax` table row)."""

    layer: int
    head: int
    label: str  # the head's label ("syntactic:<its clearest relation>")
    relation: str
    direction: str
    accuracy: float
    baseline: float
    baseline_kind: str
    held_out_margin: float
    ci_low: float
    ci_high: float
    n: int


class SyntaxData(NamedTuple):
    """The syntactic section's data; its fields read as `ReportData.syntax_best` etc."""

    syntax_best: Optional[tuple]  # SyntaxBest; None when the analysis has no syntax scores
    syntax_relations: Optional[tuple]  # SyntaxRelation; None when the analysis has no syntax scores
    syntax_notes: tuple  # str: caveats of the syntactic detector (meta["syntax_notes"])


def syntax_best(analysis) -> Optional[tuple]:
    """Best head per relation: `meta["syntax_best"]` if present, else the argmax of the `syntax` table.

    Returns:
        `SyntaxBest` rows, or None when the analysis has no `syntax` table.
    """
    table = analysis_table(analysis, SYNTAX_TABLE)
    if table is None:
        return None
    stored = analysis.meta.get("syntax_best")
    if stored:
        return tuple(
            SyntaxBest(str(b["relation"]), int(b["layer"]), int(b["head"]), str(b["direction"]), float(b["accuracy"]),
                       float(b["baseline_accuracy"]), cell_text(b.get("baseline_kind")), int(b["n"]),
                       cell_number(b.get("held_out_margin")), cell_flag(b.get("significant", False)))
            for b in stored
        )
    frame = table.sort_values(["relation", "accuracy", "layer", "head", "direction"],
                              ascending=[True, False, True, True, True])
    best = frame.groupby("relation", sort=True).head(1)
    return tuple(
        SyntaxBest(str(r.relation), int(r.layer), int(r.head), str(r.direction), float(r.accuracy),
                   float(r.baseline), cell_text(getattr(r, "baseline_kind", "")), int(r.n),
                   float(getattr(r, "held_out_margin", np.nan)), cell_flag(getattr(r, "significant", False)))
        for r in best.itertuples(index=False)
    )


def syntax_relations(analysis) -> Optional[tuple]:
    """Every significant (relation, direction) of each head labelled syntactic, clearest first.

    Returns:
        `SyntaxRelation` rows ordered by layer, head, then CI lower bound (highest first); None when
        the analysis has no syntax scores or they have no `significant` column.
    """
    table = analysis_table(analysis, SYNTAX_TABLE)
    if table is None or "significant" not in table:
        return None
    labels = {(int(r.layer), int(r.head)): str(r.label) for r in analysis.labels.itertuples(index=False)
              if str(r.label).startswith("syntactic:")}
    keep = [cell_flag(s) and (int(l), int(h)) in labels
            for s, l, h in zip(table["significant"], table["layer"], table["head"])]
    chosen = table[np.array(keep, dtype=bool)]
    chosen = chosen.sort_values(["layer", "head", "ci_low", "held_out_margin"], ascending=[True, True, False, False])
    return tuple(
        SyntaxRelation(int(r.layer), int(r.head), labels[(int(r.layer), int(r.head))], str(r.relation), str(r.direction),
                       float(r.accuracy), float(r.baseline), cell_text(getattr(r, "baseline_kind", "")),
                       float(r.held_out_margin), float(r.ci_low), float(r.ci_high), int(r.n))
        for r in chosen.itertuples(index=False)
    )


def treebank_text(meta: dict) -> Optional[str]:
    """The treebank and how many of its sentences are natural, or None when no treebank was read."""
    treebank = meta.get("treebank")
    if not treebank:
        return None
    natural = treebank.get("natural")
    count = treebank.get("n_sentences", "?")
    natural_text = "natural: unknown" if natural is None else f"{natural} natural"
    return f"{treebank.get('source', '?')}: {count} sentences, {natural_text}"


def syntax_figure(rows):
    """Best head's accuracy per relation next to the best baseline's.

    Args:
        rows: `SyntaxBest` rows.
    Returns:
        A plotly `go.Figure`; the head bars carry `customdata = [layer, head]` for the explorer.
    """
    import plotly.graph_objects as go

    relations = [plotly_text(r.relation) for r in rows]
    heads = [f"L{r.layer} H{r.head}" for r in rows]
    fig = go.Figure([
        go.Bar(name="best head", x=relations, y=[round(r.accuracy, 4) for r in rows], text=heads,
               textposition="outside", marker_color="#1f77b4", customdata=[[r.layer, r.head] for r in rows],
               hovertemplate="%{x}: layer %{customdata[0]} head %{customdata[1]}<br>accuracy %{y:.3f}<extra></extra>"),
        go.Bar(name="baseline", x=relations, y=[round(r.baseline_accuracy, 4) for r in rows], marker_color="#bdbdbd",
               text=[plotly_text(r.baseline_kind) for r in rows], textposition="none",
               hovertemplate="%{x}: baseline (%{text}) accuracy %{y:.3f}<extra></extra>"),
    ])
    fig.update_layout(
        title={"text": "Best head per relation vs baseline"}, barmode="group", yaxis={"range": [0, 1.08], "title": {"text": "accuracy"}},
        height=320, width=max(420, 90 * len(rows) + 160), margin={"l": 60, "r": 20, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.2}, **figure_style(),
    )
    return fig


class SyntaxSection(ReportSection):
    """The "Syntactic heads" section: best head per relation against its baseline (table and
    bars), every significant relation of the heads labelled syntactic, the treebank in the header."""

    def data(self, analysis) -> SyntaxData:
        return SyntaxData(syntax_best(analysis), syntax_relations(analysis),
                          tuple(str(n) for n in analysis.meta.get("syntax_notes", [])))

    def figures(self, data: SyntaxData) -> list:
        return [] if data.syntax_best is None else [(SYNTAX_ID, syntax_figure(data.syntax_best))]

    def header(self, meta: dict) -> list:
        treebank = treebank_text(meta)
        return [] if treebank is None else [("Treebank", treebank)]

    def warnings(self, meta: dict) -> list:
        notes = [str(note) for note in meta.get("syntax_notes", [])]
        if "syntactic" in meta.get("detectors", {}):  # analyses saved before "skipped_detectors" say it in the notes
            return [note for note in notes if FEW_ARCS in note]  # a small treebank: scored, but no label possible
        return [note for note in notes if "skipped" in note]

    def plot(self, source):
        """`headscope.report.plotting.plot_syntax`: from an `Analysis` with syntax scores or a
        `headscope.detectors.syntax.standalone.SyntaxResult` (its `table` and `best`)."""
        if hasattr(source, "best") and hasattr(source, "table"):  # a SyntaxResult
            # The same rows the report reads from an analysis's meta["syntax_best"].
            source = SimpleNamespace(tables={SYNTAX_TABLE: source.table},
                                     meta={"syntax_best": source.best.to_dict("records")})
        rows = syntax_best(source)
        if rows is None:
            raise HeadscopeError("this analysis has no syntax scores: run the syntactic detector (headscope.run_syntax)")
        return syntax_figure(rows)

    def html(self, data: SyntaxData, kit) -> str:
        if data.syntax_best is None:
            return ""
        rows = [[r.relation, kit.head_button(r.layer, r.head), r.direction, r.accuracy, r.baseline_accuracy,
                 r.baseline_kind, r.accuracy - r.baseline_accuracy,
                 None if r.held_out_margin != r.held_out_margin else r.held_out_margin,
                 "yes" if r.significant else "no", r.n]
                for r in data.syntax_best]
        parts = [
            "<section id=\"syntax\"><h2>Syntactic heads</h2><p class=\"hint\">Most accurate head per dependency "
            "relation (Clark et al. 2019, Table 1) against the best baseline: fixed offsets, first, last and "
            "most-pieces word, nearest content words, and the control model's best head. Accuracy and baseline are "
            "shares of arcs on all sentences; the held-out margin is measured on the half of the sentences the "
            "relation was not chosen on (empty when it was chosen on neither half).</p>",
            *[f"<p class=\"hint\">{html.escape(note)}</p>" for note in data.syntax_notes],
            kit.figure_div(SYNTAX_ID),
            kit.table(["relation", "head", "direction", "accuracy", "baseline accuracy", "baseline",
                       "margin (all sentences)", "held-out margin", "significant", "arcs"], rows),
        ]
        if data.syntax_relations:
            parts += [
                "<h3>Every significant relation of the heads labelled syntactic</h3><p class=\"hint\">A head's label "
                "names its clearest relation (highest CI lower bound of the held-out margin); the others it is "
                "significant for are listed here too.</p>",
                kit.table(["head", "label", "relation", "direction", "held-out margin", "95% CI low", "95% CI high",
                           "accuracy", "baseline accuracy", "baseline", "arcs"],
                          [[kit.head_button(r.layer, r.head), r.label, r.relation, r.direction, r.held_out_margin,
                            r.ci_low, r.ci_high, r.accuracy, r.baseline, r.baseline_kind, r.n]
                           for r in data.syntax_relations]),
            ]
        parts.append("</section>")
        return "\n".join(parts)


SECTION = SyntaxSection()  # the syntactic detector's section (`Detector.report`, `registry.BUILTINS`)
