"""The load cache: a GGUF file converted once, restored in about a second afterwards.

An entry is a transformers model folder (config.json, model.safetensors, tokenizer files)
plus `headscope-entry.json`, which records the source file and the size and CRC-32 of every
file; both are checked on every read (the checksum costs about 0.1 s for SmolLM2's 0.5 GiB).

- `cache_root()`: `$HEADSCOPE_CACHE`, else `$XDG_CACHE_HOME/headscope`, else `~/.cache/headscope`.
- `source_key(path, dtype)`: what an entry is keyed on (see its docstring).
- `lookup(key)`: the entry folder when present and whole (sizes and checksums as recorded); a
  damaged one is reported in one line on stderr, removed, and `None` is returned so the caller
  rebuilds it.
- `store(key, write)`: `write(folder)` fills a temporary folder that is renamed into place,
  so readers never see half an entry and two processes storing at once both succeed.
- `cache_usage()`, `clear_cache()`: location, entry count and size; remove everything.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .. import __version__
from ..atomic import temporary

__all__ = ["cache_root", "source_key", "SourceKey", "lookup", "store", "cache_usage", "clear_cache",
           "CacheUsage", "MANIFEST"]

MANIFEST = "headscope-entry.json"
# Bumped when what an entry holds or how it is keyed changes (2: CRC-32 of every file; 3: no
# dtype keyed as float32). Entries of another format are stale: the next store removes them.
FORMAT = 3
_SAMPLE = 2**20  # bytes hashed from each end of the source file


def cache_root() -> Path:
    """The cache folder (not created here)."""
    if os.environ.get("HEADSCOPE_CACHE"):
        return Path(os.environ["HEADSCOPE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "headscope"


def _models_dir() -> Path:
    return cache_root() / "models"


@dataclass(frozen=True)
class SourceKey:
    """What an entry is keyed on; `digest` names the entry folder."""

    source: str  # resolved path of the source file
    size: int
    mtime_ns: int
    sample_sha256: str  # of the first and last MiB
    dtype: str
    versions: tuple[tuple[str, str], ...]  # headscope, transformers, gguf, torch, cache format

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.__dict__, sort_keys=True).encode()).hexdigest()[:24]

    @property
    def folder(self) -> Path:
        return _models_dir() / f"{Path(self.source).stem}-{self.digest}"


def source_key(path, dtype) -> SourceKey:
    """The key of `path` loaded as `dtype`. None keys as float32, what a GGUF file dequantises to
    when no dtype is asked for: one entry serves both.

    A changed file gets a new key through its size, its mtime (ns) or its first/last MiB; a
    file edited in the middle with size and mtime restored by hand is not noticed. A new
    headscope, transformers, gguf or torch also gets new entries.
    """
    from importlib.metadata import version

    path = Path(path).resolve()
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        digest.update(fh.read(_SAMPLE))
        if stat.st_size > _SAMPLE:
            fh.seek(max(_SAMPLE, stat.st_size - _SAMPLE))
            digest.update(fh.read(_SAMPLE))
    versions = (("headscope", __version__), ("transformers", version("transformers")),
                ("gguf", version("gguf")), ("torch", version("torch")), ("format", str(FORMAT)))
    dtype = "torch.float32" if dtype is None else str(dtype)
    return SourceKey(str(path), stat.st_size, stat.st_mtime_ns, digest.hexdigest(), dtype, versions)


def _crc32(path: Path) -> int:
    """CRC-32 of a file's bytes, read in 16 MiB pieces."""
    value = 0
    with open(path, "rb") as fh:
        while piece := fh.read(16 * 2**20):
            value = zlib.crc32(piece, value)
    return value


def _damage(folder: Path) -> Optional[str]:
    """Why the entry at `folder` cannot be used, or None when it is whole."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files, checksums = manifest["files"], manifest["crc32"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable {MANIFEST} ({type(err).__name__})"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} of {size} bytes"
        if _crc32(path) != checksums.get(name):
            return f"{name} does not match its checksum"
    return None


def report_damage(folder: Path, why: str) -> None:
    """Say in one line on stderr that an entry is damaged, and remove it."""
    print(f"headscope: cache entry {folder} is damaged ({why}); rebuilding it", file=sys.stderr)
    _discard(folder)


def lookup(key: SourceKey) -> Optional[Path]:
    """The entry folder for `key` if it is there and whole, else None (a damaged one is removed)."""
    folder = key.folder
    if not folder.exists():
        return None
    why = _damage(folder)
    if why is None:
        return folder
    report_damage(folder, why)
    return None


def store(key: SourceKey, write: Callable[[Path], None]) -> Path:
    """Create the entry for `key`: `write(folder)` fills a temporary folder, renamed into place.

    When another process stored the same entry first, its entry is kept and ours dropped. Stale
    entries of the same source file (older contents, or other versions of headscope, transformers,
    gguf or torch) are removed afterwards; the current file's entries in other dtypes stay.
    """
    final = key.folder
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        with temporary(tmp):  # removed by the command line's interrupt handler, which raises nothing
            write(tmp)
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = {"key": key.__dict__, "files": files, "crc32": {name: _crc32(tmp / name) for name in files}}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            os.rename(tmp, final)  # atomic; refuses when the entry exists already
        except OSError:
            if _damage(final) is not None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune_older(key)
    return final


def _prune_older(key: SourceKey) -> None:
    current = {name: value for name, value in key.__dict__.items() if name != "dtype"}
    current["versions"] = [list(pair) for pair in key.versions]  # as JSON gives it back
    for folder in _models_dir().iterdir():
        if folder.name.startswith(".") or folder == key.folder:
            continue
        try:
            other = json.loads((folder / MANIFEST).read_text())["key"]
            same_file = all(other[name] == value for name, value in current.items())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if other["source"] == key.source and not same_file:
            _discard(folder)


def _discard(folder: Path) -> None:
    """Remove an entry: renamed aside first (atomic), so no reader meets half of it."""
    aside = folder.with_name(f".trash-{folder.name}-{os.getpid()}")
    try:
        os.rename(folder, aside)
    except OSError:
        return  # gone already: another process removed it
    shutil.rmtree(aside, ignore_errors=True)


@dataclass(frozen=True)
class CacheUsage:
    root: Path
    entries: int
    bytes: int


def cache_usage() -> CacheUsage:
    """Where the cache is, how many entries it holds and their size on disk."""
    root = cache_root()
    models = _models_dir()
    entries = [p for p in models.iterdir() if not p.name.startswith(".")] if models.is_dir() else []
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
    return CacheUsage(root, len(entries), size)


def clear_cache() -> CacheUsage:
    """Remove every entry (and leftovers of interrupted writes); returns what was there."""
    before = cache_usage()
    models = _models_dir()
    if models.is_dir():
        for folder in models.iterdir():
            _discard(folder)
    return before
