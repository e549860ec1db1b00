"""The golden tables' comparison rule (tests/support/golden/compare.py) on planted differences:
a count one arc off passes and is reported, two arcs or too many cells fail, labels and flags
must be identical, and the statistics of a count that did not move keep rtol 1e-4."""
import numpy as np
import pandas as pd
import pytest

from tests.support.golden import compare as rule
from tests.support.golden.compare import compare, syntactic_heads


def _syntax(rows=40) -> pd.DataFrame:
    """A syntax table: 4 heads x 10 (relation, direction) pairs, n arcs 50..59, hits planted."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "layer": np.repeat([0, 0, 1, 1], rows // 4), "head": np.repeat([0, 1, 0, 1], rows // 4),
        "relation": [f"rel{i % 5}" for i in range(rows)],
        "direction": ["dep->head" if i % 10 < 5 else "head->dep" for i in range(rows)],
        "n": 50 + np.arange(rows) % 10})
    frame["accuracy"] = rng.integers(0, 40, rows) / frame.n
    frame["baseline"] = 20 / frame.n
    frame["control_accuracy"] = rng.integers(0, 20, rows) / frame.n
    frame["held_out_margin"] = np.where(np.arange(rows) % 3 == 0, frame.accuracy - frame.baseline, np.nan)
    frame["ci_low"] = frame.held_out_margin - 0.05
    frame["ci_high"] = frame.held_out_margin + 0.05
    frame["significant"] = frame.ci_low >= 0.1
    return frame


def _scores(syntax: pd.DataFrame) -> pd.DataFrame:
    heads = syntax.drop_duplicates(["layer", "head"])
    return pd.DataFrame({"layer": heads.layer, "head": heads["head"], "detector": "syntactic",
                         "score": heads.accuracy, "ci_low": heads.accuracy - 0.1, "ci_high": heads.accuracy + 0.1,
                         "n": heads.n, "control": 0.0, "control_max": 0.1}).reset_index(drop=True)


def test_identical_tables_pass_with_nothing_moved():
    syntax = _syntax()
    report = compare("syntax.csv", syntax, syntax.copy())
    assert report.ok and report.moved == [] and report.summary() == "syntax.csv: no count moved"


def test_one_arc_passes_and_is_reported():
    expected = _syntax()
    got = expected.copy()
    got.loc[7, "accuracy"] += 1 / got.n[7]
    report = compare("syntax.csv", expected, got)
    assert report.ok, report.failures
    assert report.moved == [(7, "accuracy", expected.accuracy[7], got.accuracy[7], int(expected.n[7]))]
    assert report.groups == {(expected.relation[7], expected.direction[7])}
    assert "1 of 120 count cells moved by one arc" in report.summary()


def test_two_arcs_fail_naming_the_row():
    expected = _syntax()
    got = expected.copy()
    got.loc[3, "control_accuracy"] += 2 / got.n[3]
    report = compare("syntax.csv", expected, got)
    assert not report.ok
    assert "control_accuracy differs by more than one arc in 1 rows (first: row 3" in report.failures[0]


def test_more_moved_cells_than_ties_explain_fail(monkeypatch):
    monkeypatch.setattr(rule, "MAX_MOVED_SHARE", 0.01)  # 1 of 120 cells allowed
    expected = _syntax()
    got = expected.copy()
    got.loc[[1, 2], "accuracy"] += 1 / got.n[[1, 2]]
    report = compare("syntax.csv", expected, got)
    assert not report.ok and "2 count cells moved by one arc, more than the 1" in report.failures[0]


def test_statistics_follow_only_a_moved_count():
    expected = _syntax()
    got = expected.copy()
    got.loc[0, "accuracy"] += 1 / got.n[0]  # row 0 holds a held-out margin
    got.loc[0, "held_out_margin"] += 1 / got.n[0]
    assert compare("syntax.csv", expected, got).ok
    unmoved = expected.copy()
    unmoved.loc[0, "held_out_margin"] += 1 / unmoved.n[0]  # the same change without its count
    report = compare("syntax.csv", expected, unmoved)
    assert not report.ok and "held_out_margin differs in 1 rows" in report.failures[0]


@pytest.mark.parametrize("column, value", [("significant", True), ("relation", "other"), ("n", 999)])
def test_text_flag_and_integer_columns_are_exact(column, value):
    expected = _syntax()
    got = expected.copy()
    got.loc[5, column] = value if column != "significant" else not expected.significant[5]
    report = compare("syntax.csv", expected, got)
    assert not report.ok and f"{column} differs in 1 rows" in report.failures[0]


def test_scores_of_heads_a_moved_count_reaches_are_relaxed_and_no_others():
    syntax = _syntax()
    same_pair = (syntax.relation == syntax.relation[0]) & (syntax.direction == syntax.direction[0])
    syntax.loc[same_pair & (syntax.layer == 1), "held_out_margin"] = np.nan  # layer 1 holds none of it
    moved = syntax.copy()
    moved.loc[0, "accuracy"] += 1 / moved.n[0]
    report = compare("syntax.csv", syntax, moved)
    heads = syntactic_heads(syntax, moved, report.groups)
    assert (0, 0) in heads and (1, 1) not in heads
    expected = _scores(syntax)
    got = expected.copy()
    got.loc[0, "score"] += 0.02  # head (0, 0): follows the moved count
    assert compare("scores.csv", expected, got, heads=heads).ok
    assert not compare("scores.csv", expected, got, heads=set()).ok
    elsewhere = expected.copy()
    elsewhere.loc[3, "score"] += 0.02  # head (1, 1) has no moved count
    assert not compare("scores.csv", expected, elsewhere, heads=heads).ok


def test_labels_must_be_identical():
    expected = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "label": ["induction", "syntactic:nsubj"],
                             "score": [0.9, 0.2], "labels": ["induction", np.nan], "site": ["a", "b"]})
    assert compare("labels.csv", expected, expected.copy()).ok
    got = expected.assign(label=["induction", "none"])
    assert not compare("labels.csv", expected, got, heads={(1, 0)}).ok
    moved = expected.assign(score=[0.9, 0.21])
    assert compare("labels.csv", expected, moved, heads={(1, 0)}).ok
    assert not compare("labels.csv", expected, moved).ok
