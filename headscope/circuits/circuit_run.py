"""A circuit's folder: what `headscope circuit` writes.

- `write_circuit_into(circuit, folder, labels=None, ...)`: into a folder being written (an
  `atomic_dir`'s temporary one): `Circuit.save`'s files (edges.csv, nodes.csv, meta.json,
  task.json, and once evaluated evaluation.csv and random.csv), the page `index.html`
  (`headscope.circuits.circuit_page`), the card `report --index` lists it by, and `manifest.json`.
- `write_circuit(circuit, out, labels=None, force=False)`: the same, atomically: a temporary
  folder renamed to `out` once complete, with `--force`'s rules (`headscope.atomic.atomic_dir`).
- `read_circuit(folder, unverified=False)`: the `Circuit` again (`Circuit.load`, which checks the
  folder against its manifest).

The page is `index.html`, as in every folder headscope writes: `report --index` fills in its link
back in place, which is why the manifest leaves that one name out.
"""
from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_dir
from ..folders import write_card, write_manifest
from .edge_circuit import Circuit
from .circuit_page import TOP_EDGES, render_circuit_html

__all__ = ["PAGE", "write_circuit", "write_circuit_into", "read_circuit", "circuit_headline"]

PAGE = "index.html"


def circuit_headline(circuit) -> list:
    """`(name, value)` text pairs for the folder's card: method, edges, the top edge, CPR and CMD."""
    meta = circuit.meta
    method = str(meta.get("method", "?")) + (f" ({meta['steps']} steps)" if meta.get("method") == "eap-ig" else "")
    headline = [("task", f"{meta.get('task', '?')}, {meta.get('n', '?')} pairs"), ("method", method),
                ("edges", str(len(circuit.edges)))]
    if len(circuit.edges):
        top = circuit.top(1).iloc[0]
        headline.append(("top edge", f"{top.src} -> {top.dst} {float(top.score):+.3g}"))
    if circuit.evaluation is not None:
        attrs = circuit.evaluation.attrs
        headline += [("CPR", f"{attrs['cpr']:.3f}"), ("CMD", f"{attrs['cmd']:.3f}")]
    return headline


def write_circuit_into(circuit, folder, labels=None, plotlyjs: str = "embed", n_edges: int = TOP_EDGES) -> Path:
    """Write a circuit's folder into `folder` (module docstring); returns the page's path.

    Args:
        circuit: a `Circuit`.
        folder: the folder being written (usually an `atomic_dir`'s temporary one).
        labels: head labels of an analysis (`{(layer, head): label}` or a table layer, head, label).
        plotlyjs: "embed" (offline) or "cdn".
        n_edges: edges the page's graph draws.
    Returns:
        The path of the page inside `folder`.
    """
    folder = Path(folder)
    circuit.write_into(folder)
    path = folder / PAGE
    path.write_text(render_circuit_html(circuit, labels=labels, n_edges=n_edges, plotlyjs=plotlyjs), encoding="utf-8")
    model = str(circuit.meta.get("model", ""))
    write_card(folder, "circuit", title=f"{model}: {circuit.meta.get('task', '?')}", model=model,
               headline=circuit_headline(circuit), page=PAGE)
    write_manifest(folder)  # every file's size and hash: a damaged folder is told from an intact one
    return path


def write_circuit(circuit, out, labels=None, force: bool = False, protect=(), plotlyjs: str = "embed",
                  n_edges: int = TOP_EDGES) -> Path:
    """Write a circuit's folder at `out` atomically (module docstring).

    Args:
        circuit: a `Circuit`.
        out: the folder to write; refused when it exists, unless `force` and headscope wrote it.
        labels: head labels of an analysis, shown on the graph's nodes and in the edges table.
        force: replace an existing folder headscope wrote (or an empty one).
        protect: paths being read that `out` must neither be, hold nor lie inside.
        plotlyjs: "embed" (offline) or "cdn".
        n_edges: edges the page's graph draws.
    Returns:
        The path of the page (`out/index.html`).
    """
    out = Path(out)
    with atomic_dir(out, force=force, protect=protect) as tmp:
        write_circuit_into(circuit, tmp, labels=labels, plotlyjs=plotlyjs, n_edges=n_edges)
    return out / PAGE


def read_circuit(folder, unverified: bool = False) -> Circuit:
    """The `Circuit` of a folder `write_circuit` wrote, checked against its manifest first.

    Args:
        folder: the folder.
        unverified: read a folder that no longer matches its manifest, with a warning.
    Returns:
        The `Circuit` (without a model: `evaluate` needs `loaded=`).
    """
    return Circuit.load(folder, unverified=unverified)
