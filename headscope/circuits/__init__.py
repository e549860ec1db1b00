"""How heads work together: tasks, attribution and circuits.

- `Task`, `task(name_or_path, tokenizer, n=..., seed=...)` (`headscope.circuits.tasks`,
  `headscope.circuits.task_builders`): clean and corrupted prompts with their answers and a
  metric; `tokenizer_fingerprint(tokenizer)`; `resolve_task(name_or_path, metric)`: a task's
  name or file checked without a tokenizer.
- `logit_attribution(loaded, task)` (`dla`): each component's direct effect on the logit difference.
- `attribute(loaded, task, method="atp" | "atp*" | "exact", point="z", direction="denoising")`
  (`attribution`; the choices in `METHODS`, `POINTS`, `DIRECTIONS`): each head's effect when
  patched, estimated by attribution patching or measured exactly.
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
  `headscope circuit` writes, with its page (`render_circuit_html`: `circuit_page`).

Underneath: `target` (a task run through a model), `edges` and `residual` (the graph, from what the
modules wrote), `stream_copies` (forward passes in which each receiver reads its own copy of the
stream), `receiver_grads` (every receiver's gradient from one ordinary backward pass, what EAP
scores with), `edge_patching` (runs with only some edges clean).

The package sits under the command line, beside `kv/`: it runs models through `hf/`, patches
through `causal/` and draws its pages with `report/`'s HTML helpers; it never imports `analysis/`.
Names are re-exported lazily, so importing the package (the command line does) loads no torch.
"""
from .._lazy import lazy_exports

_HOMES = {
    "Task": "tasks",
    "METRICS": "tasks",
    "tokenizer_fingerprint": "tasks",
    "task": "task_builders",
    "BUILTINS": "task_builders",
    "resolve_task": "task_builders",
    "logit_attribution": "dla",
    "attribute": "attribution",
    "METHODS": "attribution",
    "POINTS": "attribution",
    "DIRECTIONS": "attribution",
    "Circuit": "edge_circuit",
    "circuit": "edge_circuit",
    "MIB_SIZES": "faithfulness",
    "MAX_STEPS": "edge_circuit",
    "MAX_RANDOM": "edge_circuit",
    "check_sizes": "faithfulness",
    "CIRCUIT_METHODS": "eap",
    "RIEMANN": "eap",
    "stability_text": "circuit_page",
    "composition": "composition_scores",
    "run_attribution": "attribution_run",
    "read_attribution": "attribution_run",
    "write_circuit": "circuit_run",
    "write_circuit_into": "circuit_run",
    "read_circuit": "circuit_run",
    "faithfulness_text": "circuit_page",
    "render_circuit_html": "circuit_page",
}

__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
