"""The HTML writer: turns `ReportData` (and figures built from it) into one self-contained page.

- `render_report(data, plotlyjs)`: the analysis report page as a string.
- Building blocks shared with the compare page: `page(...)`, `table(headers, rows)`, `Raw`,
  `figure_div(id)`, `header_list(fields)`, `head_button(layer, head)`, `script_json(obj)`,
  `plotlyjs_tag(mode)`, `check_plotlyjs(mode)`.

Every text from the analysis goes through `html.escape` (or `textContent` in the script); JSON
placed in `<script>` blocks has `<`, `>` and `&` as `\\u` escapes, so a token such as
`</script>` cannot end the block. plotly.js appears once per page: inline ("embed") or as one
`<script src>` ("cdn"). The output depends only on the data, so two renders of one analysis
differ only in the line holding `meta["created"]`.
"""
from __future__ import annotations

import base64
import html
import json
import zlib

import numpy as np

from ..detectors.section import Kit
from ..errors import HeadscopeError, UsageError
from . import figures
from .index import BACK_SLOT, BACK_SLOT_END
from .composition_data import KIND_NAMES
from .composition_figures import composition_figures, composition_id
from .geometry_figures import GEOMETRY_MAP_ID, IMPORTANCE_ID, PRUNING_ID, geometry_figures
from .script import EXPLORER_JS, PLOT_JS

__all__ = ["render_report", "axis_tokens", "page", "table", "Raw", "figure_div", "header_list", "head_button",
           "script_json", "plotlyjs_tag", "check_plotlyjs", "PLOTLYJS_MODES", "example_payload"]

PLOTLYJS_MODES = ("embed", "cdn")
LABEL_RANK_HEADS = 6  # heads listed per label in the importance-rank table
TICK_CHARS = 14  # longer tokens are cut on the explorer's axes (the hover shows them whole)

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 0 24px 40px;
       color: #222; font-size: 14px; }
