"""`AnalysisMeta`, the typed form of what `analyze` records: its JSON is `Analysis.meta`, as
saved in meta.json, and reads back into the same fields; `Timings` times each step once."""
import json

import pytest

import headscope
from headscope.analysis.meta import AnalysisMeta
from headscope.detectors.runner import Timings
from headscope.probes.kinds import TextProbe


def test_meta_json_round_trips_through_the_dataclass(planted, tmp_path):
    analysis = headscope.analyze(planted, ["previous_token", "sink"], [TextProbe(n_examples=4, seq_len=24)],
                                 control=None, explorer_examples=0)
    typed = AnalysisMeta.from_json(analysis.meta)
    assert typed.model == analysis.meta["model"] and typed.probes["text"]["patterns"] == "lazy"
    assert list(typed.to_json().items()) == list(analysis.meta.items())  # same keys, same order
    saved = json.loads((analysis.save(tmp_path / "a") / "meta.json").read_text())
    assert AnalysisMeta.from_json(saved).to_json() == saved
    assert list(saved["timings"]) == ["control_init", "probes", "probe_text", "statistics", "ov", "explorer", "total"]


def test_timings_add_up_and_skip_a_failed_step():
    timings = Timings()
    for _ in range(2):
        with timings.step("twice"):
            pass
    with pytest.raises(ValueError):
        with timings.step("failed"):
            raise ValueError
    timings.total()
    assert set(timings.rounded()) == {"twice", "total"} and timings.seconds["total"] >= timings.seconds["twice"]
