"""Patched.metric (the runs behind Circuit.evaluate) against the sum it stands for, written out edge by
edge: on random masks, over several batches, with its cache of corrupted senders and without."""
import numpy as np
import pytest
import torch

from headscope import HeadscopeError
from headscope.circuits.edges import graph_of
from headscope.circuits.edge_patching import Patched
from headscope.circuits.target import Target
from headscope.circuits.stream_copies import split_run

from tests.support.circuit_models import BLOCK_FAMILIES, random_task as _task, scaled as _scaled, scaled_family
from tests.support.tiny import tiny_model


@torch.no_grad()
def _edge_by_edge(model, task, kept: np.ndarray) -> float:
    """Mean metric when receiver name r reads s_r - sum over its dropped edges u of (a_u - a_u^corrupted),
    one edge at a time, the whole task in one batch."""
    target = Target(model, task)
    graph = graph_of(target, task)
    with split_run(target, graph) as run:
        model(**task.inputs("corrupted"), use_cache=False)
    corrupted = {i: v.clone() for i, v in run.senders.items()}
    dropped = {}
    for index, (u, receiver, name) in enumerate(graph.edges()):
        if not kept[index]:
            dropped.setdefault((id(receiver), name), []).append(u)

    def delta_for(receiver):
        delta = torch.zeros(len(receiver.names), *corrupted[0].shape)
        for row, name in enumerate(receiver.names):
            for u in dropped.get((id(receiver), name), []):
                delta[row] -= state.senders[u] - corrupted[u]
        return delta

    with split_run(target, graph, delta_for) as state:
        logits = model(**task.inputs("clean"), use_cache=False).logits
    return float(task.score(logits).double().mean())


def _patched(model, task=None, batch_size: int = 3):
    """`(graph, patched)`: the model's graph and its `Patched` on `task` (default: seed 7's)."""
    task = _task(seed=7) if task is None else task
    target = Target(model, task)
    graph = graph_of(target, task)
    return graph, Patched(target, graph, task, batch_size=batch_size)


@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_patched_runs_equal_the_edge_by_edge_sum(cache_bytes):
    model = _scaled(tiny_model("llama"), 0.2)
    task = _task(seed=7)
    target = Target(model, task)
    graph = graph_of(target, task)
    patched = Patched(target, graph, task, batch_size=2, cache_bytes=cache_bytes)  # batches of 2, 3 rows
    rng = np.random.default_rng(0)
    n = patched.n_edges
    masks = [rng.random(n) < p for p in (0.02, 0.3, 0.9)]  # random rows: senders far apart in one product
    heads_only = np.ones(n, dtype=bool)
    first = graph.receivers[0]  # layer 0's heads: drop the embedding from every q, k and v (one shared copy)
    heads_only[:len(first.names) * len(first.upstream)] = False
    for kept in [*masks, heads_only]:
        assert patched.metric(kept) == pytest.approx(_edge_by_edge(model, task, kept), abs=1e-5)
    assert len(patched.cached) == (len(patched.parts) if cache_bytes else 0)
    with pytest.raises(HeadscopeError, match="edges"):
        patched.metric(np.ones(n - 1, dtype=bool))


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_heads_read_their_copies_through_projection_columns_as_the_copies_give(family, monkeypatch):
    """Heads' q, k and v computed from their copies by projection columns (the block run on the
    stream once per round) equal the block run on every copy, on random masks; a block whose
    heads read at most `COPIES_AT_MOST` distinct copies (the empty circuit: one) runs on them."""
    import headscope.circuits.stream_copies as stream_copies

    calls = []
    by_columns = stream_copies.SplitRun._by_columns
    monkeypatch.setattr(stream_copies.SplitRun, "_by_columns",
                        lambda self, *args: calls.append(1) or by_columns(self, *args))
    model = scaled_family(family).requires_grad_(False)
    task = _task(seed=4)
    target = Target(model, task)
    graph = graph_of(target, task)
    columns, copies = Patched(target, graph, task, batch_size=3), Patched(target, graph, task, batch_size=3)
    copies.head_plans = {}  # every head block runs on its copies
    rng = np.random.default_rng(0)
    for share in (0.05, 0.5, 0.95):
        kept = rng.random(columns.n_edges) < share
        assert columns.metric(kept) == pytest.approx(copies.metric(kept), rel=1e-5, abs=1e-6)
    blocks = {id(r.module) for r in graph.receivers if r.kind == "heads"}
    assert set(columns.head_plans) == blocks and calls  # every block has its columns, and they ran
    calls.clear()
    nothing = np.zeros(columns.n_edges, dtype=bool)
    assert columns.metric(nothing) == pytest.approx(copies.metric(nothing), rel=1e-5, abs=1e-6)
    assert stream_copies.COPIES_AT_MOST >= 1 and not calls  # one copy per block: run on it


