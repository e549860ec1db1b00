"""The result of `headscope.analyze`: per-head scores, labels, metadata, tables and example patterns.

- `Analysis`: `.scores` (layer, head, detector, score, ci_low, ci_high, n, control,
  control_max: the control model's score for the head and its best over heads; site: the module
  path of the head's attention), `.labels` (layer, head, label, score, labels, site), `.meta` (dict), `.examples` (list of `Example`), `.tables` (name ->
  DataFrame: every detector's `Finding.tables` and the OV circuit's `ov`, each saved as
  `<name>.csv`; `add_table(name, frame)` adds one; a table also reads as an attribute,
  `analysis.my_table`, and `.syntax`, `.retrieval`, `.needles`, `.ov`, once fields, read as None
  when absent; setting any other attribute is an AttributeError, so a typo cannot become a table), `.validation` (what ablating each label's heads did, when
  `headscope.validate` ran) and `.geometry` (a `GeometryResult`: subspaces, pattern similarity,
  importance, pruning curve, when `headscope.add_geometry` ran; `with_geometry(result)` attaches
  one; saved in the folder's `geometry/`).
- `Analysis.save(dir)` / `Analysis.load(dir)`: a folder of CSV and JSON files, written
  atomically (a temporary folder renamed into place), read only when its manifest and the
  shape of every table check out (`unverified=True`: without the manifest's word). Every other
  `<name>.csv` of the folder is a table, so folders of any version load.
- `Example`: one probe example's tokens and every head's pattern, stored as uint8 (pattern x 255,
  rounded) to keep reports small; cross-attention's keys are other tokens than its queries
  (`key_tokens`, the encoder's), saved only where present so older folders read the same.
- `atomic_dir` (from `headscope.atomic`): the temporary folder renamed into place.
Column lists and the validation table's CSV form come from `headscope.tables` (no torch).
"""
from __future__ import annotations

import base64
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..atomic import atomic_dir
from ..folders import check_folder, write_card, write_manifest
from ..tables import LABEL_COLUMNS, SCORE_COLUMNS, SITE, read_csv, read_table, with_sites, write_csv
from ..errors import HeadscopeError
from .meta import check_saved
from ..report.notebook import analysis_html, analysis_text
from ..report.plotting import plot_head, plot_labels, plot_scores, plot_syntax
from ..head_geometry.geometry_result import GEOMETRY_FOLDER, read_geometry_tables, write_geometry_tables

__all__ = ["Analysis", "Example", "atomic_dir"]

OWN_FILES = ("scores", "labels", "validation")  # <name>.csv files that are not tables
RENDER = "headscope report"  # renders a saved analysis's page (its card names it for `report --index`)
# Tables that were fields of `Analysis` before it kept one mapping: they still read as None when absent
# (`analysis.syntax is None`). Any other absent name raises AttributeError, so duck typing
# (`hasattr(x, "best")`) still tells an analysis from other results. Saving and loading name no table.
FORMER_FIELDS = ("syntax", "retrieval", "needles", "ov")
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a file stem and an attribute name


@dataclass
class Example:
    """One probe example shown in the head explorer.

    Attributes:
        probe: probe name ("text", "repeated", ...).
        index: example number within the probe.
        tokens: token strings as the tokenizer gives them, the query axis's (escape before
            putting in HTML); at an encoder-decoder's decoder sites, the decoder's input.
        patterns: uint8 `[layer, head, query, key]`, attention x 255 rounded.
        key_tokens: the key axis's tokens where they are not `tokens` (cross-attention: the
            encoder's input), else None: keys are the query tokens.
    """

    probe: str
    index: int
    tokens: list[str]
    patterns: np.ndarray
    key_tokens: Optional[list[str]] = None

    def __post_init__(self):
        queries, keys = self.patterns.shape[-2:]
        if (queries, keys) != (len(self.tokens), len(self.keys)):
            raise HeadscopeError(f"example {self.probe} #{self.index}: [query, key] maps of {queries} x {keys} do not "
                                 f"fit {len(self.tokens)} query and {len(self.keys)} key tokens")

    @property
    def keys(self) -> list[str]:
        """The key axis's tokens: `key_tokens`, or `tokens` where keys are the queries."""
        return self.tokens if self.key_tokens is None else self.key_tokens

    def pattern(self, layer: int, head: int) -> np.ndarray:
        """Float `[query, key]` pattern of one head (to within 1/510)."""
        return self.patterns[layer, head].astype(np.float32) / 255.0

    def to_json(self) -> dict:
        data = {
            "probe": self.probe, "index": self.index, "tokens": self.tokens,
            "shape": list(self.patterns.shape),
            "patterns_uint8_base64": base64.b64encode(np.ascontiguousarray(self.patterns, dtype=np.uint8).tobytes()).decode(),
        }
        if self.key_tokens is not None:  # written only when present: older examples save as they did
            data["key_tokens"] = self.key_tokens
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Example":
        raw = np.frombuffer(base64.b64decode(data["patterns_uint8_base64"]), dtype=np.uint8)
        keys = data.get("key_tokens")
        return cls(data["probe"], int(data["index"]), list(data["tokens"]), raw.reshape(data["shape"]).copy(),
                   None if keys is None else list(keys))

    @classmethod
    def from_float(cls, probe: str, index: int, tokens: list[str], patterns,
                   key_tokens: Optional[list[str]] = None) -> "Example":
        """Quantise float patterns `[layer, head, query, key]` in [0, 1]; `key_tokens` as the attribute."""
        arr = np.asarray(patterns, dtype=np.float32)
        return cls(probe, index, list(tokens), np.clip(np.rint(arr * 255.0), 0, 255).astype(np.uint8),
                   None if key_tokens is None else list(key_tokens))


