"""The documentation's pictures, from a real analysis, drawn by headscope's own report and figures
and photographed in headless Chromium (Playwright, the system's /usr/bin/chromium):

- docs/figures/report.png: the top of the report page (header, label map, the head explorer on
  the strongest head), README.md's and the site's picture;
- docs/figures/patterns.png: four heads' attention on probe examples, the strongest
  previous-token, induction, duplicate-token and sink heads (`headscope.report.plotting.plot_head`);
- docs/figures/scores.png: the strongest induction heads' scores with their 95% intervals beside
  the control twin's score for the same head, its best head and the threshold;
- docs/figures/circuit.png: the top of a circuit's page (header and graph), README.md's picture
  of a circuit, from a folder `headscope circuit` wrote.

    python3 tools/docs_figures.py                          # runs `headscope analyze smollm2-135m` first
    python3 tools/docs_figures.py --analysis reports/smollm2-135m   # an analysis already written
    headscope circuit smollm2-135m --task ioi --n 8 --method eap --sizes 1,10 --random 1 --out reports/ioi-circuit
    python3 tools/docs_figures.py --circuit reports/ioi-circuit     # circuit.png alone

The report is re-rendered from the saved analysis into a temporary folder (the analysis folder is
not touched). Each PNG must stay under 300 KB (README.md shows one); the script says so if not.
"""
from __future__ import annotations

import argparse
import html
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MAX_BYTES = 300 * 1024
PATTERN_LABELS = (("previous_token", "text"), ("induction", "repeated"), ("duplicate_token", "repeated"),
                  ("sink", "text"))


def _strongest(analysis, label: str):
    """(layer, head) of the head with `label` and the highest label score."""
    rows = analysis.labels[analysis.labels.label == label].sort_values(["score", "layer", "head"],
                                                                       ascending=[False, True, True])
    if rows.empty:
        raise SystemExit(f"the analysis has no {label} head to draw")
    return int(rows.layer.iloc[0]), int(rows["head"].iloc[0])


def _figure_page(figures: list, columns: int) -> str:
    """A page of plotly figures in a grid (plotly.js inline: nothing loaded from outside)."""
    import plotly.io as pio
    import plotly.offline

    divs = "".join(f"<div>{pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f'fig{i}')}</div>"
                   for i, fig in enumerate(figures))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><script>{plotly.offline.get_plotlyjs()}</script>"
            f"<style>body{{margin:0;background:white}} #grid{{display:grid;grid-template-columns:repeat({columns},"
            f" max-content);gap:4px;padding:8px}}</style></head><body><div id='grid'>{divs}</div></body></html>")


def patterns_figures(analysis) -> list:
    from headscope.report.plotting import plot_head

    figures = []
    for label, probe in PATTERN_LABELS:
        layer, head = _strongest(analysis, label)
        fig = plot_head(analysis, layer, head, probe=probe)
        fig.update_layout(width=340, height=360, title={"text": html.escape(f"{label}: layer {layer} head {head}"),
                                                        "font": {"size": 13}},
                          margin={"l": 80, "r": 10, "t": 40, "b": 80}, coloraxis_showscale=False)
        fig.update_traces(showscale=False)
        figures.append(fig)
    return figures


