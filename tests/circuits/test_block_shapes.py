"""EAP's edges in layers shaped unlike Llama's, against the derivative of the metric when that edge
alone moves (`one_edge_nudged`): parallel attention and MLP reading one norm (Phi, GPT-J) or two
(GPT-NeoX), an MLP feeding a dropout module (StableLM), a shared MLP beside an MoE reading what
the MoE reads (GraniteMoeShared), an MLP written inline in the layer (BioGPT's fc1 -> fc2), and
an encoder-decoder's decoder with its cross-attention (T5, attributed at "decoder.self"); OPT's MLP
reads and writes its rows flat, [batch * pos, d_model], as Llama 4's MoE writes them."""
import pytest
import torch

from headscope.circuits.edge_circuit import circuit

from tests.support.circuit_models import one_edge_nudged, random_task, scaled_family

FAMILIES = ["phi", "gptj", "gpt_neox", "stablelm", "granitemoeshared", "biogpt", "opt", "llama4_text", "t5"]
# Central differences of a smaller step where the metric bends within 1e-2: top-2 routing switches
# experts (GraniteMoeShared), and T5's unscaled attention logits are sharp at these weights.
STEP = {"granitemoeshared": 1e-3, "t5": 1e-3}


def _picks(edges):
    """The strongest edge into each kind of receiver: a module (m, c), a head's q/k/v, the logits."""
    kinds = {"module": edges.dst.str.match(r"^[mc]\d"), "head": edges.dst.str.match(r"^a\d+\.h\d+\.[qkv]$"),
             "logits": edges.dst == "logits"}
    picks = []
    for name, mask in kinds.items():
        chosen = edges[mask]
        assert len(chosen), name
        row = chosen.loc[chosen.score.abs().idxmax()]
        picks.append((row.src, row.dst))
    return picks


@pytest.mark.parametrize("family", FAMILIES)
def test_edge_scores_are_the_metrics_derivative(family):
    model = scaled_family(family)
    task = random_task(seed=1)
    found = circuit(model, task, method="eap")
    if family == "t5":
        assert found.meta["sites"] == "decoder.self" or found.meta.get("sites") is None
        assert found.edges.dst.str.match(r"^c\d").any()  # the decoder's cross-attention receives
    scale = float(found.edges.score.abs().max())
    for src, dst in _picks(found.edges):
        score = float(found.edges[(found.edges.src == src) & (found.edges.dst == dst)].score.iloc[0])
        eps = STEP.get(family, 1e-2)
        derivative = (one_edge_nudged(model, task, src, dst, eps) - one_edge_nudged(model, task, src, dst, -eps)) / (2 * eps)
        assert score * task.n == pytest.approx(derivative, abs=2e-3 * scale * task.n), (src, dst)
