"""The files KV-compression tools read, written and read back.

- DuoAttention (`write_duo(policy, folder)` / `read_duo(folder)`): a folder with
  `full_attention_heads.tsv`, one row per layer and one tab-separated column per key/value
  head, each the head's value in [0, 1] (DuoAttention reads it with
  `np.loadtxt(path, delimiter="\\t")`, clips it to [0, 1] and keeps as full the heads above a
  quantile; NVIDIA kvpress's `DuoAttentionPress` reads the same file), and `config.json` with
  `sink_size` and `recent_size`. headscope adds `full_fraction` (keep), `n_heads`, `model` and
  `rank_by` to config.json, so reading the folder back gives the same policy.
- HeadKV / Wu et al. (`write_headkv(policy, path)` / `read_headkv(path, ...)`): one JSON object
  `{"layer-head": [value]}` over query heads (HeadKV averages each list). The format carries
  scores only: keep, sink, recent and the number of key/value heads are given when reading.
- `read_policy(path, ...)`: either, by what `path` is (a folder: DuoAttention; a file: HeadKV).
- `written_by_headscope(data)`: whether a HeadKV file's bytes are what `write_headkv` writes for
  the values it holds (one value per list, headscope's layout): only such a file is replaced by
  `--force` (`headscope.atomic`'s rule; a folder carries the marker instead).
Values are written with 17 significant digits, so they read back bit for bit. Both are written
atomically under `headscope.atomic`'s rule (`force`, `protect`).

Reading checks every field, each fault one HeadscopeError naming the file, the field and what
was expected: the TSV's rows (numbers, equal lengths, finite, a last line that headscope's own
folder ends with a line break) and its columns against `n_heads`; config.json's JSON and every
field headscope reads (`DUO_FIELDS`); the JSON's keys, grid and values. A DuoAttention value
outside [0, 1] is clipped, as DuoAttention's reader clips it, with a `HeadscopeWarning`; HeadKV's
reader does not clip, so such a value there is refused.
"""
from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Optional

import numpy as np

from ..atomic import atomic_dir, atomic_file
from ..folders import MARKER
from ..errors import HeadscopeError, HeadscopeWarning, UsageError
from .policy import KVPolicy, default_window, kv_head_scores, policy_from_values

__all__ = ["DUO_TSV", "DUO_CONFIG", "DUO_FIELDS", "write_duo", "read_duo", "write_headkv", "read_headkv",
           "read_policy", "written_by_headscope"]

DUO_TSV = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
HEAD_KEY = re.compile(r"(\d+)-(\d+)\Z")


def _whole(least: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least


DUO_FIELDS = {  # config.json's fields headscope reads: (check, what was expected)
    "sink_size": (_whole(0), "a whole number >= 0"),
    "recent_size": (_whole(1), "a whole number >= 1"),
    "full_fraction": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                      "a number in (0, 1]"),
    "n_heads": (_whole(1), "a whole number >= 1"),
    "model": (lambda v: isinstance(v, str), "a string"),
    "rank_by": (lambda v: isinstance(v, str), "a string"),
}


def duo_tsv(policy: KVPolicy) -> str:
    """The TSV text: one line per layer, the key/value heads' values tab-separated."""
    return "".join("\t".join(f"{v:.17g}" for v in row) + "\n" for row in policy.values)


def duo_config(policy: KVPolicy) -> dict:
    return {"sink_size": policy.sink, "recent_size": policy.recent, "full_fraction": policy.keep,
            "n_heads": policy.n_heads, "model": policy.model, "rank_by": policy.rank_by}


def write_duo(policy: KVPolicy, folder, force: bool = False, protect=()) -> Path:
    """Write DuoAttention's `full_attention_heads.tsv` and `config.json` into `folder` (atomically;
    `force` and `protect` as `headscope.atomic.atomic_dir`)."""
    with atomic_dir(folder, force=force, protect=protect) as tmp:
        (tmp / DUO_TSV).write_text(duo_tsv(policy), encoding="utf-8")
        (tmp / DUO_CONFIG).write_text(json.dumps(duo_config(policy), indent=1), encoding="utf-8")
    return Path(folder)


