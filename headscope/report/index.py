"""One page listing every report under a folder: `headscope report --index DIR`.

- `index_entries(root)` -> `[IndexEntry]`: every folder under `root` that headscope wrote with a
  card (`headscope.atomic.write_card`: analyses, comparisons, timelines, KV evaluations, and any
  kind that writes one), newest first. The index knows no kinds: a folder is listed by what its
  card says. A folder saved without its page (`Analysis.save`) is listed with its tables and the
  command its card names to render the page. Analysis folders whose marker holds no card are read
  from their meta.json.
- `render_index(root, entries)` -> the page (no script, no request outside the folder; every
  text escaped).
- `write_index(root)`: `root/index.html`, written to a temporary name and renamed; each listed
  page's link back (`BACK_SLOT`, an empty slot `html.page` puts at the top of every page) is
  filled in with the relative path to the index.
- `update_index_of(folder)`: after a command wrote `folder`, re-write the index of the folder
  above it when that one is `reports/` or already holds an index.
"""
from __future__ import annotations

import csv
import html
import json
import os
import shlex
import tempfile
from collections import Counter
from pathlib import Path
from typing import NamedTuple, Optional
from urllib.parse import quote

from ..atomic import read_card
from ..errors import HeadscopeError

__all__ = ["IndexEntry", "index_entries", "render_index", "write_index", "update_index_of", "is_index",
           "BACK_SLOT", "BACK_SLOT_END", "GENERATOR", "INDEXED_FOLDER"]

GENERATOR = "headscope report --index"  # the index page's <meta name="generator">: ours to replace
BACK_SLOT, BACK_SLOT_END = "<!--headscope:index-->", "<!--/headscope:index-->"
INDEXED_FOLDER = "reports"  # commands writing a folder in one of this name index it on their own
MAX_DEPTH = 4  # folders below the root searched for reports
HEAD_BYTES = 1 << 16  # a page's back-link slot lies in its first bytes (after the CSS)

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 0 24px 40px; color: #222;
       font-size: 14px; }