def scores_figure(analysis, detector: str = "induction", k: int = 8):
    """Top-k heads of `detector`: score with its 95% interval, the control's score for the same
    head, the control's best head and the threshold."""
    import plotly.graph_objects as go

    rows = analysis.scores[analysis.scores.detector == detector].sort_values("score", ascending=False).head(k)
    names = [f"{int(r.layer)}.{int(r.head)}" for r in rows.itertuples()]
    threshold = float(analysis.meta["detectors"][detector]["threshold"])
    control_max = float(rows.control_max.iloc[0])
    fig = go.Figure([
        go.Scatter(x=names, y=rows.score, mode="markers", name="score and its 95% interval",
                   marker={"color": "#d62728", "size": 9},
                   error_y={"type": "data", "symmetric": False, "array": rows.ci_high - rows.score,
                            "arrayminus": rows.score - rows.ci_low, "color": "#d62728"}),
        go.Scatter(x=names, y=rows.control, mode="markers", name="control twin, same head",
                   marker={"color": "#636363", "symbol": "diamond", "size": 8}),
    ])
    fig.add_hline(y=threshold, line_dash="dash", line_color="#1f77b4",
                  annotation_text=f"threshold {threshold:g}", annotation_position="top right")
    fig.add_hline(y=control_max, line_dash="dot", line_color="#636363",
                  annotation_text=f"control's best head {control_max:.3f}", annotation_position="top right")
    fig.update_layout(width=760, height=380, template="plotly_white", yaxis={"range": [0, 1.02],
                      "title": {"text": f"{detector} score (attention mass)"}},
                      xaxis={"title": {"text": "head (layer.head), strongest first"}},
                      title={"text": html.escape(f"{analysis.meta.get('model', '')}: the strongest {detector} heads")},
                      legend={"orientation": "h", "y": -0.25}, margin={"l": 60, "r": 20, "t": 50, "b": 90})
    return fig


def _shoot(browser, path: Path, out: Path, *, viewport: dict, ready: str | None = None, selector: str | None = None):
    page = browser.new_page(viewport=viewport)
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(path.as_uri())
    if ready:
        page.wait_for_function("(want) => document.documentElement.dataset.headscope === want", arg=ready,
                               timeout=120_000)
    else:
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0", timeout=60_000)
    page.wait_for_timeout(300)
    if errors:
        raise SystemExit(f"{path}: the page logged errors: {errors}")
    target = page.locator(selector) if selector else page
    target.screenshot(path=str(out))
    page.close()
    size = out.stat().st_size
    print(f"{out.relative_to(ROOT)}: {size / 1024:.0f} KB")
    if size > MAX_BYTES:
        raise SystemExit(f"{out} is {size / 1024:.0f} KB, over the {MAX_BYTES // 1024} KB the docs allow")


def circuit_figure(folder: Path, chromium: str, sync_playwright) -> int:
    """docs/figures/circuit.png: the page's header and graph, re-rendered from the saved circuit
    into a temporary folder (the circuit's folder is not touched)."""
    from headscope.circuits import Circuit, render_circuit_html

    circuit = Circuit.load(folder)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "circuit.html"
        page.write_text(render_circuit_html(circuit), encoding="utf-8")
        FIGURES.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            # 1100 px wide keeps the PNG of 300 edges' anti-aliased lines under the 300 KB limit
            _shoot(browser, page, FIGURES / "circuit.png", viewport={"width": 1100, "height": 910}, ready="plotted")
            browser.close()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--analysis", type=Path, help="an analysis folder (default: run headscope analyze MODEL)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--circuit", type=Path, help="a circuit folder: draw circuit.png from its page, and nothing else")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    if args.circuit is not None:
        return circuit_figure(args.circuit, args.chromium, sync_playwright)

    from headscope.analysis import Analysis
    from headscope.report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = args.analysis
        if folder is None:
            folder = tmp / "analysis"
            subprocess.run([sys.executable, "-m", "headscope", "analyze", args.model, "--out", str(folder)], check=True)
        analysis = Analysis.load(folder)
        report = write_report(analysis, tmp / "report")
        (tmp / "patterns.html").write_text(_figure_page(patterns_figures(analysis), columns=4), encoding="utf-8")
        (tmp / "scores.html").write_text(_figure_page([scores_figure(analysis)], columns=1), encoding="utf-8")
        FIGURES.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            _shoot(browser, report, FIGURES / "report.png", viewport={"width": 1400, "height": 880}, ready="ready")
            _shoot(browser, tmp / "patterns.html", FIGURES / "patterns.png", viewport={"width": 1440, "height": 420},
                   selector="#grid")
            _shoot(browser, tmp / "scores.html", FIGURES / "scores.png", viewport={"width": 800, "height": 420},
                   selector="#grid")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
