"""Reading an analysis needs no torch: `import headscope.analysis`, `Analysis.load` and
`headscope report DIR` run in fresh processes, and none of them imports torch (or transformers).

The analysis is the planted model's with the default detectors (the syntactic one brings its
report section and table) and the OV table, saved as `headscope analyze` saves it.
"""
import subprocess
import sys

import pytest

import headscope
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe

HEAVY = ("torch", "transformers")


def _heavy_modules_after(code: str) -> list[str]:
    script = code + f"\nimport sys\nprint('heavy:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("heavy:"), done.stdout
    return [name for name in last[len("heavy:"):].split(",") if name]


@pytest.fixture(scope="module")
def saved(planted, tmp_path_factory):
    probes = [TextProbe(n_examples=4, seq_len=24), RepeatedProbe(n_examples=4, repeat_len=8),
              TreebankProbe(n_sentences=24)]
    analysis = headscope.analyze(planted, probes=probes, control="random-init", explorer_examples=1)
    folder = tmp_path_factory.mktemp("torch-free") / "analysis"
    analysis.save(folder)
    return folder, analysis


def test_importing_the_analysis_and_report_packages_loads_no_torch():
    assert _heavy_modules_after("import headscope.analysis, headscope.analysis.result, headscope.report") == []
    assert _heavy_modules_after("import headscope, headscope.cli") == []


def test_loading_and_re_rendering_a_saved_analysis_loads_no_torch(saved):
    folder, analysis = saved
    assert "syntax" in analysis.tables and analysis.ov is not None  # a section and the OV qualifier to draw
    load = f"from headscope.analysis import Analysis\nAnalysis.load({str(folder)!r}).labels"
    assert _heavy_modules_after(load) == []
    render = (f"from headscope.cli import app\ntry:\n    app(['report', {str(folder)!r}])\n"
              "except SystemExit as stop:\n    assert not stop.code, stop.code")
    assert _heavy_modules_after(render) == []


def test_the_page_rendered_without_torch_equals_the_one_rendered_with_it(saved, tmp_path):
    folder, analysis = saved
    from headscope.report import render_html

    code = (f"from headscope.analysis import Analysis\nfrom headscope.report import render_html\n"
            f"open({str(tmp_path / 'page.html')!r}, 'w', encoding='utf-8').write("
            f"render_html(Analysis.load({str(folder)!r})))")
    assert _heavy_modules_after(code) == []
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == render_html(headscope.Analysis.load(folder))