def read_duo(folder, keep: Optional[float] = None, n_heads: Optional[int] = None, sink: Optional[int] = None,
             recent: Optional[int] = None) -> KVPolicy:
    """A policy from a DuoAttention folder, read as DuoAttention does (loadtxt, tab, clip to [0, 1]).

    keep, n_heads, sink, recent: override config.json (needed when it lacks them: a folder
    DuoAttention wrote has no `full_fraction`; n_heads defaults to the key/value heads, MHA).
    """
    folder = Path(folder)
    tsv, config_path = folder / DUO_TSV, folder / DUO_CONFIG
    if not tsv.is_file():
        raise HeadscopeError(f"{folder} has no {DUO_TSV}: not a DuoAttention pattern folder")
    values = _read_tsv(tsv, ours=(folder / MARKER).is_file())
    config = _read_config(config_path)
    keep = config.get("full_fraction") if keep is None else keep
    if keep is None:
        raise HeadscopeError(f"{config_path} does not say what fraction of heads to keep full; pass keep")
    n_kv = values.shape[1]
    if n_heads is None:
        n_heads = config.get("n_heads", n_kv)
        if n_heads % n_kv:
            raise HeadscopeError(f"{tsv} has {n_kv} values per row (one per key/value head), which the {n_heads} query "
                                 f"heads {config_path} gives (n_heads) cannot share evenly; expected a column count "
                                 f"that divides n_heads")
    sink = config.get("sink_size", default_window(None)[0]) if sink is None else sink
    recent = config.get("recent_size", default_window(None)[1]) if recent is None else recent
    return policy_from_values(values, keep, int(n_heads), sink, recent, config.get("model", ""),
                              config.get("rank_by", "duo"))


def _read_tsv(tsv: Path, ours: bool) -> np.ndarray:
    """The `[layer, kv_head]` table as DuoAttention's `np.loadtxt(tsv, delimiter="\\t")` reads it
    (blank lines and `#` comments skipped), each fault named; values outside [0, 1] clipped with a
    warning. `ours`: headscope wrote the folder, so a last line without its line break is cut."""
    try:
        text = tsv.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise HeadscopeError(f"cannot read {tsv} ({type(err).__name__}: {err})") from None
    if text and not text.endswith("\n"):
        cut = f"{tsv} does not end with a line break, so its last row may be cut"
        if ours:
            raise HeadscopeError(f"{cut} (headscope ends every row with one); write the policy again")
        warnings.warn(f"{cut}; read as it is", HeadscopeWarning, stacklevel=3)
    rows, where = [], []
    for number, line in enumerate(text.splitlines(), 1):
        cells = line.split("#")[0]
        if not cells.strip():
            continue
        row = []
        for column, cell in enumerate(cells.split("\t"), 1):
            try:
                value = float(cell)
            except ValueError:
                value = None
            if value is None or not math.isfinite(value):
                raise HeadscopeError(f"{tsv}: line {number}, column {column} is {cell.strip()!r}; expected a finite "
                                     f"number in [0, 1] (one per key/value head, tab-separated)")
            row.append(value)
        if rows and len(row) != len(rows[0]):
            raise HeadscopeError(f"{tsv}: line {number} has {len(row)} values, line {where[0]} has {len(rows[0])}; "
                                 f"expected one value per key/value head on every line")
        rows.append(row)
        where.append(number)
    if not rows:
        raise HeadscopeError(f"{tsv} holds no values; expected one line per layer, one value per key/value head")
    values = np.array(rows, dtype=np.float64)
    outside = (values < 0) | (values > 1)
    if outside.any():
        warnings.warn(f"{tsv}: {int(outside.sum())} value(s) lie outside [0, 1] (from {values.min():g} to "
                      f"{values.max():g}); clipped to [0, 1], as DuoAttention reads them", HeadscopeWarning,
                      stacklevel=3)
    return np.clip(values, 0.0, 1.0)


def _read_config(path: Path) -> dict:
    """config.json's fields (`DUO_FIELDS` checked; {} without the file)."""
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise HeadscopeError(f"cannot read {path} as JSON (cut or edited?): {str(err).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise HeadscopeError(f"{path} holds a JSON {type(config).__name__}; expected an object of fields "
                             f"(sink_size, recent_size, ...)")
    for name, (ok, expected) in DUO_FIELDS.items():
        if name in config and not ok(config[name]):
            raise HeadscopeError(f"{path}: {name} is {config[name]!r}; expected {expected}")
    return config


def headkv_json(policy: KVPolicy) -> dict:
    """`{"layer-head": [value]}` over query heads, layer-major."""
    L, H = policy.head_values.shape
    return {f"{l}-{h}": [float(policy.head_values[l, h])] for l in range(L) for h in range(H)}


