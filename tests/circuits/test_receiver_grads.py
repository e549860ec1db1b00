"""Every receiver's gradient from one ordinary backward pass (`receiver_gradients`) against the
literal definition: each receiver reads its own copy of the stream (`split_run`) and the
gradient is taken at that copy's zero change. Block shapes: grouped-query attention with q/k/v
biases (Qwen2), a GQA Llama, Gemma 2's post-norms and soft-capped logits, parallel attention
and MLP on one norm (Phi, GPT-J), OPT's flat MLP rows, multi-head latent attention
(DeepSeek-V3), an MoE (Mixtral) and an encoder-decoder's decoder (T5)."""
import numpy as np
import pytest
import torch

from headscope.circuits.edges import graph_of
from headscope.circuits import eap, receiver_grads
from headscope.circuits.receiver_grads import receiver_gradients
from headscope.circuits.stream_copies import split_run
from headscope.circuits.target import Target, output_logits
from headscope.errors import HeadscopeError

from tests.support.circuit_models import BLOCK_FAMILIES, random_task, scaled_family

def _copies(target, graph, inputs, metric_of, embed):
    """`{(receiver index, name index): g}` with every receiver on its own copy of the stream."""
    leaves = {}

    def delta_for(receiver):
        shape = (len(receiver.names), *inputs[1])
        leaves[id(receiver)] = torch.zeros(shape, requires_grad=True)
        return leaves[id(receiver)]

    with torch.enable_grad(), split_run(target, graph, delta_for, embed=embed):
        metric = metric_of(output_logits(target.model(**inputs[0], use_cache=False)))
        found = torch.autograd.grad(metric, [leaves[id(r)] for r in graph.receivers], allow_unused=True)
    return {(i, j): g[j] for i, g in enumerate(found) if g is not None for j in range(len(g))}


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_receiver_gradients_equal_the_copies(family, monkeypatch):
    model = scaled_family(family).requires_grad_(False)
    direct = []
    checked = receiver_grads._only_through
    monkeypatch.setattr(receiver_grads, "_only_through", lambda *a, **k: direct.append(checked(*a, **k)) or direct[-1])
    task = random_task(seed=1)
    target = Target(model, task)
    graph = graph_of(target, task)
    inputs, positions = target.inputs(task, "clean")
    corrupted, _ = target.inputs(task, "corrupted")
    ids = inputs["decoder_input_ids" if target.two_inputs else "input_ids"]
    e_clean = model.get_input_embeddings()(ids).detach()
    e_corrupted = model.get_input_embeddings()(corrupted["decoder_input_ids" if target.two_inputs
                                                          else "input_ids"]).detach()
    embed = None if target.two_inputs else (lambda e: e_corrupted + 0.4 * (e_clean - e_corrupted))

    def metric_of(logits):
        return task.score(target.aligned(logits).float()).sum()

    expected = _copies(target, graph, (inputs, (*ids.shape, target.d_model)), metric_of, embed)
    index = {id(r): i for i, r in enumerate(graph.receivers)}
    scale = max(float(g.abs().max()) for g in expected.values())
    assert scale > 0
    for at in (None, positions):  # the LM head on every position, or on the metric's own only
        found = {}
        for receiver, names, g in receiver_gradients(target, graph, inputs, metric_of, embed=embed, heads_at_once=2,
                                                     positions=at):
            for j, row in zip(range(names.start, names.stop), g):
                assert (index[id(receiver)], j) not in found
                found[(index[id(receiver)], j)] = row
        for key in expected.keys() | found.keys():
            want = expected.get(key, torch.zeros(()))
            got = found.get(key, torch.zeros(()))
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * scale), (family, graph.receivers[key[0]].names[key[1]])
    heads = [r for r in graph.receivers if r.kind == "heads"]
    assert any((index[id(r)], 1) in found for r in heads)  # a key's gradient reached
    assert direct and all(direct)  # every block crossed its projections by their weight rows


