"""A detector's extra tables (`Finding.tables`) belong to the analysis under their own name.

`previous_mass` is defined in this file alone: the previous-token formula with a `finalize` that
adds a per-example table, `previous_mass_examples`. Nothing in headscope names it, yet its table
is `analysis.tables["previous_mass_examples"]` (and `analysis.previous_mass_examples`), is saved
as `previous_mass_examples.csv`, comes back from `Analysis.load` and survives `headscope report`.
The planted model (tests/support/planted.py) has its previous-token head at 0.0.
"""
from dataclasses import dataclass, replace

import pandas as pd
import pytest
from typer.testing import CliRunner

import headscope
from headscope.analysis import Analysis
from headscope.cli import app
from headscope.detectors import previous_token, register
from headscope.detectors.protocol import Detector
from headscope.errors import HeadscopeError
from headscope.probes.kinds import TextProbe

TABLE = "previous_mass_examples"


@dataclass(frozen=True)
class PerExampleDetector(Detector):
    """A detector that also keeps every example's score per head as a table."""

    def finalize(self, model, control, probe, seed):
        finding = super().finalize(model, control, probe, seed)
        rows = [{"layer": layer, "head": head, "example": example, "score": float(values[example, head]),
                 "parity": "even" if example % 2 == 0 else "odd"}
                for layer, values in model.per_layer().items()  # [example, head]
                for example in range(values.shape[0]) for head in range(values.shape[1])]
        return replace(finding, tables={TABLE: pd.DataFrame(rows)})


previous_mass = register(PerExampleDetector(
    name="previous_mass", probe="text", threshold=0.5, formula=previous_token.formula, source="this test",
    fn=previous_token.fn, lazy=previous_token.lazy, opt_in=True))


@pytest.fixture(scope="module")
def previous_mass_analysis(planted):
    return headscope.analyze(planted, detectors=["previous_mass"], probes=[TextProbe(n_examples=4, seq_len=24)],
                             control=None, explorer_examples=1, ov=False)


def test_the_table_joins_the_analysis_by_name(previous_mass_analysis, planted):
    table = previous_mass_analysis.tables[TABLE]
    assert set(previous_mass_analysis.tables) == {TABLE} and previous_mass_analysis.previous_mass_examples is table
    assert len(table) == 4 * planted.n_layers * planted.n_heads
    best = table.groupby(["layer", "head"]).score.mean().idxmax()
    assert best == (0, 0)  # the planted previous-token head
    assert previous_mass_analysis.syntax is None and previous_mass_analysis.ov is None  # once fields: None when absent, as before
    assert not hasattr(previous_mass_analysis, "best")  # any other absent name is no attribute (duck typing still works)


def test_the_table_survives_save_load_and_report(previous_mass_analysis, tmp_path):
    folder = previous_mass_analysis.save(tmp_path / "a")
    written = (folder / f"{TABLE}.csv").read_text()
    assert written == previous_mass_analysis.tables[TABLE].to_csv(index=False)
    loaded = Analysis.load(folder)
    pd.testing.assert_frame_equal(loaded.tables[TABLE], previous_mass_analysis.tables[TABLE])
    assert set(loaded.tables) == {TABLE}

    result = CliRunner().invoke(app, ["report", str(folder), "--plotlyjs", "cdn"])
    assert result.exit_code == 0, result.output
    assert "previous_mass" in (folder / "index.html").read_text()
    assert (folder / f"{TABLE}.csv").read_text() == written
    again = Analysis.load(folder)
    pd.testing.assert_frame_equal(again.tables[TABLE], previous_mass_analysis.tables[TABLE])
    again.save(tmp_path / "b")  # a loaded analysis writes the table back byte for byte
    assert (tmp_path / "b" / f"{TABLE}.csv").read_text() == written


def test_a_table_added_by_name_is_saved_and_reads_as_an_attribute(previous_mass_analysis, tmp_path):
    copy = Analysis(previous_mass_analysis.scores, previous_mass_analysis.labels, dict(previous_mass_analysis.meta), tables=dict(previous_mass_analysis.tables))
    copy.add_table("extra", pd.DataFrame({"layer": [0], "note": ["added by name"]}))
    assert "extra" in copy.tables
    pd.testing.assert_frame_equal(Analysis.load(copy.save(tmp_path / "c")).extra, copy.extra)
    with pytest.raises(HeadscopeError, match="add_table"):
        copy.add_table("extra", None)
    del copy.tables["extra"]
    assert not hasattr(copy, "extra")


def test_setting_an_unknown_attribute_is_an_error_not_a_table(previous_mass_analysis, tmp_path):
    copy = Analysis(previous_mass_analysis.scores, previous_mass_analysis.labels, dict(previous_mass_analysis.meta))
    with pytest.raises(AttributeError, match=r"'lables'.*add_table\('lables', frame\)"):
        copy.lables = copy.labels  # a typo of a field
    assert "lables" not in copy.tables and not hasattr(copy, "lables")
    assert not (copy.save(tmp_path / "d") / "lables.csv").exists()
    copy.validation = pd.DataFrame({"label": ["induction"]})  # the fields are still set as attributes
    assert copy.validation.label.tolist() == ["induction"] and "validation" not in copy.tables


@pytest.mark.parametrize("name", ["scores", "labels", "validation", "meta", "save", "bad-name"])
def test_a_table_may_not_take_the_analysis_own_names(previous_mass_analysis, name):
    with pytest.raises(HeadscopeError, match="cannot name a table"):
        Analysis(previous_mass_analysis.scores, previous_mass_analysis.labels, previous_mass_analysis.meta, tables={name: pd.DataFrame()})
    with pytest.raises(HeadscopeError, match="cannot name a table"):
        previous_mass_analysis.add_table(name, pd.DataFrame())
