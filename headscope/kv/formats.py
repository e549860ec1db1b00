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
Values are written with 17 significant digits, so they read back bit for bit. Files are written
to a temporary name and renamed into place.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import numpy as np

from ..atomic import atomic_dir, write_text_atomic
from ..errors import HeadscopeError
from .policy import KVPolicy, default_window, kv_head_scores, policy_from_values

__all__ = ["DUO_TSV", "DUO_CONFIG", "write_duo", "read_duo", "write_headkv", "read_headkv", "read_policy"]

DUO_TSV = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
HEAD_KEY = re.compile(r"(\d+)-(\d+)\Z")


def duo_tsv(policy: KVPolicy) -> str:
    """The TSV text: one line per layer, the key/value heads' values tab-separated."""
    return "".join("\t".join(f"{v:.17g}" for v in row) + "\n" for row in policy.values)


def duo_config(policy: KVPolicy) -> dict:
    return {"sink_size": policy.sink, "recent_size": policy.recent, "full_fraction": policy.keep,
            "n_heads": policy.n_heads, "model": policy.model, "rank_by": policy.rank_by}


def write_duo(policy: KVPolicy, folder, force: bool = False) -> Path:
    """Write DuoAttention's `full_attention_heads.tsv` and `config.json` into `folder` (atomically)."""
    with atomic_dir(folder, force=force) as tmp:
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
    try:
        values = np.clip(np.loadtxt(tsv, delimiter="\t", ndmin=2), 0.0, 1.0)
    except ValueError as err:
        raise HeadscopeError(f"{tsv} is not a tab-separated table of numbers: {str(err).splitlines()[0]}") from None
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    keep = config.get("full_fraction") if keep is None else keep
    if keep is None:
        raise HeadscopeError(f"{config_path} does not say what fraction of heads to keep full; pass keep")
    n_heads = int(config.get("n_heads", values.shape[1]) if n_heads is None else n_heads)
    sink = int(config.get("sink_size", default_window(None)[0]) if sink is None else sink)
    recent = int(config.get("recent_size", default_window(None)[1]) if recent is None else recent)
    return policy_from_values(values, keep, n_heads, sink, recent, str(config.get("model", "")),
                              str(config.get("rank_by", "duo")))


def headkv_json(policy: KVPolicy) -> dict:
    """`{"layer-head": [value]}` over query heads, layer-major."""
    L, H = policy.head_values.shape
    return {f"{l}-{h}": [float(policy.head_values[l, h])] for l in range(L) for h in range(H)}


def write_headkv(policy: KVPolicy, path) -> Path:
    """Write the HeadKV JSON to `path` (a temporary file renamed into place)."""
    return write_text_atomic(path, json.dumps(headkv_json(policy), indent=0))


def read_headkv(path, keep: float, n_kv_heads: Optional[int] = None, sink: Optional[int] = None,
                recent: Optional[int] = None, model: str = "") -> KVPolicy:
    """A policy from a HeadKV JSON: each query head's value is the mean of its list, clipped to
    [0, 1]; a key/value head's the largest of its query heads' (`n_kv_heads`, default: MHA)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise HeadscopeError(f"cannot read {path} as JSON: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict) or not data:
        raise HeadscopeError(f"{path} is not a HeadKV object {{\"layer-head\": [scores]}}")
    entries = {}
    for key, scores in data.items():
        match = HEAD_KEY.match(str(key))
        if match is None:
            raise HeadscopeError(f"{path}: key {key!r} is not \"layer-head\"")
        scores = scores if isinstance(scores, list) else [scores]
        if not scores or not all(isinstance(s, (int, float)) for s in scores):
            raise HeadscopeError(f"{path}: the scores of {key!r} are not a list of numbers")
        entries[int(match[1]), int(match[2])] = float(np.mean(scores))
    n_layers, n_heads = max(l for l, _ in entries) + 1, max(h for _, h in entries) + 1
    if len(entries) != n_layers * n_heads:
        raise HeadscopeError(f"{path} has {len(entries)} heads, not all {n_layers} x {n_heads} of a layer grid")
    head_values = np.zeros((n_layers, n_heads))
    for (l, h), value in entries.items():
        head_values[l, h] = value
    head_values = np.clip(head_values, 0.0, 1.0)
    n_kv = n_heads if n_kv_heads is None else int(n_kv_heads)
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
            raise HeadscopeError(f"{path} is a HeadKV file, which holds scores only; pass keep (--keep)")
        return read_headkv(path, keep, n_kv_heads, sink, recent)
    raise HeadscopeError(f"no policy at {path}: give a DuoAttention folder or a HeadKV JSON file")