def test_row_sums_from_few_senders_equal_the_product(monkeypatch):
    """A receiver whose rows drop (or keep) few of its upstream senders sums just those, the kept
    ones from the running total of its upstream: the metric is the matrix product's."""
    import headscope.circuits.edge_patching as edge_patching

    _, patched = _patched(_scaled(tiny_model("llama"), 0.2))
    rng = np.random.default_rng(1)
    masks = [rng.random(patched.n_edges) < p for p in (0.01, 0.5, 0.99)]
    ways = set()
    for kept in masks:
        for *_, sums in patched._plans(kept).values():
            ways.update({"product"} if sums is None else {"total" if f else "dropped" for f, _ in sums[1]})
    assert ways == {"product", "total", "dropped"}  # every way a delta is summed is exercised
    summed = [patched.metric(kept) for kept in masks]
    monkeypatch.setattr(edge_patching, "_row_sums", lambda *args: None)  # the product everywhere
    assert all(sums is None for kept in masks for *_, sums in patched._plans(kept).values())
    assert summed == pytest.approx([patched.metric(kept) for kept in masks], abs=1e-6)


def test_a_projections_own_forward_is_back_after_the_rounds():
    """The rounds lend a head block's projections a forward that returns their first output; a
    forward the instance had of its own (accelerate's hooks put one there) is restored after."""
    model = _scaled(tiny_model("llama"), 0.2)
    task = _task(seed=7)
    target = Target(model, task)
    graph = graph_of(target, task)
    attention = model.model.layers[1].self_attn
    own = attention.k_proj.forward  # a bound method, set on the instance as a wrapper would be
    attention.k_proj.forward = own
    patched = Patched(target, graph, task, batch_size=3)
    kept = np.random.default_rng(2).random(patched.n_edges) < 0.5
    patched.metric(kept)
    assert attention.k_proj.__dict__["forward"] is own
    assert "forward" not in attention.q_proj.__dict__ and "forward" not in attention.v_proj.__dict__
    assert patched.metric(kept) == pytest.approx(_edge_by_edge(model, task, kept), abs=1e-5)


def test_products_of_several_receivers_at_once_equal_each_alone(monkeypatch):
    """Consecutive receivers' products run as one over the senders written when the first reads,
    each adding its own over the senders written since: the metric is that of a product per
    receiver, and the groups ran (over several batches, where a batch's buffers are reused)."""
    import transformers as tf

    import headscope.circuits.edge_patching as edge_patching
    from tests.support.tiny import tiny_config

    config = tiny_config("llama")
    config.num_hidden_layers = 5  # consecutive head blocks whose products can run together
    torch.manual_seed(0)
    model = _scaled(tf.AutoModelForCausalLM.from_config(config).eval(), 0.2)
    task = _task(seed=7)
    graph, patched = _patched(model, task)
    masks = [np.random.default_rng(3).random(patched.n_edges) < p for p in (0.3, 0.7)]
    for kept in masks:
        groups = edge_patching._product_groups(graph, patched._plans(kept))
        assert any(len(group) > 1 for group in groups.values())
        assert all(sum(len(patched._plans(kept)[id(r)][0]) for r in g) <= edge_patching.ROWS_TOGETHER
                   for g in groups.values())
    grouped = [patched.metric(kept) for kept in masks]
    monkeypatch.setattr(edge_patching, "_product_groups", lambda graph, plans: {})  # every product alone
    alone = [patched.metric(kept) for kept in masks]
    # The two sum the same products in another order: a few float32 ulps of the logits the metric
    # subtracts (an ulp of the largest moves a mean of 5 prompts' differences by about 1e-7).
    with torch.no_grad():
        largest = float(model(**task.inputs("clean"), use_cache=False).logits.abs().max())
    ulp = torch.finfo(torch.float32).eps * largest
    assert grouped == pytest.approx(alone, rel=1e-6, abs=4 * ulp)
    assert grouped == pytest.approx([_edge_by_edge(model, task, kept) for kept in masks], abs=1e-5)


