"""The pattern detectors on a CUDA GPU give the CPU's scores, from the maps and from the lazy path,
with the probe batch left on the CPU (a detector reads it on the pattern's device). Skipped
without a GPU (benchmarks/gpu.sh runs them on one).

Bound: 1e-4 (float32; the GPU's kernels sum in another order, FlexAttention's log-sum-exp too)."""
import copy

import pytest
import torch

import headscope
from headscope.detectors import REGISTRY
from headscope.probes.base import ProbeBatch

from tests.support.tiny import tiny_inputs, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DETECTORS = [d for d in REGISTRY.values() if d.lazy and not d.bidirectional_only and d.probe != "needle"]


@torch.no_grad()
def _scores(model, ids, batch, lazy: bool) -> dict:
    scores = {}

    def reduce(layer, pattern, mask):
        scores[layer] = {d.name: d.score(pattern, batch).float().cpu() for d in DETECTORS}

    with headscope.capture(model, reduce=reduce, lazy=lazy):
        model(input_ids=ids.to(next(model.parameters()).device))
    return scores


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_detectors_on_cuda_give_the_cpus_scores(family, lazy):
    model = tiny_model(family, kind="interface")
    first = tiny_inputs(pad=False)["input_ids"]
    ids = torch.cat([first, first], dim=1)  # repeated: induction and duplicate tokens have targets
    batch = ProbeBatch(ids, torch.ones_like(ids, dtype=torch.bool), True, 1)
    on_cpu = _scores(model, ids, batch, lazy)
    on_cuda = _scores(copy.deepcopy(model).to("cuda"), ids, batch, lazy)
    assert on_cpu.keys() == on_cuda.keys() and len(on_cpu) > 0
    for layer, by_name in on_cpu.items():
        for name, expected in by_name.items():
            assert not expected.isnan().all(), name
            torch.testing.assert_close(on_cuda[layer][name], expected, atol=1e-4, rtol=0, equal_nan=True,
                                       msg=f"{name} layer {layer}")
