"""Reading an analysis needs no torch: `import headscope.analysis`, `Analysis.load` and
`headscope report DIR` run in fresh processes, and none of them imports torch (or transformers).

Two saved analyses: the planted model's, as `headscope.analyze` writes it (with its OV table and
the control), and a fake one built from the registry with the syntactic detector's table (its
report section).
"""
import subprocess
import sys

import pytest

import headscope
from headscope.probes.kinds import RepeatedProbe, TextProbe
from tests.support.fake_analysis import fake_analysis

HEAVY = ("torch", "transformers")


def _heavy_modules_after(code: str) -> list[str]:
    script = code + f"\nimport sys\nprint('heavy:' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("heavy:"), done.stdout
    return [name for name in last[len("heavy:"):].split(",") if name]


@pytest.fixture(scope="module", params=["planted", "fake"])
def saved_for_reading(request, tmp_path_factory):
    if request.param == "planted":
        probes = [TextProbe(n_examples=4, seq_len=24), RepeatedProbe(n_examples=4, repeat_len=8)]
        analysis = headscope.analyze(request.getfixturevalue("planted"), probes=probes, control="random-init",
                                     explorer_examples=1)
        assert analysis.ov is not None  # the OV qualifier to draw
    else:
        analysis = fake_analysis()
        assert "syntax" in analysis.tables  # the syntactic detector's section to draw
    folder = tmp_path_factory.mktemp("torch-free") / request.param
    analysis.save(folder)
    return folder


def test_importing_the_analysis_and_report_packages_loads_no_torch():
    assert _heavy_modules_after("import headscope.analysis, headscope.analysis.result, headscope.report") == []
    assert _heavy_modules_after("import headscope, headscope.cli") == []


def test_loading_and_re_rendering_a_saved_analysis_loads_no_torch(saved_for_reading):
    folder = saved_for_reading
    load = f"from headscope.analysis import Analysis\nAnalysis.load({str(folder)!r}).labels"
    assert _heavy_modules_after(load) == []
    render = (f"from headscope.cli import app\ntry:\n    app(['report', {str(folder)!r}])\n"
              "except SystemExit as stop:\n    assert not stop.code, stop.code")
    assert _heavy_modules_after(render) == []


def test_the_page_rendered_without_torch_equals_the_one_rendered_with_it(saved_for_reading, tmp_path):
    folder = saved_for_reading
    from headscope.report import render_html

    code = (f"from headscope.analysis import Analysis\nfrom headscope.report import render_html\n"
            f"open({str(tmp_path / 'page.html')!r}, 'w', encoding='utf-8').write("
            f"render_html(Analysis.load({str(folder)!r})))")
    assert _heavy_modules_after(code) == []
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == render_html(headscope.Analysis.load(folder))
