"""`headscope analyze` on both bundled models gives the committed golden scores, CIs and labels (slow).

The golden tables (tests/support/golden/MODEL/*.csv) were written by tests/support/golden/regenerate.py; the run is the session's (`golden_analyses`), which
tests/cli/test_real_cli.py reads too. A
refactor must leave them unchanged; a change that moves them on purpose regenerates them and
says so in its commit.
"""
import pandas as pd
import pytest

from tests.support.golden.regenerate import HERE as GOLDEN, MODELS, TABLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=MODELS)
def analysed(request, golden_analyses):
    out, result = golden_analyses(request.param)  # the session's run (tests/conftest.py)
    assert result.returncode == 0, result.stderr[-3000:]
    return request.param, out


@pytest.mark.parametrize("table", TABLES)
def test_analyze_matches_golden(analysed, table):
    model, out = analysed
    expected = pd.read_csv(GOLDEN / model / table)
    got = pd.read_csv(out / table)
    assert list(got.columns) == list(expected.columns)
    assert len(got) == len(expected)
    numeric = [c for c in expected.columns if pd.api.types.is_float_dtype(expected[c])]
    others = [c for c in expected.columns if c not in numeric]
    pd.testing.assert_frame_equal(got[others], expected[others], check_dtype=False)
    for column in numeric:
        pd.testing.assert_series_equal(got[column], expected[column], check_exact=False, rtol=1e-4, atol=1e-6)
