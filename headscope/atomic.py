"""Folders written atomically: `atomic_dir(target, force=False, protect=())` gives a temporary
folder that becomes `target` only when the `with` block succeeds (analyses, reports, comparisons).

Every folder it writes carries a marker file, `MARKER`. `--force` (force=True) replaces only a
folder headscope wrote (the marker, or an analysis folder from before the marker: meta.json and
scores.csv) or an empty one; never any other folder, never the working directory or a folder
above it, and never a folder that is or holds one of the inputs being read (`protect`: the model
folder, the analyses being compared). The target is checked again at rename time, so a folder
that appeared meanwhile (another run, the user) is not replaced without `force`.

- `write_manifest(folder)`: `MANIFEST` (manifest.json) records the size and SHA-256 of every file
  under `folder` (the report page excepted: `headscope report` re-renders it in place).
- `check_manifest(folder)`: HeadscopeError when a recorded file is missing, cut or changed; a
  folder without a manifest (written before manifests existed) passes.
- `write_card(folder, kind, title=..., model=..., headline=...)`: what the folder is, in its
  marker (JSON): its kind ("analysis", "comparison", ...), model, date, a few headline numbers and
  its page. `read_card(folder)` gives it back (None for a folder without one); `headscope report
  --index` lists the folders by their cards, so a new kind of folder is listed by writing one.
- `exit_on_interrupt()`: the command line's Ctrl-C (and SIGTERM) handler: it removes the
  temporary folders being written (`temporary(path)` registers one), says in one line what was
  and was not written, and exits with status 130 at once. No exception travels through torch's
  or transformers' imports (an interrupt raised inside them printed tracebacks, and once
  crashed the interpreter); a rename in progress (`critical()`) finishes first.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import HeadscopeError

__all__ = ["atomic_dir", "MARKER", "MANIFEST", "write_manifest", "check_manifest", "exit_on_interrupt", "temporary",
           "critical", "write_card", "read_card"]

MARKER = ".headscope"  # in every folder atomic_dir writes: "headscope wrote this folder"
MANIFEST = "manifest.json"
UNLISTED = (MARKER, MANIFEST, "index.html")  # index.html: `headscope report` re-renders it in place


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while piece := fh.read(2**20):
            digest.update(piece)
    return digest.hexdigest()


def write_manifest(folder) -> None:
    """Record the size and SHA-256 of every file under `folder` in `folder/manifest.json`."""
    folder = Path(folder)
    files = {path.relative_to(folder).as_posix(): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
             for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in UNLISTED}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1), encoding="utf-8")


def check_manifest(folder) -> None:
    """HeadscopeError naming the first file of `folder` that differs from its manifest."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        listed = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise HeadscopeError(f"{folder / MANIFEST} is unreadable ({type(err).__name__}); the folder may be damaged") from None
    for name, (size, digest) in listed.items():
        path = folder / name
        why = None
        if not path.is_file():
            why = "is missing"
        elif path.stat().st_size != size:
            why = f"has {path.stat().st_size} of the {size} bytes it was written with"
        elif _sha256(path) != digest:
            why = "was changed after it was written"
        if why:
            raise HeadscopeError(f"{folder} is damaged: {name} {why} ({MANIFEST}); write it again with headscope")


MARKER_TEXT = "written by headscope; `--force` may replace this folder\n"


def write_card(folder, kind: str, *, title: str, model: str = "", headline=(), page: str = "index.html",
               created: str = "") -> None:
    """Describe `folder` in its marker file, for `headscope report --index`.

    Args:
        folder: the folder being written (usually an `atomic_dir`'s temporary one).
        kind: what it holds, in words: "analysis", "comparison", "timeline", "kv evaluation", ...
        title: one line naming it (the model, "a vs b", the run).
        model: the model's name, or "" where several or none.
        headline: `(name, value)` pairs shown beside the link (a few numbers, as text).
        page: the folder's page, relative to it.
        created: when its content was made (ISO 8601); now by default.
    """
    import datetime

    card = {"note": MARKER_TEXT.strip(), "kind": str(kind), "title": str(title), "model": str(model or ""),
            "created": created or datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "page": str(page), "headline": [[str(name), str(value)] for name, value in headline]}
    (Path(folder) / MARKER).write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")


def read_card(folder):
    """The card `write_card` left in `folder`'s marker, or None (no marker, a plain one, damage)."""
    try:
        card = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(card, dict) or not all(isinstance(card.get(key), str) for key in ("kind", "title", "page")):
        return None
    headline = card.get("headline")
    card["headline"] = [tuple(map(str, pair)) for pair in headline if isinstance(pair, list) and len(pair) == 2] \
        if isinstance(headline, list) else []
    return card


