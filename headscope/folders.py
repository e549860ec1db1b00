"""What headscope writes into every folder, and checks when it reads one back.

- `MARKER` (.headscope): in every folder `headscope.atomic.atomic_dir` writes: "headscope wrote
  this folder" (what `--force` may replace).
- `MANIFEST` (manifest.json), `write_manifest(folder)`: the size and SHA-256 of every file
  under `folder` (the report page excepted: `headscope report` re-renders it in place).
- `check_manifest(folder, needed, unverified=False)`: HeadscopeError naming the first problem:
  a recorded file missing, cut or changed; a folder carrying the marker but no manifest
  (damaged, not old: headscope writes both into every folder); a manifest that does not list a
  file the reader needs (`needed`). With `unverified=True` each is a `HeadscopeWarning`
  instead. A folder with neither marker nor manifest (an analysis written before both) passes,
  unless `required`: kinds of folder that never existed without one (circuits, attributions).
- `check_folder(folder, needed, unverified=False, required=False)`: no symbolic link inside the folder (a file
  read through one could be anyone's; refused even with `unverified`), then `check_manifest`.
- `write_card(folder, kind, title=..., model=..., headline=..., render=...)`: what the folder
  is, in its marker (JSON): its kind ("analysis", "comparison", ...), model, date, a few headline
  numbers, its page and the command that renders that page from the folder's files. `read_card(folder)` gives it back (None for a folder without one); `headscope
  report --index` lists the folders by their cards, so a new kind of folder is listed by writing one.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

from .errors import HeadscopeError, HeadscopeWarning

__all__ = ["MARKER", "MANIFEST", "UNLISTED", "MARKER_TEXT", "write_manifest", "check_manifest", "check_folder",
           "write_card", "read_card"]

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


def _damaged(folder: Path, problem: str, unverified: bool) -> None:
    """HeadscopeError "`folder` is damaged: `problem`", or with `unverified` the same as a warning."""
    if not unverified:
        raise HeadscopeError(f"{folder} is damaged: {problem}; write it again with headscope, or pass --unverified "
                             f"(unverified=True) to read it anyway")
    warnings.warn(f"{folder} is damaged: {problem}; read anyway (--unverified): only the shape of its tables is "
                  f"checked", HeadscopeWarning, stacklevel=4)


def check_manifest(folder, needed=(), *, unverified: bool = False, required: bool = False) -> None:
    """HeadscopeError naming the first file of `folder` that differs from its manifest (see the
    module docstring); `needed`: files the reader needs, which the manifest must list;
    `required`: a folder without a manifest is damaged even without the marker."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        if (folder / MARKER).is_file():
            _damaged(folder, f"it carries headscope's marker ({MARKER}) but no {MANIFEST}, so its files cannot be "
                             f"checked", unverified)
        elif required:
            _damaged(folder, f"it has no {MANIFEST}, so its files cannot be checked (headscope writes one into "
                             f"every such folder)", unverified)
        return
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        listed = {name: (int(entry["bytes"]), str(entry["sha256"])) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return _damaged(folder, f"its {MANIFEST} is unreadable ({type(err).__name__})", unverified)
    for name in needed:
        if name not in listed and (folder / name).exists():
            return _damaged(folder, f"{MANIFEST} does not list {name}", unverified)
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
            return _damaged(folder, f"{name} {why} ({MANIFEST})", unverified)


def check_folder(folder, needed=(), *, unverified: bool = False, required: bool = False) -> None:
    """A folder headscope wrote, before it is read: no symbolic link inside it (a file read through
    one could be anyone's), then `check_manifest` (`required` as there)."""
    folder = Path(folder)
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise HeadscopeError(f"{path} is a symbolic link (to {os.readlink(path)}); a folder headscope wrote holds "
                                 f"its own files, so replace the link with the file itself")
    check_manifest(folder, needed, unverified=unverified, required=required)


MARKER_TEXT = "written by headscope; `--force` may replace this folder\n"


def write_card(folder, kind: str, *, title: str, model: str = "", headline=(), page: str = "index.html",
               created: str = "", render: str = "") -> None:
    """Describe `folder` in its marker file, for `headscope report --index`.

    Args:
        folder: the folder being written (usually an `atomic_dir`'s temporary one).
        kind: what it holds, in words: "analysis", "comparison", "timeline", "kv evaluation", ...
        title: one line naming it (the model, "a vs b", the run).
        model: the model's name, or "" where several or none.
        headline: `(name, value)` pairs shown beside the link (a few numbers, as text).
        page: the folder's page, relative to it.
        created: when its content was made (ISO 8601); now by default.
        render: the command that makes `page` from the folder's files, the folder's path to
            follow it (`headscope report` for an analysis), where one exists; a folder saved
            without its page is listed with it.
    """
    import datetime

    card = {"note": MARKER_TEXT.strip(), "kind": str(kind), "title": str(title), "model": str(model or ""),
            "created": created or datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "page": str(page), "headline": [[str(name), str(value)] for name, value in headline],
            "render": str(render)}
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
    card["render"] = card["render"] if isinstance(card.get("render"), str) else ""
    return card