@dataclass(init=False)
class Analysis:
    """Scores, labels, tables and metadata of one model's heads; see the module docstring.

    `Analysis(scores, labels, meta, examples, tables={"syntax": frame})`; a table may also be
    passed by name (`syntax=frame`), and None leaves it out. `add_table(name, frame)` adds or
    replaces one later (`del analysis.tables[name]` removes it). A table reads as an attribute
    (`analysis.syntax`), but only the fields below can be set: any other name raises
    `AttributeError`, so `analysis.lables = frame` is an error, not a table saved as lables.csv.

    Attributes:
        scores: one row per head and detector: layer, head, detector, score, ci_low, ci_high, n,
            control, control_max, site.
        labels: one row per head: layer, head, label, score, labels (every detector it passes), site.
        meta: the model, probes, detectors, control, versions and timings (`AnalysisMeta`).
        examples: `Example`s, each probe example's tokens and every head's pattern (the explorer's).
        tables: name -> DataFrame: the detectors' own tables (syntax, retrieval, needles) and `ov`.
        validation: what ablating each label's top heads did (`headscope.validate`), or None.
        geometry: a `GeometryResult` (`headscope.add_geometry`), or None.
    """

    scores: Any  # pandas.DataFrame
    labels: Any  # pandas.DataFrame
    meta: dict
    examples: list[Example] = field(default_factory=list)
    tables: dict = field(default_factory=dict)  # name -> pandas.DataFrame, saved as <name>.csv
    validation: Optional[Any] = None  # pandas.DataFrame from headscope.validate, or None
    geometry: Optional[Any] = None  # headscope.head_geometry.geometry_result.GeometryResult, or None

    def __init__(self, scores, labels, meta, examples=None, tables=None, validation=None, geometry=None, **named):
        self.scores, self.labels, self.meta = scores, labels, meta
        self.examples = [] if examples is None else examples
        self.tables = {}
        for name, table in {**(tables or {}), **named}.items():
            self._set_table(name, table)
        self.validation, self.geometry = validation, geometry

    def __getattr__(self, name: str):
        """A table by name (`analysis.syntax`, `analysis.my_table`)."""
        tables = self.__dict__.get("tables")  # absent while copy or pickle rebuilds the object
        if tables is not None and name in tables:
            return tables[name]
        if name in FORMER_FIELDS:
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute or table {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if not (name.startswith("_") or name in self.__dataclass_fields__):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} to set (its fields: "
                                 f"{', '.join(self.__dataclass_fields__)}); add a table with "
                                 f"analysis.add_table({name!r}, frame)")
        object.__setattr__(self, name, value)

    def add_table(self, name: str, table) -> None:
        """Add a table (or replace the one of that name); it is saved as `<name>.csv` and reads as
        `analysis.<name>`.

        Args:
            name: an identifier other than the analysis's own names (scores, labels, validation,
                its fields and methods).
            table: a pandas DataFrame.

        Returns:
            None; the table is in `analysis.tables[name]`.
        """
        if table is None:
            raise HeadscopeError(f"add_table({name!r}, None): give a DataFrame (del analysis.tables[{name!r}] "
                                 f"removes a table)")
        self._set_table(name, table)

    def _set_table(self, name: str, value) -> None:
        if (not TABLE_NAME.match(name) or name in OWN_FILES or name in self.__dataclass_fields__
                or hasattr(type(self), name)):
            raise HeadscopeError(f"{name!r} cannot name a table: tables are saved as <name>.csv and read as "
                                 f"attributes, so the name must be an identifier other than the analysis's own "
                                 f"({', '.join(OWN_FILES)}, the fields and methods)")
        if value is None:
            self.tables.pop(name, None)
        else:
            self.tables[name] = value

    @property
    def n_layers(self) -> int:
        return int(self.meta["n_layers"])

    @property
    def n_heads(self) -> int:
        return int(self.meta["n_heads"])

    @property
    def detectors(self) -> list[str]:
        return list(dict.fromkeys(self.scores["detector"]))

    def score_grid(self, detector: str, column: str = "score") -> np.ndarray:
        """`[layer, head]` array of one detector's column (NaN where missing)."""
        grid = np.full((self.n_layers, self.n_heads), np.nan)
        rows = self.scores[self.scores.detector == detector]
        grid[rows.layer.to_numpy(), rows["head"].to_numpy()] = rows[column].to_numpy()
        return grid

    def heads_with(self, label: str) -> Any:
        """Rows of `.labels` with this label, strongest first."""
        rows = self.labels[self.labels.label == label]
        return rows.sort_values("score", ascending=False)

    def with_geometry(self, result) -> "Analysis":
        """A copy of this analysis holding `result` (a `GeometryResult` of the same model shape: the
        analysis's heads per layer, and its scored layers, a hybrid's attention layers)."""
        scored = tuple(sorted({int(l) for l in self.scores.layer})) or tuple(range(self.n_layers))
        if (result.layers, result.shape[1]) != (scored, self.n_heads):
            def grid(layers, n_layers, n_heads):
                if layers == tuple(range(n_layers)):
                    return f"{n_layers} x {n_heads}"
                return f"layers {', '.join(map(str, layers))} x {n_heads}"
            raise HeadscopeError(f"the geometry is of a {grid(result.layers, len(result.layers), result.shape[1])} "
                                 f"model, the analysis of {grid(scored, self.n_layers, self.n_heads)} "
                                 f"({self.meta.get('model', 'model')})")
        return replace(self, geometry=result)

    # Display: figures come from the report's builders (headscope.report.plotting, headscope.report.notebook).

    def plot_labels(self):
        """The label map as a plotly figure; see `headscope.report.plotting.plot_labels`."""
        return plot_labels(self)

    def plot_scores(self, detector: str):
        """One detector's `[layer, head]` scores as a plotly heatmap; see `headscope.report.plotting.plot_scores`."""
        return plot_scores(self, detector)

    def plot_head(self, layer: int, head: int, probe: Optional[str] = None, example: int = 0):
        """A head's pattern on a stored example, tokens on the axes; see `headscope.report.plotting.plot_head`."""
        return plot_head(self, layer, head, probe=probe, example=example)

    def plot_syntax(self):
        """Best head per relation vs baseline (needs `.syntax`); see `headscope.report.plotting.plot_syntax`."""
        return plot_syntax(self)

    def _repr_html_(self) -> str:
        """Jupyter's view: summary and interactive label map, offline (`headscope.report.notebook`)."""
        return analysis_html(self)

    def __repr__(self) -> str:
        return analysis_text(self)

    def save(self, directory, *, force: bool = False) -> Path:
        """Write scores.csv, labels.csv, meta.json, examples.json, `<name>.csv` for each table
        (and validation.csv, geometry/) atomically.

        Args:
            directory: target folder; must not exist unless `force`.
            force: replace an existing folder.
        Returns:
            The folder's path.
        """
        if not isinstance(directory, (str, os.PathLike)):
            raise HeadscopeError(f"Analysis.save needs a folder to write, got {directory!r}")
        with atomic_dir(directory, force=force) as tmp:
            self.write_into(tmp)
        return Path(directory)

    def write_into(self, folder: Path) -> None:
        """Write the analysis files into an existing folder (no atomicity of its own)."""
        folder = Path(folder)
        self.scores.reindex(columns=SCORE_COLUMNS + [SITE]).to_csv(folder / "scores.csv", index=False)
        self.labels.reindex(columns=LABEL_COLUMNS + [SITE]).to_csv(folder / "labels.csv", index=False)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=2, default=str))
        (folder / "examples.json").write_text(json.dumps([e.to_json() for e in self.examples]))
        for name, table in self.tables.items():
            table.to_csv(folder / f"{name}.csv", index=False)
        if self.validation is not None:
            write_csv(self.validation, folder / "validation.csv")
        if self.geometry is not None:
            write_geometry_tables(self.geometry, folder / GEOMETRY_FOLDER)
        write_manifest(folder)  # sizes and hashes, checked by `load`
        write_card(folder, "analysis", title=str(self.meta.get("model", "?")), model=str(self.meta.get("model", "")),
                   created=str(self.meta.get("created", "")), headline=self.headline(), render=RENDER)

    def headline(self, k: int = 4) -> list:
        """`(name, value)` pairs for a list of analyses: the head grid, the `k` labels most heads
        got (a `syntactic:<relation>` label counted as "syntactic") and the control."""
        labels = self.labels.label.astype(str).str.split(":").str[0]
        counts = labels[labels != "none"].value_counts()
        counts = counts.sort_index().sort_values(ascending=False, kind="stable").head(k)
        control = (self.meta.get("control") or {}).get("kind", "none") if isinstance(self.meta.get("control"), dict) \
            else str(self.meta.get("control") or "none")
        return [("heads", f"{self.n_layers} × {self.n_heads}"), *[(name, str(int(n))) for name, n in counts.items()],
                ("control", control)]

    @classmethod
    def load(cls, directory, *, unverified: bool = False) -> "Analysis":
        """Read an analysis written by `save`.

        Args:
            directory: the folder.
            unverified: also read a folder whose manifest is missing or no longer matches (a
                `HeadscopeWarning` says so); its tables are checked all the same.
        Raises:
            HeadscopeError: naming the file: a symbolic link inside the folder; a file that
                differs from the folder's manifest (cut, changed or missing since it was
                written) or a folder carrying headscope's marker without one
                (`headscope.atomic.check_folder`); a table of the wrong shape, with text or
                infinite numbers where scores belong (`check_saved`).
        """
        if not isinstance(directory, (str, os.PathLike)):
            raise HeadscopeError(f"Analysis.load needs the folder an analysis was saved in, got {directory!r}")
        folder = Path(directory)
        needed = ["scores.csv", "labels.csv", "meta.json"]
        missing = [n for n in needed if not (folder / n).is_file()]
        if missing:
            raise HeadscopeError(f"{folder} is not a headscope analysis (missing {', '.join(missing)})")
        check_folder(folder, needed, unverified=unverified)
        scores = read_table(folder / "scores.csv")
        for column in ("control", "control_max"):  # analyses saved before controls existed
            if column not in scores:
                scores[column] = float("nan")
        labels = read_table(folder / "labels.csv", keep_default_na=False)
        with _reading(folder / "meta.json"):
            meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        examples_file = folder / "examples.json"
        with _reading(examples_file):
            examples = _read_examples(examples_file) if examples_file.exists() else []
        tables = {path.stem: read_table(path) for path in sorted(folder.glob("*.csv"))
                  if path.stem not in OWN_FILES and TABLE_NAME.match(path.stem)}
        validation = read_csv(folder / "validation.csv") if (folder / "validation.csv").exists() else None
        geometry = None
        if (folder / GEOMETRY_FOLDER).is_dir():
            with _reading(folder / GEOMETRY_FOLDER):
                geometry = read_geometry_tables(folder / GEOMETRY_FOLDER)
        check_saved(meta, scores, labels, folder, tables, examples)
        # Folders saved before tables named sites: the module paths meta.json records (a decoder's
        # group), else none known.
        modules = {int(layer): path for layer, path in meta.get("sites", {}).get("modules", {}).items()
                   if str(layer).isdigit()}
        scores, labels = with_sites(scores, modules), with_sites(labels, modules)
        return cls(scores=scores, labels=labels, meta=meta, examples=examples, tables=tables, validation=validation,
                   geometry=geometry)


@contextmanager
def _reading(path: Path):
    """A fault while reading `path` as one HeadscopeError naming it."""
    try:
        yield
    except HeadscopeError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, OSError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise HeadscopeError(f"{path} is damaged ({type(err).__name__}: {first}); re-run headscope analyze") from None


def _read_examples(path: Path) -> list:
    """examples.json's examples; HeadscopeError naming the file and the missing field."""
    try:
        return [Example.from_json(entry) for entry in json.loads(path.read_text())]
    except KeyError as err:
        raise HeadscopeError(f"{path} is damaged: an example lacks the field {err}; re-run headscope analyze") from None
    except (TypeError, AttributeError):
        raise HeadscopeError(f"{path} is damaged: it is not a list of examples; re-run headscope analyze") from None
