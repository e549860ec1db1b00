"""A `Circuit` without a model: `fake_circuit(n_layers, n_heads, seed, evaluated)` has the graph
`graph_of` finds in a Llama (each layer's heads, then its MLP reading them; every receiver reads
every sender that wrote before it) with random heavy-tailed scores, and optionally an evaluation
table of made-up numbers (for the page and the folder, not for faithfulness)."""
import numpy as np
import pandas as pd

from headscope.circuits.edge_circuit import Circuit


def fake_circuit(n_layers: int = 30, n_heads: int = 9, seed: int = 0, evaluated: bool = False) -> Circuit:
    """A circuit of a Llama-shaped graph (each layer: heads, then an MLP reading them) with random
    scores: every receiver reads every sender that wrote before it, as `graph_of` finds in Llama."""
    rng = np.random.default_rng(seed)
    nodes = [("embed", "embed", None, None)]
    edges = []
    for layer in range(n_layers):
        before = [name for name, *_ in nodes]
        edges += [(src, f"a{layer}.h{h}.{part}") for h in range(n_heads) for part in "qkv" for src in before]
        nodes += [(f"a{layer}.h{h}", "head", layer, h) for h in range(n_heads)]
        edges += [(name, f"m{layer}") for name, *_ in nodes]
        nodes.append((f"m{layer}", "mlp", layer, None))
    edges += [(name, "logits") for name, *_ in nodes]
    nodes.append(("logits", "logits", None, None))
    table = pd.DataFrame(nodes, columns=["name", "kind", "layer", "head"])
    table["layer"], table["head"] = table["layer"].astype("Int64"), table["head"].astype("Int64")
    scores = rng.standard_normal(len(edges)) * rng.exponential(1.0, len(edges))
    frame = pd.DataFrame({"src": [s for s, _ in edges], "dst": [d for _, d in edges], "score": scores})
    meta = {"model": "fake", "task": "ioi", "method": "eap-ig", "steps": 5, "n": 8, "metric": "logit_diff",
            "clean_metric": 3.0, "corrupted_metric": -0.5, "passes": {"forward": 7, "backward": 5},
            "n_edges": len(frame)}
    found = Circuit(frame, table, meta)
    if evaluated:
        sizes = [0.1, 1, 10, 100]
        found.evaluation = pd.DataFrame({"size": sizes, "n_edges": [max(1, round(len(frame) * s / 100)) for s in sizes],
                                         "faithfulness": [0.2, 0.5, 0.9, 1.0], "metric": [0.2, 1.25, 2.65, 3.0],
                                         "random_mean": [0.0, 0.05, 0.2, 1.0], "random_lo": [-0.1, 0.0, 0.1, 1.0],
                                         "random_hi": [0.1, 0.1, 0.3, 1.0]})
        found.evaluation.attrs.update(cpr=0.93, cmd=0.05, random_cpr=0.6, random_cmd=0.4)
    return found