def test_a_patched_run_leaves_no_buffer_in_a_reference_cycle():
    """The run's callbacks read the run they were given; it drops them at its end, so that its
    buffers go when the run does, not when the garbage collector next runs (their memory piled up
    over an evaluation's runs and slowed them)."""
    import gc

    _, patched = _patched(_scaled(tiny_model("llama"), 0.2))
    kept = np.random.default_rng(4).random(patched.n_edges) < 0.3
    patched.metric(kept)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        patched.metric(kept)
        gc.collect()
        cycled = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert cycled == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kl_metric_reads_the_clean_run_at_the_answer_positions(dtype):
    """Under the kl metric each batch keeps the clean run's logits at the answer positions only:
    the full circuit's run is the clean run (KL 0) and the empty circuit's the corrupted one."""
    model = _scaled(tiny_model("llama"), 0.2).to(dtype)
    task = _task(seed=7).with_metric("kl")
    _, patched = _patched(model, task)
    assert patched.metric(np.ones(patched.n_edges, dtype=bool)) == pytest.approx(0.0, abs=1e-6)
    if dtype == torch.float32:
        with torch.no_grad():
            clean = model(**task.inputs("clean"), use_cache=False).logits
            corrupted = model(**task.inputs("corrupted"), use_cache=False).logits
        expected = float(task.score(corrupted, reference=clean).double().mean())
        assert expected < -1e-4
        assert patched.metric(np.zeros(patched.n_edges, dtype=bool)) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    for cached in patched.cached.values():  # the reference: one position per prompt
        assert cached[2].stride(1) == 0


@pytest.mark.parametrize("family", ["gemma2", "gptj", "qwen2"])
def test_patched_runs_equal_the_edge_by_edge_sum_on_other_block_shapes(family):
    """Post-norms (Gemma 2), parallel attention and MLP (GPT-J), grouped keys with biases (Qwen2):
    products of several receivers at once, row sums and the answer positions' logits give the sum
    written out edge by edge."""
    import headscope.circuits.edge_patching as edge_patching

    model = scaled_family(family)
    task = _task(seed=7)
    graph, patched = _patched(model, task)
    rng = np.random.default_rng(5)
    masks = [rng.random(patched.n_edges) < p for p in (0.05, 0.5, 0.95)]
    assert any(len(g) > 1 for kept in masks for g in edge_patching._product_groups(graph, patched._plans(kept)).values())
    for kept in masks:
        assert patched.metric(kept) == pytest.approx(_edge_by_edge(model, task, kept), abs=1e-5)