def _headkv_text(data: dict) -> str:
    return json.dumps(data, indent=0)


def write_headkv(policy: KVPolicy, path, force: bool = False, protect=()) -> Path:
    """Write the HeadKV JSON to `path` (a temporary file renamed into place); `force` replaces
    only a file `written_by_headscope`, `protect` as `headscope.atomic.atomic_file`."""
    with atomic_file(path, force=force, protect=protect, ours=written_by_headscope) as tmp:
        tmp.write_text(_headkv_text(headkv_json(policy)), encoding="utf-8")
    return Path(path)


def written_by_headscope(data: bytes) -> bool:
    """Whether `data` is a HeadKV file as `write_headkv` writes it: `{"L-H": [float]}` over a full
    grid of heads, laid out byte for byte as headscope lays it out. A file another tool wrote,
    or one edited by hand, is not (so `--force` does not replace it)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    if not isinstance(parsed, dict) or not parsed:
        return False
    heads = [HEAD_KEY.match(key) for key in parsed]
    if not all(heads) or not all(isinstance(v, list) and len(v) == 1 and type(v[0]) is float for v in parsed.values()):
        return False
    layers, per_layer = {int(m[1]) for m in heads}, {int(m[2]) for m in heads}
    return len(parsed) == len(layers) * len(per_layer) and _headkv_text(parsed) == data.decode("utf-8")


def read_headkv(path, keep: float, n_kv_heads: Optional[int] = None, sink: Optional[int] = None,
                recent: Optional[int] = None, model: str = "") -> KVPolicy:
    """A policy from a HeadKV JSON: each query head's value is the mean of its list, which must lie
    in [0, 1]; a key/value head's the largest of its query heads' (`n_kv_heads`, default: MHA)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise HeadscopeError(f"cannot read {path} as JSON (cut or edited?): {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict) or not data:
        raise HeadscopeError(f"{path} is not a HeadKV object {{\"layer-head\": [scores]}}")
    entries = {}
    for key, scores in data.items():
        match = HEAD_KEY.match(str(key))
        if match is None:
            raise HeadscopeError(f"{path}: key {key!r} is not \"layer-head\"")
        scores = scores if isinstance(scores, list) else [scores]
        if not scores or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
            raise HeadscopeError(f"{path}: the scores of {key!r} are not a list of numbers")
        mean = float(np.mean(scores))
        if not 0.0 <= mean <= 1.0:  # NaN included
            raise HeadscopeError(f"{path}: the scores of {key!r} average {mean:g}; expected a finite value in [0, 1] "
                                 f"(HeadKV's reader does not clip, so neither does headscope)")
        if (int(match[1]), int(match[2])) in entries:
            raise HeadscopeError(f"{path}: head {key!r} appears twice")
        entries[int(match[1]), int(match[2])] = mean
    n_layers, n_heads = max(l for l, _ in entries) + 1, max(h for _, h in entries) + 1
    if len(entries) != n_layers * n_heads:
        raise HeadscopeError(f"{path} has {len(entries)} heads, not all {n_layers} x {n_heads} of a layer grid")
    head_values = np.zeros((n_layers, n_heads))
    for (l, h), value in entries.items():
        head_values[l, h] = value
    n_kv = n_heads if n_kv_heads is None else int(n_kv_heads)
    if n_heads % n_kv:
        raise HeadscopeError(f"{path} holds {n_heads} query heads per layer, which {n_kv} key/value heads cannot share "
                             f"evenly: a policy of another model")
    default_sink, default_recent = default_window(None)
    policy = policy_from_values(kv_head_scores(head_values, n_kv), keep, n_heads,
                                default_sink if sink is None else sink, default_recent if recent is None else recent,
                                model, "headkv")
    policy.head_values = head_values
    return policy


def read_policy(path, keep: Optional[float] = None, n_kv_heads: Optional[int] = None, sink: Optional[int] = None,
                recent: Optional[int] = None) -> KVPolicy:
    """A DuoAttention folder or a HeadKV JSON file, by what `path` is."""
    path = Path(path)
    if path.is_dir():
        return read_duo(path, keep, None, sink, recent)
    if path.is_file():
        if keep is None:
            raise UsageError(f"{path} is a HeadKV file, which holds scores only; pass keep (--keep)")
        return read_headkv(path, keep, n_kv_heads, sink, recent)
    raise HeadscopeError(f"no policy at {path}: give a DuoAttention folder or a HeadKV JSON file")