h1 { font-size: 22px; margin: 18px 0 8px; } h2 { font-size: 17px; margin: 22px 0 6px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
dl.meta dt { font-weight: 600; color: #555; } dl.meta dd { margin: 0; }
p.created, p.hint { color: #666; font-size: 12px; margin: 4px 0; }
.layout { display: grid; grid-template-columns: minmax(0, 1fr) 560px; gap: 24px; align-items: start; }
.layout aside { position: sticky; top: 8px; border: 1px solid #ddd; border-radius: 6px; padding: 0 12px 8px; }
@media (max-width: 1150px) { .layout { grid-template-columns: minmax(0, 1fr); } .layout aside { position: static; } }
.figures { display: flex; flex-wrap: wrap; gap: 6px; }
.figure { max-width: 100%; overflow-x: auto; overflow-y: hidden; }
section table { display: block; max-width: 100%; overflow-x: auto; }
.columns { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 0 24px; }
#hs-explorer-title { font-weight: 600; font-size: 15px; margin: 6px 0; }
#hs-error { color: #b00020; font-weight: 600; }
table { border-collapse: collapse; margin: 6px 0; } th, td { padding: 3px 10px; text-align: left; }
th { border-bottom: 2px solid #ccc; } td { border-bottom: 1px solid #eee; } td.num { text-align: right; }
code { font-size: 12px; } .swatch { display: inline-block; width: 11px; height: 11px; margin-right: 6px;
  vertical-align: -1px; border: 1px solid #999; }
button.head { font: inherit; padding: 0 6px; cursor: pointer; border: 1px solid #bbb; border-radius: 3px; background: #f7f7f7; }
.note { background: #fff6db; border-left: 4px solid #f0c040; padding: 6px 10px; }
.note.warning { background: #fde8e8; border-left-color: #d62728; font-weight: 600; }
nav.hs-index { margin: 10px 0 0; font-size: 13px; } nav.hs-index a { color: #1f5fa8; }
.nowrap { white-space: nowrap; } .ov-note { font-size: 12px; color: #555; } h3 { font-size: 15px; margin: 14px 0 4px; } ul.rules { margin: 4px 0 8px; padding-left: 20px; max-width: 980px; }
"""


class Raw(str):
    """Trusted HTML that `table` inserts without escaping (built from escaped parts only)."""


def render_report(data, plotlyjs: str = "embed") -> str:
    """The analysis report page.

    Args:
        data: a `ReportData`.
        plotlyjs: "embed" (inline, works offline) or "cdn" (one `<script src>`).
    Returns:
        The page's HTML.
    """
    check_plotlyjs(plotlyjs)  # fail before any work
    figs = [(figures.LABEL_MAP_ID, figures.label_map_figure(data.label_grid))]
    figs += [(figures.detector_id(i), figures.detector_figure(g)) for i, g in enumerate(data.detector_grids)]
    figs += [fig for s in data.sections for fig in s.section.figures(s.data)]  # the detectors' own
    if data.validation is not None:
        figs.append((figures.VALIDATION_ID, figures.validation_figure([r for r in data.validation if r.primary])))
    if data.geometry is not None:
        figs += geometry_figures(data.geometry, data.label_grid)
    pairs = composition_figures(data.composition) if data.composition is not None else []
    figs += pairs
    figs.append((figures.EXPLORER_ID, figures.explorer_figure()))
    # The validation bars stand for several heads each, the pruning curve for many, a composition cell
    # for two: clicking them opens nothing.
    unclickable = {figures.EXPLORER_ID, figures.VALIDATION_ID, PRUNING_ID, *(fig_id for fig_id, _ in pairs)}
    clickable = [fig_id for fig_id, _ in figs if fig_id not in unclickable]

    grid = data.label_grid
    initial = (data.top_heads[0].layer, data.top_heads[0].head) if data.top_heads else (0, 0)
    body = [
        f"<header>\n<h1>headscope report: {html.escape(data.title)}</h1>",
        header_list(data.header),
        f"<p class=\"created\">Created {html.escape(data.created)}</p>",
        *[f"<p class=\"note warning\">{html.escape(w)}</p>" for w in data.warnings],
        "<p id=\"hs-error\"></p>\n</header>",
        "<div class=\"layout\">\n<div>",
        "<section id=\"labels\"><h2>Label map</h2><p class=\"hint\">Each head's label (hover: every "
        "detector's score, named by its quantity, with its 95% CI and the control model's score for the same head "
        "and its best head). Click a cell to see the head's attention.</p>",
        figure_div(figures.LABEL_MAP_ID), "</section>",
        "<section id=\"detectors\"><h2>Detector scores</h2><p class=\"hint\">One heatmap per detector, "
        "titled with what its score is; click a cell to explore the head.</p>\n<div class=\"figures\">",
        *[figure_div(figures.detector_id(i)) for i in range(len(data.detector_grids))],
        "</div>\n</section>\n</div>",
        _explorer_section(data, initial),
        "</div>",
        _top_heads_section(data),
        _ov_section(data),
        *[s.section.html(s.data, _kit()) for s in data.sections],
        _validation_section(data),
        _geometry_section(data),
        _composition_section(data),
        _method_section(data),
    ]
    explorer_payload = {
        "explorer": figures.EXPLORER_ID, "labelMap": figures.LABEL_MAP_ID, "clickable": clickable,
        "n_layers": data.n_layers, "n_heads": data.n_heads, "initial": list(initial),
        "labels": [list(row) for row in grid.labels], "passing": [list(row) for row in grid.passing],
        "examples": [example_payload(e) for e in data.examples],
    }
    return page(f"headscope: {data.title}", "\n".join(body), figs, plotlyjs,
                json_blocks={"hs-explorer-data": explorer_payload}, scripts=[EXPLORER_JS])


def page(title: str, body: str, figs: list, plotlyjs: str, *, json_blocks: dict | None = None,
         scripts: list | None = None) -> str:
    """A whole page: CSS, an empty slot for the link back to an index (`report/index.py`), body,
    the figures' JSON, plotly.js once, then the scripts.

    Args:
        title: the `<title>` text (escaped here).
        body: trusted HTML.
        figs: `(div_id, go.Figure)` pairs; each id needs a `figure_div` in `body`.
        plotlyjs: "embed" or "cdn".
        json_blocks: `{element_id: object}` written as `<script type="application/json">`.
        scripts: JavaScript run after the figures are drawn (see `script.PLOT_JS`).
    Returns:
        The page's HTML.
    """
    import plotly.io as pio

    for _, fig in figs:
        figures.clear_of_toolbar(fig)
    figures_json = "[" + ",".join(f"[{json.dumps(fig_id)},{pio.to_json(fig, validate=False)}]" for fig_id, fig in figs) + "]"
    blocks = [f"<script type=\"application/json\" id=\"hs-figures\">{_script_safe(figures_json)}</script>"]
    blocks += [f"<script type=\"application/json\" id=\"{block_id}\">{script_json(obj)}</script>"
               for block_id, obj in (json_blocks or {}).items()]
    return "\n".join([
        "<!DOCTYPE html>", "<html lang=\"en\">", "<head>", "<meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
        BACK_SLOT + BACK_SLOT_END,  # `headscope report --index` fills in the link to its index
        body, *blocks, plotlyjs_tag(plotlyjs), f"<script>{PLOT_JS}</script>",
        *[f"<script>{js}</script>" for js in scripts or []], "</body>", "</html>", "",
    ])


def check_plotlyjs(mode: str) -> None:
    """Raise `HeadscopeError` unless `mode` is one of `PLOTLYJS_MODES`."""

    if mode not in PLOTLYJS_MODES:
        raise UsageError(f"plotlyjs must be one of {', '.join(PLOTLYJS_MODES)}, not {mode!r}")


def plotlyjs_tag(mode: str) -> str:
    """plotly.js as one inline `<script>` ("embed") or a versioned CDN `<script src>` ("cdn")."""
    import plotly.offline

    check_plotlyjs(mode)
    if mode == "embed":
        return f"<script charset=\"utf-8\">{plotly.offline.get_plotlyjs()}</script>"
    version = plotly.offline.get_plotlyjs_version()
    return f"<script src=\"https://cdn.plot.ly/plotly-{version}.min.js\" charset=\"utf-8\"></script>"


def table(headers: list, rows: list, *, css_class: str = "") -> str:
    """An HTML table; cells are escaped unless `Raw`; numbers are right-aligned.

    Args:
        headers: column titles.
        rows: lists of cells (str, Raw, int, float -> 3 decimals, None -> "").
        css_class: the table's class.
    """
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    lines = [f"<table class=\"{css_class}\"><thead><tr>{head}</tr></thead><tbody>"]
    for row in rows:
        lines.append("<tr>" + "".join(_cell(c) for c in row) + "</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def figure_div(fig_id: str) -> str:
    """The empty `<div>` a figure is drawn into."""
    return f"<div id=\"{fig_id}\" class=\"figure\"></div>"


def header_list(fields) -> str:
    """`HeaderField`s as a definition list."""
    items = "".join(f"<dt>{html.escape(f.name)}</dt><dd>{html.escape(f.value)}</dd>" for f in fields)
    return f"<dl class=\"meta\">{items}</dl>"


def head_button(layer: int, head: int) -> Raw:
    """A button that opens the head in the explorer."""
    return Raw(f"<button class=\"head\" data-layer=\"{int(layer)}\" data-head=\"{int(head)}\">L{int(layer)} H{int(head)}</button>")


def script_json(obj) -> str:
    """JSON safe inside a `<script>` element."""
    return _script_safe(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def _script_safe(text: str) -> str:
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _cell(value) -> str:
    if isinstance(value, Raw):
        return f"<td>{value}</td>"
    if isinstance(value, bool) or value is None:
        return f"<td>{'' if value is None else value}</td>"
    if isinstance(value, int):
        return f"<td class=\"num\">{value}</td>"
    if isinstance(value, float):
        return f"<td class=\"num\">{value:.3f}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _swatch(label: str, grid) -> Raw:
    colour = grid.colours[grid.categories.index(label)] if label in grid.categories else "#fff"
    return Raw(f"<span class=\"swatch\" style=\"background:{colour}\"></span>{html.escape(label)}")


def axis_tokens(tokens) -> tuple[list[str], list[str]]:
    """(shown, ticks): tokens as the explorer shows them, and cut to TICK_CHARS for the axes."""
    shown = [_display_token(t) for t in tokens]
    ticks = [_display_token(t if len(t) <= TICK_CHARS else t[: TICK_CHARS - 1] + "…") for t in tokens]
    return shown, ticks


def _display_token(token: str) -> str:
    """A token as plotly shows it: whitespace made visible, escaped for its pseudo-HTML."""
    shown = token.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\u2423") or "\u2205"
    return html.escape(shown, quote=False)


def example_payload(example) -> dict:
    """One example for the explorer: tokens (escaped for plotly) and zlib + base64 uint8 patterns;
    where the keys are other tokens (cross-attention's encoder), their count `m` and
    `keyTokens`, `keyTicks` too."""
    raw = example.patterns.astype("uint8", copy=False).tobytes()  # [layer, head, query, key]
    payload = {
        "name": f"{example.probe} #{example.index}", "n": len(example.tokens),
        **dict(zip(("tokens", "ticks"), axis_tokens(example.tokens))),
        "encoding": "zlib+base64", "data": base64.b64encode(zlib.compress(raw, 6)).decode("ascii"),
    }
    if example.key_tokens is not None:  # only then: a square example's payload stays as it was
        payload["m"] = len(example.key_tokens)
        payload.update(zip(("keyTokens", "keyTicks"), axis_tokens(example.key_tokens)))
    return payload


def _example_size(example) -> str:
    """"24 tokens", or "24 query × 30 key tokens" where the keys are other tokens."""
    if example.key_tokens is None:
        return f"{len(example.tokens)} tokens"
    return f"{len(example.tokens)} query × {len(example.key_tokens)} key tokens"


def _explorer_section(data, initial) -> str:
    options = []
    for i, example in enumerate(data.examples):
        preview = "".join(example.tokens)[:40]
        options.append(f"<option value=\"{i}\">{html.escape(example.probe)} #{int(example.index)}: "
                       f"{html.escape(preview)} ({_example_size(example)})</option>")
    label = data.label_grid.labels[initial[0]][initial[1]] or "no label"
    picker = (f"<label>Example <select id=\"hs-example\">{''.join(options)}</select></label>" if options
              else "<p class=\"note\">This analysis stores no example patterns.</p><select id=\"hs-example\" hidden></select>")
    axes = "Query on y, key on x."
    if any(example.key_tokens is not None for example in data.examples):
        axes = "Query (the decoder's tokens) on y, key (the encoder's tokens) on x."
    return "\n".join([
        "<aside><section id=\"explorer\"><h2>Head explorer</h2>", picker,
        f"<p id=\"hs-explorer-title\">layer {initial[0]} head {initial[1]} — {html.escape(label)}</p>",
        figure_div(figures.EXPLORER_ID),
        f"<p class=\"hint\" id=\"hs-explorer-note\">{axes} Click any cell of the label map "
        "or a detector heatmap, or a head button in the tables.</p></section></aside>",
    ])


def _top_heads_section(data) -> str:
    """One row per label: the quantity its scores are in, its strongest heads (buttons into the
    explorer) with their scores and the control's score for the same head."""
    by_label: dict = {}
    for t in data.top_heads:
        by_label.setdefault(t.label, []).append(t)
    counts = {label: sum(row.count(label) for row in data.label_grid.labels) for label in by_label}
    rank_headers = [f"#{rank}" for rank in range(1, max((len(v) for v in by_label.values()), default=0) + 1)]
    rows = []
    for label, heads in by_label.items():
        units = {t.quantity for t in heads}
        per_head = len(units) > 1 or label == "mixed"  # "mixed" shows each head's clearest detector
        unit = "clearest detector's score, named per head" if per_head else units.pop()
        rows.append([_swatch(label, data.label_grid), counts[label], unit,
                     *[Raw(_ranked_head(t, per_head)
                           # the OV qualifier on its own line, free to wrap: kept beside the score it
                           # would push the other ranks off the page
                           + (f"<br><span class=\"ov-note\">{html.escape(t.ov.text())}</span>" if t.qualifier else ""))
                       for t in heads]])
    return ("<section id=\"top-heads\"><h2>Top heads per label</h2><p class=\"hint\">Strongest first, each with "
            "its label's score in the quantity of that row and, in brackets, the control model's score for the same "
            f"head and detector; {html.escape(data.ov_labels)} heads then say whether their OV circuit copies (see "
            "OV copying); click a head to explore it.</p>"
            + table(["label", "heads", "quantity", *rank_headers], rows) + "</section>")


def _ranked_head(t, per_head: bool) -> str:
    """A head's button and score, and the control's score after it: each part kept whole, free
    to go to the next line, so the ranks of a label fit a 1280-pixel window."""
    score, _, control = t.text(per_head).partition(" (")
    return (f"<span class=\"nowrap\">{head_button(t.layer, t.head)} {html.escape(score)}</span>"
            + (f" <span class=\"nowrap\">({html.escape(control)}</span>" if control else ""))


def _ov_section(data) -> str:
    """Heads whose label the OV qualifier reads: does their OV circuit copy (`headscope.detectors.labels.ov_qualifier`)?"""
    if not data.ov:
        return ""
    rows = [[head_button(r.layer, r.head), r.label, r.qualifier, r.positive_eig_share,
             None if r.control_share != r.control_share else r.control_share,
             None if r.control_best_share != r.control_best_share else r.control_best_share, r.copy_top1]
            for r in data.ov]
    return (f"<section id=\"ov\"><h2>OV copying</h2><p class=\"hint\">What the {html.escape(data.ov_labels)} heads "
            "write, from the weights (Elhage et al. 2021): the positive eigenvalue share of the OV circuit and the "
            "share of sampled tokens whose own logit tops its row, beside the control model's shares; the rule is in "
            "the Method section.</p>"
            + table(["head", "label", "OV qualifier", "eig share", "control (same head)", "control best head",
                     "copy top-1"], rows) + "</section>")


def _kit():
    """The writer's building blocks a detector's section draws with (`headscope.detectors.section.Kit`)."""
    return Kit(table=table, raw=Raw, head_button=head_button, figure_div=figure_div)


def _validation_section(data) -> str:
    if data.validation is None:
        return ""
    primary = sorted({r.mode for r in data.validation if r.primary})
    rows = []
    for r in data.validation:
        accuracy = "" if r.baseline_accuracy != r.baseline_accuracy else f"{r.baseline_accuracy:.3f} → {r.ablated_accuracy:.3f}"
        rows.append([
            r.label, Raw(f"<b>{html.escape(r.mode)}</b>") if r.primary else r.mode, r.metric,
            Raw(" ".join(head_button(layer, head) for layer, head in r.heads)), r.baseline, r.ablated, r.delta,
            r.random_mean, max(r.random_deltas) if r.random_deltas else None, _ratio(r.ratio),
            ("yes" if r.hurts_more else "no") if r.random_deltas else "no control", accuracy,
        ])
    return "\n".join([
        "<section id=\"validation\"><h2>What breaks when these heads are removed</h2><p class=\"hint\">Each "
        "label's top heads are ablated and the metric that label should hurt is measured (next-token loss for "
        "causal models; for encoders masked-token loss, or the change of the final hidden states when there is "
        "no LM head): on repeated random tokens for induction and duplicate-token heads, on treebank sentences "
        "for syntactic heads, on natural text for the others; icl_score is the in-context learning score (loss "
        "at a late token minus an early one) with the induction heads ablated. The control ablates as many "
        "random heads from the same layers. A label <i>hurts more</i> when its Δ is positive and exceeds every "
        "random draw's; "
        f"{html.escape(' and '.join(primary) or 'no')} ablation (bold) gives the verdict.</p>",
        figure_div(figures.VALIDATION_ID),
        table(["label", "mode", "metric", "heads", "unablated", "ablated", "Δ", "random Δ mean", "random Δ max",
               "Δ / random", "hurts more", "accuracy"], rows),
        "</section>",
    ])


def _geometry_section(data) -> str:
    """The MDS map, importance and pruning curve, redundant pairs (`report/geometry_data.py`)."""
    g = data.geometry
    if g is None:
        return ""
    s = g.settings
    parts = [
        "<section id=\"geometry\"><h2>Heads as patterns and subspaces</h2><p class=\"hint\">Every head placed by "
        "how alike its attention patterns are (mean Jensen–Shannon divergence between two heads' attention rows over "
        f"the text probe, {html.escape(str(s.get('n_examples', '?')))} × {html.escape(str(s.get('seq_len', '?')))} "
        "tokens; classical MDS of √JS, Clark et al. 2019 §6), coloured by label. Click a point to explore the head. "
        f"{g.n_clusters} clusters (average linkage, mean JS below {html.escape(str(s.get('cluster_threshold', '?')))} "
        f"bits). Pairs across layers use a top-{html.escape(str(s.get('top_k', '?')))} approximation of each row, "
        f"off by {g.approximation_error:.3f} bits on average where it can be checked (pairs within a layer).</p>",
        figure_div(GEOMETRY_MAP_ID),
    ]
    if g.importance is not None:
        kind = "normalised per layer by its l2 norm" if g.importance_kind == "importance_normalized" else "raw"
        parts += [
            f"<h3>Importance</h3><p class=\"hint\">Michel et al. 2019's proxy E<sub>x</sub> |∂L(x)/∂ξ<sub>h</sub>| with "
            f"a gate ξ<sub>h</sub> on each head's output and L the next-token loss on the text probe ({kind}; the "
            "table gives both). Click a cell or a head to explore it.</p>",
            "<div class=\"figures\">", figure_div(IMPORTANCE_ID), "</div>",
            table(["rank", "head", "label", "importance", "normalised per layer"],
                  [[r.rank, head_button(r.layer, r.head), r.label or "no label", r.importance, r.importance_normalized]
                   for r in g.ranking]),
            f"<p class=\"hint\">Where each label's heads rank (1 = most important of {len(g.points)}), best first.</p>",
            table(["label", "heads", "best rank", "median rank", "heads by rank"],
                  [[r.label, len(r.ranks), r.ranks[0], float(np.median(r.ranks)),
                    Raw(" ".join(f"<span class=\"nowrap\">{head_button(l, h)} {k}</span>"
                                 for (l, h), k in list(zip(r.heads, r.ranks))[:LABEL_RANK_HEADS])
                        + (" …" if len(r.ranks) > LABEL_RANK_HEADS else ""))]
                   for r in g.label_ranks]),
        ]
    if g.curve:
        first = g.curve[0]
        random = [line.removable for line in g.curve if line.order == "random"]
        parts += [
            "<h3>Pruning curve</h3><p class=\"hint\">Heads zero-ablated, least important first, against random "
            f"orders. Heads removable before the loss rises 10% (unablated {g.baseline_loss:.3f} nats): "
            f"{first.removable} in importance order, {g.random_removable_mean:.1f} on average in "
            f"{len(random)} random orders ({', '.join(str(n) for n in random)}), on a grid of "
            f"{html.escape(str(len(first.removed) - 1))} steps.</p>",
            figure_div(PRUNING_ID),
        ]
    parts.append(f"<h3>Redundant pairs</h3><p class=\"hint\">Heads of one layer whose patterns (JS ≤ "
                 f"{html.escape(str(s.get('js_max', '?')))} bits) and subspaces (mean overlap of W_Q, W_K, W_V, W_O ≥ "
                 f"{html.escape(str(s.get('overlap_min', '?')))}) both nearly coincide.</p>")
    if g.redundant:
        parts.append(table(["layer", "head", "head", "JS (bits)", "subspace overlap"],
                           [[r.layer, head_button(r.layer, r.head_a), head_button(r.layer, r.head_b), r.js, r.overlap]
                            for r in g.redundant]))
    else:
        parts.append("<p>None.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def _composition_section(data) -> str:
    """Heatmaps of each kind's z and the top pairs (`report/composition_data.py`)."""
    c = data.composition
    if c is None:
        return ""
    s = c.settings
    offsets = s.get("rotary_offsets")
    rotary = ("" if not offsets else
              f" Q and K circuits averaged over the relative offsets {html.escape(_span(offsets))} "
              f"(W<sub>Q</sub> C W<sub>K</sub><sup>T</sup>, C the mean rotation; docs/composition.md).")
    kinds = ", ".join(KIND_NAMES.get(m.kind, m.kind) for m in c.maps)
    parts = [
        "<section id=\"composition\"><h2>How heads compose</h2><p class=\"hint\">From the weights alone "
        "(Elhage et al. 2021): for an earlier head A and a later head B, "
        "‖W<sub>A</sub> W<sub>B</sub>‖<sub>F</sub> / (‖W<sub>A</sub>‖<sub>F</sub> ‖W<sub>B</sub>‖<sub>F</sub>) with "
        "A's OV circuit as W<sub>A</sub> and B's QK circuit read by its queries (Q-composition) or keys "
        "(K-composition), or B's OV circuit (V-composition); norm gains folded. Shown as z, the distance from the "
        "same score of random matrices of the same shapes in their "
        f"standard deviations ({html.escape(str(s.get('baseline_samples', '?')))} draws). {html.escape(kinds)}."
        f"{rotary} A high score says B can read what A writes, not that it does on text; in a trained model most "
        "pairs sit above random (heads share directions), so compare a pair with the others.</p>",
        "<div class=\"figures\">", *[figure_div(composition_id(m.kind)) for m in c.maps], "</div>",
        f"<h3>Top pairs</h3><p class=\"hint\">The {len(c.top)} pairs with the highest z over every kind.</p>",
        table(["kind", "from", "label", "to", "label", "score", "baseline", "z"],
              [[KIND_NAMES.get(p.kind, p.kind), head_button(p.src_layer, p.src_head), p.src_label or "no label",
                head_button(p.dst_layer, p.dst_head), p.dst_label or "no label", p.score, p.baseline,
                p.z] for p in c.top]),
        "</section>",
    ]
    return "\n".join(parts)


def _span(offsets) -> str:
    """Offsets in words: "1-64" for a run, else the list."""
    values = [int(v) for v in offsets]
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}-{values[-1]}"
    return ", ".join(map(str, values))


def _ratio(value: float) -> str:
    if value != value:
        return ""
    if abs(value) == float("inf"):
        return "∞" if value > 0 else "−∞"
    return f"{value:.1f}×"


def _method_section(data) -> str:
    rows = [[m.detector, m.quantity, Raw(f"<code>{html.escape(m.formula)}</code>"), m.rule, m.source, m.probe]
            for m in data.methods]
    rules = "".join(f"<li>{html.escape(note.text)}</li>" for note in data.rules)
    return ("<section id=\"method\"><h2>Method</h2><ul class=\"rules\">" + rules + "</ul>"
            + table(["detector", "quantity", "formula", "label rule", "source", "probe"], rows) + "</section>")
