"""`analyze` end to end inside tiny models of recent families: it runs, labels every head and
renders the report; gpt-oss's sinks are stated in the analysis and the report's header."""
import math

import pytest

from headscope import detectors
from headscope.loading.loader import Loaded
from headscope.analysis.analyze import SINK_NOTE, analyze
from headscope.report import report_data, write_report
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe
from tests.support.planted import char_tokenizer
from tests.support.tiny import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PATTERN_DETECTORS = [d.name for d in detectors.REGISTRY.values()
                     if d.probe != "treebank" and "causal" in d.applies_to and not d.opt_in]  # the defaults
SMALL = dict(detectors=PATTERN_DETECTORS, probes=[TextProbe(4, 24), RepeatedProbe(4, 6, 3)], batch_size=2,
             explorer_examples=1, explorer_len=12)


@pytest.mark.parametrize("family", ["gemma2", "qwen3", "phi3", "gpt_oss", "bitnet", "gemma4_text", "llama4_text", "olmoe"])
def test_analyze_labels_and_renders(family, tmp_path):
    model = tiny_model(family, kind="interface")
    default = model.config._attn_implementation
    loaded = Loaded(model, char_tokenizer(), f"tiny-{family}", family, True)
    analysis = analyze(loaded, **SMALL)
    assert len(analysis.labels) == 2 * 4  # every head of both layers has a label (maybe "none")
    assert analysis.scores.score.map(math.isfinite).all()
    assert {p["patterns"] for p in analysis.meta["probes"].values()} == {"lazy"}
    assert set(analysis.scores.detector) == set(PATTERN_DETECTORS)
    assert len(analysis.examples) >= 1
    sinks = family == "gpt_oss"
    expected = [SINK_NOTE.format(n=2, total=2)] if sinks else []
    assert analysis.meta.get("notes", []) == expected
    assert "ov" in analysis.tables  # bitnet too: its sub-norm's gain folded into W_O (tests/hf/test_bitnet.py)
    header = {field.name: field.value for field in report_data(analysis).header}
    assert header.get("Note") == (expected[0] if expected else None)  # the report's header says it too
    write_report(analysis, tmp_path / "report")
    assert (tmp_path / "report" / "index.html").stat().st_size > 10_000
    assert model.config._attn_implementation == default
