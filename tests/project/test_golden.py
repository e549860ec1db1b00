"""`headscope analyze` on both bundled models gives the committed golden scores, CIs and labels (slow).

The golden tables (tests/support/golden/MODEL/*.csv) were written by tests/support/golden/regenerate.py;
the run is the session's (`golden_analyses`), which tests/cli/test_real_cli.py reads too. A
refactor must leave them unchanged; a change that moves them on purpose regenerates them and
says so in its commit.

The rule a fresh run is held to is `tests/support/golden/compare.py`'s: labels and every text,
integer and flag column identical; floats to rtol 1e-4; the syntactic detector's counts of argmax
hits (accuracy, control accuracy, baseline: shares of n arcs) may differ by one arc in at most
0.1% of their cells, since a near-tied argmax breaks either way on another processor's vector
kernels; the statistics computed from a moved count follow it. Each test reports how many count
cells moved. Set HEADSCOPE_GOLDEN_KERNELS=default to run the analyses on the machine's own
kernels instead of the pinned AVX2 ones (both must pass).
"""
import warnings

import pandas as pd
import pytest

from tests.support.golden.compare import compare, syntactic_heads
from tests.support.golden.regenerate import HERE as GOLDEN, MODELS, TABLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=MODELS)
def analysed(request, golden_analyses):
    """(model, tables: name -> (expected, got), the syntax comparison, heads its moves reach)."""
    model = request.param
    out, result = golden_analyses(model)  # the session's run (tests/conftest.py)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = {t: (pd.read_csv(GOLDEN / model / t), pd.read_csv(out / t)) for t in TABLES}
    syntax = compare("syntax.csv", *tables["syntax.csv"])
    heads = syntactic_heads(*tables["syntax.csv"], syntax.groups) if syntax.ok else set()
    return model, tables, syntax, heads


@pytest.mark.parametrize("table", TABLES)
def test_analyze_matches_golden(analysed, table):
    model, tables, syntax, heads = analysed
    report = syntax if table == "syntax.csv" else compare(table, *tables[table], heads=heads)
    if table == "syntax.csv" and report.moved:
        warnings.warn(f"{model} {report.summary()}: " + "; ".join(
            f"row {row} {column} {old:.6g} -> {new:.6g} (n={n})" for row, column, old, new, n in report.moved[:10]))
    assert report.ok, "\n".join(report.failures)