h1 { font-size: 22px; margin: 18px 0 8px; } p.hint { color: #666; font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0; } th, td { padding: 4px 10px; text-align: left; vertical-align: top; }
th { border-bottom: 2px solid #ccc; } td { border-bottom: 1px solid #eee; }
td.kind { white-space: nowrap; color: #555; } td.date { white-space: nowrap; } dl { margin: 0; display: grid;
  grid-template-columns: max-content 1fr; gap: 0 10px; } dt { color: #555; } dd { margin: 0; }
span.saved { color: #666; }
"""


class IndexEntry(NamedTuple):
    folder: str  # relative to the root, with "/"
    kind: str
    title: str
    model: str
    created: str  # ISO 8601, as written
    headline: tuple  # (name, value) text pairs
    page: str  # the page, relative to the root; "" for a folder saved without it
    tables: tuple = ()  # without a page: the folder's tables (*.csv), relative to the root
    render: str = ""  # without a page: the command that renders it (the card's, with the folder's path)


def _legacy_analysis(folder: Path) -> Optional[dict]:
    """A card for an analysis folder written before cards: its model, date, head grid and labels."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        with open(folder / "labels.csv", newline="", encoding="utf-8") as fh:
            labels = Counter(row.get("label", "").split(":")[0] for row in csv.DictReader(fh))
    except (OSError, ValueError, csv.Error):
        return None
    if not isinstance(meta, dict):
        return None
    labels.pop("none", None)
    headline = [("heads", f"{meta.get('n_layers', '?')} × {meta.get('n_heads', '?')}")]
    headline += [(name, str(n)) for name, n in sorted(labels.items(), key=lambda item: (-item[1], item[0]))[:4]]
    return {"kind": "analysis", "title": str(meta.get("model", folder.name)), "model": str(meta.get("model", "")),
            "created": str(meta.get("created", "")), "page": "index.html", "headline": headline}


def _card(folder: Path) -> Optional[dict]:
    card = read_card(folder)
    if card is None and (folder / "meta.json").is_file() and (folder / "scores.csv").is_file():
        card = _legacy_analysis(folder)
    return card


def index_entries(root) -> list:
    """Every report folder under `root` (not `root` itself), newest first (see the module docstring).

    Args:
        root: the folder to search, down to `MAX_DEPTH` levels; hidden folders (a run's temporary
            `.name.tmp-*`) and links are skipped, and a report folder is not searched further.
    Returns:
        `IndexEntry` per folder with a card: its page where that exists inside the folder, else its
        tables and the command that renders the page (a card naming a page outside its folder is
        not listed).
    """
    root = Path(root)
    found, level = [], [root]
    for _ in range(MAX_DEPTH):
        below = []
        for folder in level:
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()
                                  and not p.name.startswith("."))
            except OSError:
                continue
            for child in children:
                card = _card(child)
                if card is None:
                    below.append(child)
                    continue
                page = child / card["page"]
                if child.resolve() not in page.resolve().parents:  # a page must lie inside its folder
                    continue
                rel = child.relative_to(root).as_posix()
                entry = IndexEntry(rel, card["kind"], card["title"], card.get("model", ""), card.get("created", ""),
                                   tuple(card["headline"]), f"{rel}/{card['page']}")
                if not page.is_file():  # saved without its page
                    tables = tuple(f"{rel}/{p.name}" for p in sorted(child.glob("*.csv")) if p.is_file())
                    render = card.get("render", "")
                    entry = entry._replace(page="", tables=tables,
                                           render=f"{render} {shlex.quote(str(child))}" if render else "")
                found.append(entry)
        level = below
    return sorted(found, key=lambda e: (e.created, e.folder), reverse=True)


def _date(created: str) -> str:
    """"2026-12-02 14:05" from an ISO time; the text itself when it is not one."""
    return created[:16].replace("T", " ") if len(created) >= 16 and created[10:11] == "T" else created


def _href(path: str) -> str:
    return html.escape(quote(path, safe="/"), quote=True)


def _without_page(entry: IndexEntry) -> str:
    """What a row of a folder saved without its page shows: its tables, and how to render the page."""
    tables = ", ".join(f"<a href=\"{_href(t)}\">{html.escape(t.rsplit('/', 1)[-1])}</a>" for t in entry.tables)
    how = f"; <code>{html.escape(entry.render)}</code> renders it" if entry.render else ""
    return f"<br><span class=\"saved\">no page yet{how}</span>" + (f"<br>tables: {tables}" if tables else "")


def render_index(root, entries: list) -> str:
    """The index page of `entries` (from `index_entries(root)`), as a string.

    Args:
        root: the folder the page is written into (its name titles the page).
        entries: `IndexEntry`s, in the order shown.
    Returns:
        The page's HTML: no script, nothing loaded from outside `root`.
    """
    name = html.escape(Path(root).resolve().name or str(root))
    rows = []
    for e in entries:
        facts = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in e.headline)
        link = f"<a href=\"{_href(e.page)}\">{html.escape(e.title)}</a><br><code>{html.escape(e.folder)}</code>" \
            if e.page else f"{html.escape(e.title)}<br><code>{html.escape(e.folder)}</code>{_without_page(e)}"
        rows.append(f"<tr><td class=\"kind\">{html.escape(e.kind)}</td><td>{link}</td>"
                    f"<td>{html.escape(e.model)}</td><td class=\"date\">{html.escape(_date(e.created))}</td>"
                    f"<td><dl>{facts}</dl></td></tr>")
    kinds = Counter(e.kind for e in entries)
    summary = ", ".join(f"{n} {html.escape(kind)}" for kind, n in sorted(kinds.items())) or "no reports"
    listing = ("<table><thead><tr><th>kind</th><th>report</th><th>model</th><th>date</th><th>headline</th></tr></thead>"
               "<tbody>\n" + "\n".join(rows) + "\n</tbody></table>") if rows else \
        "<p>No report folders here yet: <code>headscope analyze</code> writes one into <code>reports/</code>.</p>"
    return "\n".join([
        "<!DOCTYPE html>", "<html lang=\"en\">", "<head>", "<meta charset=\"utf-8\">",
        f"<meta name=\"generator\" content=\"{GENERATOR}\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>headscope reports: {name}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
        f"<h1>headscope reports in {name}</h1>",
        f"<p class=\"hint\">{summary}, newest first. Each page links back here; "
        f"<code>headscope report --index</code> re-writes this list.</p>",
        listing, "</body>", "</html>", "",
    ])


def is_index(path) -> bool:
    """Whether `path` is an index page this module wrote (its generator tag)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(2048)
    except OSError:
        return False
    return f"<meta name=\"generator\" content=\"{GENERATOR}\">" in head


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it (readers never see half)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _link_back(page: Path, index: Path) -> None:
    """Fill the page's back-link slot with the path to `index` (no change when it already holds it)."""
    href = Path(os.path.relpath(index, page.parent)).as_posix()
    link = f"<nav class=\"hs-index\"><a href=\"{_href(href)}\">← all reports</a></nav>"
    try:
        with open(page, encoding="utf-8", errors="replace") as fh:
            head = fh.read(HEAD_BYTES)
        start = head.find(BACK_SLOT)
        if start < 0 or head.find(BACK_SLOT_END, start) < 0:  # a page written before the slot
            return
        if head[start + len(BACK_SLOT):head.find(BACK_SLOT_END, start)] == link:
            return
        text = page.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    start = text.find(BACK_SLOT)
    end = text.find(BACK_SLOT_END, start)
    _replace_text(page, text[:start + len(BACK_SLOT)] + link + text[end:])


def write_index(root) -> Path:
    """Write `root/index.html` listing every report under `root`, and link each page back to it.

    Args:
        root: an existing folder of report folders (`reports/`, say).
    Returns:
        The path of the index page.
    Raises:
        HeadscopeError: `root` is not a folder, is itself a report folder, or holds an
            `index.html` that this command did not write (it is left as it is).
    """
    root = Path(root)
    if not root.is_dir():
        raise HeadscopeError(f"{root} is not a folder; --index takes a folder of reports (reports/, say)")
    if _card(root) is not None:
        raise HeadscopeError(f"{root} is itself a report folder; --index takes the folder above it")
    path = root / "index.html"
    if path.exists() and not is_index(path):
        raise HeadscopeError(f"{path} exists and was not written by `headscope report --index`; it was left as it is")
    if not os.access(root, os.W_OK | os.X_OK):
        raise HeadscopeError(f"cannot write to {root} (permission denied)")
    entries = index_entries(root)
    _replace_text(path, render_index(root, entries))
    for entry in entries:
        if entry.page:
            _link_back(root / entry.page, path)
    return path


def update_index_of(folder) -> Optional[Path]:
    """Re-write the index above `folder` when that folder is named `reports` or already has an
    index page; None (nothing written) otherwise."""
    parent = Path(folder).resolve().parent
    if parent.name != INDEXED_FOLDER and not is_index(parent / "index.html"):
        return None
    return write_index(parent)
