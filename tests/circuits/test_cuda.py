"""Circuits on a CUDA GPU: edge scores (EAP, EAP-IG) and the patched runs behind `evaluate` equal
the CPU's on the same float32 model, on block shapes that read differently (GQA with biases,
Gemma 2's post-norms, a GQA Llama); in bfloat16 the full circuit is the model and the empty one
the corrupted run. Skipped without a GPU (benchmarks/gpu.sh runs them on one).

Bounds: float32 scores within 1e-4 of the largest |score| and metrics within 1e-5 (the GPU's
matrix products sum in another order; TF32 is off by default for float32 products)."""
import copy

import numpy as np
import pytest
import torch

from headscope.circuits.edge_circuit import circuit

from tests.support.circuit_models import random_task, scaled_family

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _found_and_metrics(model, task, method: str):
    found = circuit(model, task, method=method, steps=3, batch_size=3)
    table = found.evaluate(sizes=[1, 10, 50], n_random=1, batch_size=2)
    return found, table


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "llama"])
@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_scores_and_patched_runs_on_cuda_equal_the_cpus(family, method):
    model = scaled_family(family)
    task = random_task(seed=5)
    cpu, cpu_table = _found_and_metrics(model, task, method)
    gpu, gpu_table = _found_and_metrics(copy.deepcopy(model).to("cuda"), task, method)
    assert list(zip(gpu.edges.src, gpu.edges.dst)) == list(zip(cpu.edges.src, cpu.edges.dst))
    scale = float(np.abs(cpu.edges.score.values).max())
    assert scale > 0
    np.testing.assert_allclose(gpu.edges.score.values, cpu.edges.score.values, rtol=0, atol=1e-4 * scale)
    for column in ("metric", "metric_abs"):
        np.testing.assert_allclose(gpu_table[column].values, cpu_table[column].values, rtol=0, atol=1e-5)
    assert gpu_table.attrs["clean_metric"] == pytest.approx(cpu_table.attrs["clean_metric"], abs=1e-5)


@torch.no_grad()
def _metric(model, task, which: str) -> float:
    return float(task.score(model(**task.inputs(which, device="cuda")).logits).float().mean())


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
def test_bf16_circuits_on_cuda_end_at_the_model_and_the_corrupted_run(family):
    model = copy.deepcopy(scaled_family(family)).to("cuda", torch.bfloat16)
    task = random_task(seed=5)
    found = circuit(model, task, method="eap-ig", steps=3, batch_size=3)
    assert np.isfinite(found.edges.score.values).all() and np.abs(found.edges.score.values).max() > 0
    table = found.evaluate(sizes=[10], n_random=1, batch_size=2)
    # The patched runs' full circuit is the clean run read at the answer positions and the empty
    # one the corrupted run, in the model's own dtype: the bf16 forward's metrics within its rounding.
    assert table.attrs["clean_metric"] == pytest.approx(_metric(model, task, "clean"), abs=2e-2)
    assert table.attrs["corrupted_metric"] == pytest.approx(_metric(model, task, "corrupted"), abs=2e-2)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_circuits_side_by_side_on_cuda_equal_the_cpus_one_a_pass(family):
    """Several circuits a pass (`batch_size` holding 4 copies of the prompts) on the GPU give the
    CPU's one-circuit-a-pass metrics."""
    model = scaled_family(family)
    task = random_task(seed=5)
    found = circuit(model, task, method="eap", batch_size=3)
    cpu = found.evaluate(sizes=[1, 10, 50], n_random=2, batch_size=task.n)
    gpu = found.evaluate(sizes=[1, 10, 50], n_random=2, batch_size=4 * task.n,
                         loaded=copy.deepcopy(model).to("cuda"))
    for column in ("metric", "metric_abs", "random_mean"):
        np.testing.assert_allclose(gpu[column].values, cpu[column].values, rtol=0, atol=1e-5)
