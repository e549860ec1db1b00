"""The detectors' own report sections (`Detector.report`), found without naming any detector.

- `detector_sections(meta)`: `(name, ReportSection)` of every detector with a section: those
  `meta["detectors"]` records, in its order, then the other registered ones (a section may have
  something to say about a detector that did not run, e.g. that it was skipped).
- `section_data(analysis)`: one `SectionData` (detector, data) per section.
- `section_header(meta)`, `section_warnings(meta)`, `section_summary(sections)`: what the
  sections add to the header, the warnings and the CLI / notebook summaries.
- `table(analysis, name)`: one of an analysis's tables by name (`analysis.tables[name]`, or the
  attribute of an `Analysis` without `tables`), None when absent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..detectors.registry import detector_specs, report_section
from ..detectors.section import ReportSection, analysis_table

__all__ = ["SectionData", "detector_sections", "section_data", "section_header", "section_warnings",
           "section_summary", "table"]

table = analysis_table


@dataclass(frozen=True)
class SectionData:
    """One detector's section: its name, the values its `ReportSection.data` read, and the section."""

    detector: str
    data: Any
    section: ReportSection = field(repr=False, compare=False)


def detector_sections(meta: dict) -> tuple:
    """`(name, ReportSection)` for the analysis's detectors that have a section (`registry.detector_specs`:
    the recorded ones, then, for an older analysis, the other registered ones)."""
    found = ((name, report_section(name)) for name in detector_specs(meta))
    return tuple((name, section) for name, section in found if section is not None)


def section_data(analysis) -> tuple:
    """One `SectionData` per section, in `detector_sections` order."""
    return tuple(SectionData(name, section.data(analysis), section) for name, section in detector_sections(analysis.meta))


def section_header(meta: dict) -> list:
    """`(name, value)` header lines of every section."""
    return [line for _, section in detector_sections(meta) for line in section.header(meta)]


def section_warnings(meta: dict) -> list:
    """Warnings of every section."""
    return [warning for _, section in detector_sections(meta) for warning in section.warnings(meta)]


def section_summary(sections) -> list:
    """Summary lines of every section (`SectionData`s)."""
    return [line for s in sections for line in s.section.summary(s.data)]