_TEMPORARY: set = set()  # folders being written: removed when the process is interrupted
_WRITTEN: list = []  # folders this process finished writing
_STATE = {"critical": 0, "pending": None}


@contextmanager
def temporary(path):
    """Register `path` (a temporary folder) for removal should the process be interrupted."""
    _TEMPORARY.add(Path(path))
    try:
        yield path
    finally:
        _TEMPORARY.discard(Path(path))


@contextmanager
def critical():
    """A rename sequence an interrupt must not cut in half: the interrupt waits for its end."""
    _STATE["critical"] += 1
    try:
        yield
    finally:
        _STATE["critical"] -= 1
        if not _STATE["critical"] and _STATE["pending"] is not None:
            _interrupted(_STATE["pending"])


def _interrupted(signum) -> None:
    for path in list(_TEMPORARY):
        shutil.rmtree(path, ignore_errors=True)
    what = ("nothing was written" if not _WRITTEN else
            "written completely: " + ", ".join(str(p) for p in _WRITTEN))
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    name = "terminated" if signum == signal.SIGTERM else "interrupted"
    os.write(2, f"headscope: {_torchrun_rank()}{name}; {what}\n".encode())
    os._exit(143 if signum == signal.SIGTERM else 130)


def _torchrun_rank() -> str:
    """"rank N: " in a process torchrun started (its RANK and WORLD_SIZE), else nothing: when
    torchrun stops every process of a group, each line says whose it is."""
    try:
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return ""
    return f"rank {rank}: " if size > 1 else ""


def _on_signal(signum, frame) -> None:
    if _STATE["critical"]:
        _STATE["pending"] = signum
        return
    _interrupted(signum)


def exit_on_interrupt() -> None:
    """Install the command line's SIGINT and SIGTERM handler (see the module docstring)."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def _written_by_headscope(folder: Path) -> bool:
    return (folder / MARKER).is_file() or ((folder / "meta.json").is_file() and (folder / "scores.csv").is_file())


def _replaceable(folder: Path) -> bool:
    return _written_by_headscope(folder) or not any(folder.iterdir())


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


class atomic_dir:
    """Context manager giving a temporary folder that is renamed to `target` on success.

    On an exception (Ctrl-C included) the temporary folder is deleted and `target` is left as
    it was. With `force`, an existing target that headscope wrote is replaced only after the new
    one is complete.

    Args:
        target: the folder to write.
        force: replace an existing folder headscope wrote (or an empty one).
        protect: paths being read (a model folder, analyses being compared) that the target must
            neither be nor contain.
    Raises:
        HeadscopeError: before any work, for a target that exists (without `force`), is not a
            folder, was not written by headscope, is the working directory or above it, or is or
            holds a protected path, or lies where this process may not write; at rename time, for a
            target that appeared meanwhile.
    """

    def __init__(self, target, *, force: bool = False, protect=()):
        self.target = Path(target)
        resolved = self.target.resolve()
        if self.target.name in ("", ".", "..") or _within(Path.cwd().resolve(), resolved):
            raise HeadscopeError(f"{self.target} is the working directory or a folder above it; name a new folder to write")
        for path in protect:
            if path is not None and _within(Path(path).resolve(), resolved):
                raise HeadscopeError(f"{self.target} is or holds {path}, which is being read; choose another output folder")
        if self.target.exists() and not self.target.is_dir():
            raise HeadscopeError(f"{self.target} exists and is not a folder")
        if self.target.exists() and not force:
            raise HeadscopeError(f"{self.target} already exists; pass --force (force=True) to replace it")
        if self.target.exists() and not _replaceable(self.target):
            raise HeadscopeError(f"{self.target} holds files headscope did not write; --force replaces only folders "
                                 f"headscope wrote, so choose another output folder")
        parent = next(folder for folder in resolved.parents if folder.exists())  # the nearest that exists
        if not os.access(parent, os.W_OK | os.X_OK):
            raise HeadscopeError(f"cannot write to {parent} (permission denied); choose another output folder")
        self.force = force
        self.existed = self.target.exists()

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        _TEMPORARY.add(self.tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        try:
            with critical():
                return self._finish(exc_type)
        finally:
            _TEMPORARY.discard(self.tmp)

    def _finish(self, exc_type) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        if not (self.tmp / MARKER).is_file():  # a writer's card (write_card) is a marker already
            (self.tmp / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
        os.chmod(self.tmp, 0o755)
        if self.target.exists():
            if not (self.force and _replaceable(self.target)):
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise HeadscopeError(f"{self.target} appeared while this ran (another run?); it was left as it is "
                                     f"and nothing was written")
            old = self.target.with_name(f".{self.target.name}.old-{os.getpid()}")
            os.replace(self.target, old)
            os.replace(self.tmp, self.target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.tmp, self.target)
        _WRITTEN.append(self.target)
        return False
