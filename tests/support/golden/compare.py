"""How a fresh analysis is held against the golden tables: `compare(table, expected, got)`.

The rule (CONTRIBUTING.md, "Golden tables"):
- Text, integer and boolean columns are identical, so every label, relation, `n`, `significant`
  flag and site is the committed one.
- Float columns agree to rtol 1e-4 (atol 1e-6), except the counts below.
- Counts of argmax hits: the syntactic detector's `accuracy`, `control_accuracy` and `baseline`
  (syntax.csv) are shares of `n` arcs whose predicted partner is an argmax over word attention.
  Two keys whose attention differs only in the last bits of a float can rank either way on
  another processor's vector kernels, so such a cell may differ by at most one arc, 1/n of its
  row, in at most `MAX_MOVED_SHARE` of the table's count cells (at least one).
- Statistics computed from those counts (the held-out margin and its bootstrap bounds in
  syntax.csv; a syntactic row's score, CI, control and control_max in scores.csv; a syntactic
  label's score in labels.csv) follow a moved count: they are compared at rtol 1e-4 in every
  (relation, direction) whose counts did not move, and left to the identical labels and
  `significant` flags in one whose counts did.
Every move is listed in the returned `Comparison`, which the golden test reports.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

RTOL, ATOL = 1e-4, 1e-6
COUNT_COLUMNS = ("accuracy", "control_accuracy", "baseline")  # shares of n arcs (syntax.csv)
SYNTAX_STATISTICS = ("held_out_margin", "ci_low", "ci_high")  # computed from those counts
SYNTACTIC_SCORE_COLUMNS = ("score", "ci_low", "ci_high", "control", "control_max")
MAX_MOVED_SHARE = 0.001  # of a table's count cells
UNIT_SLACK = 1e-4  # relative: the tables hold 7 significant digits


@dataclass
class Comparison:
    """What differs between a golden table and a fresh one."""

    table: str
    failures: list = field(default_factory=list)  # one line each
    moved: list = field(default_factory=list)  # count cells that moved by one arc: (row, column, expected, got, n)
    groups: set = field(default_factory=set)  # (relation, direction) whose counts moved
    count_cells: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        if not self.moved:
            return f"{self.table}: no count moved"
        return (f"{self.table}: {len(self.moved)} of {self.count_cells} count cells moved by one arc, in "
                f"{len(self.groups)} (relation, direction) pairs")


def _float_columns(frame: pd.DataFrame) -> list:
    return [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]


def _close(got, expected) -> np.ndarray:
    return np.isclose(np.asarray(got, float), np.asarray(expected, float), rtol=RTOL, atol=ATOL, equal_nan=True)


def _describe(report: Comparison, column: str, rows: np.ndarray, got, expected) -> None:
    first = int(rows[0])
    report.failures.append(f"{report.table}: {column} differs in {len(rows)} rows beyond rtol {RTOL} "
                           f"(first: row {first}, {got[first]!r} against {expected[first]!r})")


def compare(table: str, expected: pd.DataFrame, got: pd.DataFrame, heads=frozenset()) -> Comparison:
    """Hold `got` against `expected` under the module's rule.

    Args:
        table: the file name ("scores.csv", "labels.csv", "syntax.csv").
        expected, got: the golden table and the fresh one.
        heads: (layer, head) whose syntactic statistics follow a moved count (`syntactic_heads`
            of syntax.csv's comparison); their syntactic rows of scores.csv and labels.csv are
            relaxed as the module docstring says.
    Returns:
        A `Comparison`; `.ok` when the tables agree.
    """
    report = Comparison(table)
    if list(got.columns) != list(expected.columns):
        report.failures.append(f"{table}: columns {list(got.columns)} against {list(expected.columns)}")
        return report
    if len(got) != len(expected):
        report.failures.append(f"{table}: {len(got)} rows against {len(expected)}")
        return report
    floats = _float_columns(expected)
    others = [c for c in expected.columns if c not in floats]
    for column in others:
        a, b = got[column], expected[column]
        same = ((a.astype(object) == b.astype(object)) | (a.isna() & b.isna())).to_numpy()
        if not same.all():
            _describe(report, column, np.nonzero(~same)[0], got[column].to_numpy(), expected[column].to_numpy())
    if report.failures:
        return report
    relaxed = np.zeros(len(expected), dtype=bool)
    if table == "syntax.csv":
        _compare_counts(report, expected, got)
        report.groups = {(r, d) for r, d in ((expected.relation[i], expected.direction[i]) for i, *_ in report.moved)}
        relaxed = _in_groups(expected, report.groups)
        statistics = SYNTAX_STATISTICS
    elif table == "scores.csv":
        relaxed = (expected.detector == "syntactic").to_numpy() & _of_heads(expected, heads)
        statistics = SYNTACTIC_SCORE_COLUMNS
    elif table == "labels.csv":
        relaxed = expected.label.astype(str).str.startswith("syntactic").to_numpy() & _of_heads(expected, heads)
        statistics = ("score",)
    else:
        statistics = ()
    for column in floats:
        if table == "syntax.csv" and column in COUNT_COLUMNS:
            continue
        ok = _close(got[column], expected[column])
        if column in statistics:
            ok |= relaxed
        if not ok.all():
            _describe(report, column, np.nonzero(~ok)[0], got[column].to_numpy(), expected[column].to_numpy())
    return report


def _in_groups(frame: pd.DataFrame, groups) -> np.ndarray:
    if not groups or "relation" not in frame or "direction" not in frame:
        return np.zeros(len(frame), dtype=bool)
    pairs = list(zip(frame.relation.astype(str), frame.direction.astype(str)))
    return np.array([p in groups for p in pairs], dtype=bool)


def _compare_counts(report: Comparison, expected: pd.DataFrame, got: pd.DataFrame) -> None:
    """Count columns: equal to rtol, or one arc (1/n) apart; at most MAX_MOVED_SHARE of them."""
    n = expected["n"].to_numpy(float)
    columns = [c for c in COUNT_COLUMNS if c in expected]
    report.count_cells = len(expected) * len(columns)
    for column in columns:
        old, new = expected[column].to_numpy(float), got[column].to_numpy(float)
        close = _close(new, old)
        arcs = np.abs(new - old) * n  # the difference in arcs
        one_arc = ~close & np.isfinite(arcs) & (arcs <= 1 + UNIT_SLACK * np.maximum(1, old * n))
        for row in np.nonzero(one_arc)[0]:
            report.moved.append((int(row), column, float(old[row]), float(new[row]), int(n[row])))
        beyond = ~close & ~one_arc
        if beyond.any():
            rows = np.nonzero(beyond)[0]
            first = int(rows[0])
            report.failures.append(f"{report.table}: {column} differs by more than one arc in {len(rows)} rows "
                                   f"(first: row {first}, {new[first]!r} against {old[first]!r} of n={int(n[first])})")
    allowed = max(1, int(MAX_MOVED_SHARE * report.count_cells))
    if len(report.moved) > allowed:
        report.failures.append(f"{report.table}: {len(report.moved)} count cells moved by one arc, more than the "
                               f"{allowed} ({MAX_MOVED_SHARE:.1%} of {report.count_cells}) that float ties explain")


def _of_heads(frame: pd.DataFrame, heads) -> np.ndarray:
    keys = zip(frame.layer.astype(int), frame["head"].astype(int))
    return np.array([k in heads for k in keys], dtype=bool)


def syntactic_heads(expected: pd.DataFrame, got: pd.DataFrame, groups) -> set:
    """(layer, head) with a held-out margin, in either syntax.csv, in one of `groups`: the heads
    whose syntactic score, CI and control may follow a moved count."""
    inside = _in_groups(expected, groups)
    held = expected.held_out_margin.notna().to_numpy() | got.held_out_margin.notna().to_numpy()
    rows = expected[inside & held]
    return set(zip(rows.layer.astype(int), rows["head"].astype(int)))