def test_distinct_rows_are_numpys_up_to_their_order():
    """A receiver's distinct mask rows and which row each name reads, as `np.unique(axis=0)` gives
    them (first appearance order instead of sorted)."""
    from headscope.circuits.edge_patching import _distinct_rows

    rng = np.random.default_rng(6)
    for shape, share in [((27, 300), 0.9), ((27, 9), 0.5), ((5, 3), 0.5), ((1, 10), 0.1), ((27, 1), 0.5),
                         ((12, 40), 0.0), ((12, 40), 1.0)]:
        mask = rng.random(shape) < share
        rows, which = _distinct_rows(mask)
        expected, inverse = np.unique(mask, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        assert np.array_equal(rows[which], mask)
        assert {r.tobytes() for r in rows} == {r.tobytes() for r in expected} and len(rows) == len(expected)
        assert np.array_equal(which[:, None] == which[None, :], inverse[:, None] == inverse[None, :])
        assert list(which[np.sort(np.unique(which, return_index=True)[1])]) == list(range(len(rows)))


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_circuits_side_by_side_in_one_pass_equal_each_run_alone(family):
    """`Patched.metrics` runs several circuits in one pass, each on its own copy of the batch
    (a combined copy per distinct combination of the circuits' rows): each circuit's metric is
    its own run's, with circuits that keep every edge, none, or share rows among them, over
    batches of uneven size."""
    model = scaled_family(family).requires_grad_(False)
    task = _task(seed=4)
    graph, patched = _patched(model, task)
    rng = np.random.default_rng(8)
    n = patched.n_edges
    heads_only = np.ones(n, dtype=bool)
    heads_only[patched.spans[0]] = False  # the first receiver alone drops its edges
    masks = [rng.random(n) < 0.05, np.ones(n, dtype=bool), rng.random(n) < 0.5, heads_only,
             np.zeros(n, dtype=bool), rng.random(n) < 0.95]
    alone = [patched.metric(kept) for kept in masks]
    assert patched.metrics(masks) == pytest.approx(alone, rel=1e-5, abs=1e-6)
    assert patched.metrics(masks[:2]) == pytest.approx(alone[:2], rel=1e-5, abs=1e-6)
    assert patched.metrics([]) == []
    _, copies = _patched(model, task)
    copies.head_plans = {}  # every head block runs on its copies: the combined rows assembled
    assert copies.metrics(masks) == pytest.approx(alone, rel=1e-5, abs=1e-6)
    with pytest.raises(HeadscopeError, match="edges"):
        patched.metrics([masks[0], np.ones(n - 1, dtype=bool)])


def test_circuits_side_by_side_under_the_kl_metric_each_read_the_clean_run():
    """Under kl every circuit's copy of the batch is scored against the same clean logits."""
    model = _scaled(tiny_model("llama"), 0.2)
    task = _task(seed=7).with_metric("kl")
    _, patched = _patched(model, task)
    rng = np.random.default_rng(9)
    masks = [np.ones(patched.n_edges, dtype=bool), rng.random(patched.n_edges) < 0.4,
             np.zeros(patched.n_edges, dtype=bool)]
    together = patched.metrics(masks)
    assert together[0] == pytest.approx(0.0, abs=1e-6)
    assert together == pytest.approx([patched.metric(kept) for kept in masks], rel=1e-5, abs=1e-6)
    assert together[2] < -1e-4  # the empty circuit: the corrupted run, away from the clean one


@pytest.mark.parametrize("family, fused", [("llama", True), ("gemma2", True), ("t5", True), ("qwen2", True),
                                           ("phi", False), ("opt", False), ("gptj", False)])
def test_a_head_blocks_rmsnorm_goes_into_its_projection_columns(family, fused):
    """Where a head block's norm is an RMSNorm (Gemma's 1 + weight included) its copies skip the
    module: the gain goes into the columns' weight rows and the per-row scale after the product,
    equal to the module run on the copies; a LayerNorm (centred) runs itself, as does any norm on a
    bfloat16 stream or one whose epsilon is not the one it uses."""
    import copy

    from headscope.circuits.stream_copies import _RMSForm

    model = scaled_family(family).requires_grad_(False)
    task = _task(seed=4)
    graph, patched = _patched(model, task)
    kept = np.random.default_rng(1).random(patched.n_edges) < 0.5
    value = patched.metric(kept)
    forms = list(patched.norms.values())
    assert forms and all((f is not None) == fused for f in forms)
    _, module_norms = _patched(model, task)
    module_norms.norms = None  # every norm runs itself
    assert value == pytest.approx(module_norms.metric(kept), rel=1e-5, abs=1e-6)
    norm = next(r.norm for r in graph.receivers if r.kind == "heads" and r.norm is not None)
    stream = torch.randn(2, 5, norm.weight.shape[0], generator=torch.Generator().manual_seed(0))
    if fused:
        form = _RMSForm.of(norm, stream)
        x = stream.reshape(-1, stream.shape[-1])
        torch.testing.assert_close(x * form.gain * form.inverse_rms(x), norm(stream).reshape(x.shape))

        class Declared(torch.nn.Module):  # names an epsilon it does not use
            def __init__(self):
                super().__init__()
                self.weight, self.variance_epsilon = norm.weight, 0.5

            def forward(self, hidden):
                return norm(hidden)

        tiny = stream * 1e-3  # rows whose mean square is near the declared epsilon
        assert _RMSForm.of(Declared(), tiny) is None and _RMSForm.of(norm, tiny) is not None
        half = copy.deepcopy(model).to(torch.bfloat16)
        _, halved = _patched(half, task)
        halved.metric(kept)
        assert halved.norms == {}  # a bfloat16 stream: the module runs itself
    else:
        assert _RMSForm.of(norm, stream) is None