def test_the_weights_stay_as_they_were():
    """The pass holds the weights out of its graph and gives them back their flags."""
    model = scaled_family("llama")
    model.lm_head.requires_grad_(False)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    task = random_task(seed=1)
    target = Target(model, task)
    graph = graph_of(target, task)
    inputs, _ = target.inputs(task, "clean")
    found = list(receiver_gradients(target, graph, inputs, lambda logits: task.score(target.aligned(logits)).sum()))
    assert found and all(p.grad is None for p in model.parameters())
    assert not any(g.requires_grad for _, _, g in found)  # no weight's graph reaches a gradient
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags


def test_micro_batches_fitted_to_the_memory_budget_give_the_same_scores():
    """A budget that fits two prompts splits the task into passes of two; the per-prompt scores
    are those of one pass over all of them."""
    model = scaled_family("qwen2").requires_grad_(False)
    task = random_task(seed=2, n=6)
    target = Target(model, task)
    graph = graph_of(target, task)
    each = eap.scoring_bytes(target, graph, task.clean.shape[1])
    assert eap.micro_batch(target, graph, task, 8, max_memory=2 * each + each // 2) == 2
    assert eap.micro_batch(target, graph, task, 8, max_memory=100 * each) == 8
    whole = eap.score_edges(target, graph, task, "eap-ig", 3, batch_size=6, max_memory=100 * each)
    seen = []
    split = eap.score_edges(target, graph, task, "eap-ig", 3, batch_size=6, max_memory=2 * each + each // 2,
                            progress=lambda stage, done, total: seen.append((done, total)))
    assert seen[-1] == (9, 9)  # 3 steps x 3 micro-batches
    scale = float(np.abs(whole[3]).max())
    assert np.allclose(split[3], whole[3], rtol=1e-4, atol=1e-5 * scale)
    # float32 logits from the head's product over 2 rows against 6 (one position per prompt): the
    # metrics agree to float32 rounding, a few parts in 1e6
    assert split[2] == pytest.approx(whole[2], rel=1e-5)
    too_long = r"one prompt of 8 tokens needs about [0-9.]+ KiB .* the [0-9.]+ KiB allowed \(max_memory\)"
    with pytest.raises(HeadscopeError, match=too_long):
        eap.micro_batch(target, graph, task, 8, max_memory=each - 1)


def test_the_scoring_estimate_covers_a_measured_pass():
    """`scoring_bytes` is at least what the scoring's tensors hold: the senders' change, the
    logits and the gradient rows of one block, measured on the tiny model."""
    model = scaled_family("llama").requires_grad_(False)
    task = random_task(seed=2, n=4)
    target = Target(model, task)
    graph = graph_of(target, task)
    length = task.clean.shape[1]
    change = len(graph.senders) * target.d_model * 4  # per token
    logits = 3 * model.config.vocab_size * 4  # per prompt: its answer position's, three times
    assert eap.scoring_bytes(target, graph, length) > length * change + logits


@pytest.mark.parametrize("family", ["gemma2", "t5", "gpt2"])
def test_the_head_read_at_the_metric_positions_gives_those_logits(family):
    """`read_positions`: the LM head reads one position per example (soft-capped logits, an
    encoder-decoder's decoder, GPT-2's tied head); the logits a task reads are the whole run's."""
    from headscope.circuits.target import read_positions
    model = scaled_family(family).requires_grad_(False)
    task = random_task(seed=3)
    target = Target(model, task)
    inputs, positions = target.inputs(task, "clean")
    positions = positions.clone()
    positions[0] = 1  # not every example's last position
    whole = output_logits(model(**inputs, use_cache=False))
    with read_positions(model, positions) as head:
        cut = head.logits(model(**inputs, use_cache=False))
    assert head.length == whole.shape[1] and cut.shape == whole.shape
    rows = torch.arange(len(positions))
    torch.testing.assert_close(cut[rows, positions], whole[rows, positions], rtol=1e-5, atol=1e-5)
    assert cut.stride(1) == 0  # one row per example, seen at every position
    with read_positions(model, positions[:2]) as head:  # not the run's rows: the head reads them all
        kept = head.logits(model(**inputs, use_cache=False))
    assert head.length is None and torch.equal(kept, whole)
