"""How heads work together: tasks, attribution and circuits.

- `Task`, `task(name_or_path, tokenizer, n=..., seed=...)` (`headscope.circuits.tasks`,
  `headscope.circuits.task_builders`): clean and corrupted prompts with their answers and a
  metric; `tokenizer_fingerprint(tokenizer)`; `resolve_task(name_or_path, metric)`: a task's
  name or file checked without a tokenizer.
- `logit_attribution(loaded, task)` (`dla`): each component's direct effect on the logit difference.
- `attribute(loaded, task, method="atp" | "atp*" | "exact", point="z")` (`attribution`): each head's
  effect when patched, estimated by attribution patching or measured exactly.
- `composition(loaded, kind="q" | "k" | "v", rotary_offsets=None)` (`composition_scores`): how strongly
  each later head reads what each earlier head writes, from the weights (Elhage et al. 2021),
  against a random baseline. It reads head_geometry/'s weight factors, not runs, and stays here
  because it answers this package's question (which heads work together) beside DLA and EAP.
- `run_attribution(...)` (`attribution_run`): what `headscope attribute` writes, with its page.
- `circuit(loaded, task, method="eap" | "eap-ig")` -> `Circuit` (`edge_circuit`): every edge
  between the model's components scored (`eap`), and its faithfulness measured (`Circuit.evaluate`,
  `faithfulness`).
- `Circuit.stability()` (`stability`): bootstrap Jaccard of a circuit's top edges;
  `Circuit.to_eap_json` / `Circuit.from_eap_json` (`interchange`): the EAP-IG code's JSON format.
- `write_circuit(circuit, out, labels=None)`, `read_circuit(folder)` (`circuit_run`): what
  `headscope circuit` writes, with its page (`render_circuit_html`, `graph_layout`: `circuit_page`).

Underneath: `target` (a task run through a model), `edges` and `residual` (the graph, from what the
modules wrote), `stream_copies` (forward passes in which each receiver reads its own copy of the
stream), `edge_patching` (runs with only some edges clean).

The package sits under the command line, beside `kv/`: it runs models through `hf/`, patches
through `causal/` and draws its pages with `report/`'s HTML helpers; it never imports `analysis/`.
Names are re-exported lazily, so importing the package (the command line does) loads no torch.
"""
from importlib import import_module

_EXPORTS = {
    "Task": "headscope.circuits.tasks",
    "METRICS": "headscope.circuits.tasks",
    "tokenizer_fingerprint": "headscope.circuits.tasks",
    "task": "headscope.circuits.task_builders",
    "BUILTINS": "headscope.circuits.task_builders",
    "resolve_task": "headscope.circuits.task_builders",
    "logit_attribution": "headscope.circuits.dla",
    "attribute": "headscope.circuits.attribution",
    "METHODS": "headscope.circuits.attribution",
    "POINTS": "headscope.circuits.attribution",
    "Circuit": "headscope.circuits.edge_circuit",
    "circuit": "headscope.circuits.edge_circuit",
    "MIB_SIZES": "headscope.circuits.faithfulness",
    "MAX_STEPS": "headscope.circuits.edge_circuit",
    "MAX_RANDOM": "headscope.circuits.edge_circuit",
    "check_sizes": "headscope.circuits.faithfulness",
    "CIRCUIT_METHODS": "headscope.circuits.eap",
    "RIEMANN": "headscope.circuits.eap",
    "stability_text": "headscope.circuits.circuit_page",
    "composition": "headscope.circuits.composition_scores",
    "run_attribution": "headscope.circuits.attribution_run",
    "read_attribution": "headscope.circuits.attribution_run",
    "write_circuit": "headscope.circuits.circuit_run",
    "write_circuit_into": "headscope.circuits.circuit_run",
    "read_circuit": "headscope.circuits.circuit_run",
    "faithfulness_text": "headscope.circuits.circuit_page",
    "render_circuit_html": "headscope.circuits.circuit_page",
    "graph_layout": "headscope.circuits.circuit_page",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'headscope.circuits' has no attribute {name!r}")


def __dir__():
    return __all__
