"""Direct logit attribution: the parts sum to the model's own logit difference, and each head's part
equals a reference computed here from the layer's weights and the model's eager attention."""
import pytest
import torch

import headscope
from headscope.circuits.tasks import Task
from headscope.circuits.dla import logit_attribution

from tests.support.contracts import run_eager
from tests.support.tiny import VOCAB, tiny_model

N, LENGTH = 5, 9


def _task(seed: int = 0, pad: bool = True) -> Task:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, VOCAB, (N, LENGTH), generator=gen)
    corrupted = torch.randint(3, VOCAB, (N, LENGTH), generator=gen)
    mask = torch.ones(N, LENGTH, dtype=torch.long)
    if pad:
        mask[1, -3:] = 0  # a shorter prompt, right-padded: its answer is read at position 5
    return Task(clean=clean, corrupted=corrupted, attention_mask=mask,
                answer=torch.randint(3, VOCAB, (N,), generator=gen), wrong=torch.randint(3, VOCAB, (N,), generator=gen))


def _own_logit_diff(logits: torch.Tensor, task: Task, offset: int = 0) -> torch.Tensor:
    """The logit difference read straight off a run's logits (no headscope code)."""
    rows = torch.arange(task.n)
    final = logits[rows, task.position + offset]
    return final[rows, task.answer] - final[rows, task.wrong]


def _enlarge(model, std: float = 0.3):
    """Weights large enough that attention is far from uniform and every part matters."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model


CASES = [  # (family, kind, sites): GQA, GPT-2, a hybrid, an output gate (also hybrid), a head-mixing norm, an encoder-decoder
    ("llama", "odd", None),
    ("gpt2", "odd", None),
    ("jamba", "hybrid", None),
    ("qwen3_next", "hybrid", None),
    ("bitnet", "interface", None),
    ("t5", "encoder_decoder", "decoder.self"),
    ("gemma3_text", "interface", None),  # post-attention and post-feedforward norms, frozen too
]


@pytest.mark.parametrize("family,kind,sites", CASES, ids=[c[0] for c in CASES])
def test_parts_sum_to_the_models_logit_difference(family, kind, sites):
    model = tiny_model(family, kind=kind)
    if kind == "interface":  # shared by the process: take a copy to run
        model = tiny_model(family, kind=kind)
    task = _task(pad=kind != "encoder_decoder")
    table = logit_attribution(model, task, sites=sites, batch_size=2)
    if sites is None:
        with torch.no_grad():
            own = _own_logit_diff(model(**task.inputs("clean")).logits, task)
    else:
        start = torch.full((N, 1), model.config.decoder_start_token_id)
        with torch.no_grad():
            out = model(input_ids=task.clean, attention_mask=task.mask,
                        decoder_input_ids=torch.cat([start, task.clean], 1))
        own = _own_logit_diff(out.logits, task, offset=1)
    assert table.attrs["total"] == pytest.approx(float(own.mean()), abs=1e-5)
    assert float(table.effect.sum()) == pytest.approx(table.attrs["total"], abs=1e-4)
    heads = table[table.kind == "head"]
    assert len(heads) == len(set(zip(heads["layer"], heads["head"])))
    assert set(table.kind) >= {"embed", "head"}
    assert ((table.lo <= table.effect + 1e-9) & (table.effect <= table.hi + 1e-9)).all()
    if family == "jamba":  # its Mamba layers are components of their own, under their own numbers
        assert "mixer" in set(table.kind)
        assert set(heads.layer) == {1, 3}
    if family == "t5":
        assert "attn" in set(table.kind)  # the decoder's cross-attention, a part of its own


def test_sum_holds_on_the_corrupted_run_too():
    model = tiny_model("llama")
    task = _task()
    table = logit_attribution(model, task, on="corrupted")
    with torch.no_grad():
        own = _own_logit_diff(model(**task.inputs("corrupted")).logits, task)
    assert table.attrs["on"] == "corrupted"
    assert float(table.effect.sum()) == pytest.approx(float(own.mean()), abs=1e-4)


@torch.no_grad()
def _reference_heads(model, task: Task, layers, norm_of, v_of, out_of, final_in, final_frozen, unembed):
    """Each head's direct effect written out: z_h = A_h V_(h's kv head) from the eager pattern and the
    layer's own v projection, times its slice of W_O, through the final norm with its scale frozen,
    dotted with W_U[answer] - W_U[wrong]."""
    x = task.inputs("clean")
    seen = {}
    handles = [layer.register_forward_pre_hook(lambda m, a, k, i=i: seen.__setitem__(i, (a[0] if a else k["hidden_states"])),
                                               with_kwargs=True) for i, layer in enumerate(layers)]
    handles.append(final_in.register_forward_pre_hook(lambda m, a: seen.__setitem__("final", a[0])))
    with torch.no_grad():
        out = run_eager(model, dict(x, output_attentions=True), handles=handles)
    rows = torch.arange(task.n)
    direction = unembed[task.answer] - unembed[task.wrong]  # (n, d)
    residual = seen["final"][rows, task.position]  # (n, d)
    found = {}
    for i, layer in enumerate(layers):
        pattern = out.attentions[i]  # (n, H, T, T), eager
        values = v_of(layer, norm_of(layer)(seen[i]))  # (n, T, KV, D)
        n_heads, n_kv = pattern.shape[1], values.shape[2]
        for h in range(n_heads):
            z = torch.einsum("nk,nkd->nd", pattern[rows, h, task.position], values[:, :, h // (n_heads // n_kv)])
            result = out_of(layer, h, z)  # (n, d)
            found[(i, h)] = float((final_frozen(result, residual) * direction).sum(-1).mean())
    return found


def test_each_head_equals_a_reference_from_the_weights_llama_gqa():
    model = _enlarge(tiny_model("llama"))
    task = _task()
    table = logit_attribution(model, task)
    layers = model.model.layers
    d_head = model.config.head_dim
    eps, gain = model.model.norm.variance_epsilon, model.model.norm.weight

    def v_of(layer, x):
        return layer.self_attn.v_proj(x).view(*x.shape[:2], -1, d_head)

    def out_of(layer, h, z):
        return z @ layer.self_attn.o_proj.weight[:, h * d_head:(h + 1) * d_head].T

    def frozen(part, residual):  # RMSNorm: x / sqrt(mean(x^2) + eps) * g, scale of the whole residual
        return part / torch.sqrt(residual.pow(2).mean(-1, keepdim=True) + eps) * gain

    reference = _reference_heads(model, task, layers, lambda l: l.input_layernorm, v_of, out_of, model.model.norm,
                                 frozen, model.lm_head.weight)
    heads = table[table.kind == "head"]
    assert len(heads) == 2 * 6
    for row in heads.itertuples():
        assert row.effect == pytest.approx(reference[(row.layer, row.head)], abs=1e-4)
    assert max(abs(v) for v in reference.values()) > 0.05  # the reference is not trivially zero


def test_each_head_equals_a_reference_from_the_weights_gpt2():
    model = _enlarge(tiny_model("gpt2"))
    task = _task()
    table = logit_attribution(model, task)
    blocks = model.transformer.h
    n_heads, d_model = model.config.n_head, model.config.n_embd
    d_head = d_model // n_heads
    ln = model.transformer.ln_f

    def v_of(block, x):  # Conv1D: x @ W + b, W (d_model, 3 d_model): q | k | v
        return (x @ block.attn.c_attn.weight + block.attn.c_attn.bias)[..., 2 * d_model:].view(*x.shape[:2], n_heads,
                                                                                               d_head)

    def out_of(block, h, z):
        return z @ block.attn.c_proj.weight[h * d_head:(h + 1) * d_head]

    def frozen(part, residual):  # LayerNorm: centred, divided by the residual's std, times g
        sigma = torch.sqrt(residual.var(-1, unbiased=False, keepdim=True) + ln.eps)
        return (part - part.mean(-1, keepdim=True)) / sigma * ln.weight

    reference = _reference_heads(model, task, blocks, lambda b: b.ln_1, v_of, out_of, ln, frozen, model.lm_head.weight)
    heads = table[table.kind == "head"]
    for row in heads.itertuples():
        assert row.effect == pytest.approx(reference[(row.layer, row.head)], abs=1e-4)
    assert max(abs(v) for v in reference.values()) > 0.05


def test_refusals_are_one_line():
    task = _task(pad=False)
    with pytest.raises(headscope.HeadscopeError, match="post-norm") as err:
        logit_attribution(tiny_model("bart", kind="encoder_decoder"), task, sites="decoder.self")
    assert "\n" not in str(err.value)
    with pytest.raises(headscope.HeadscopeError, match="soft-capped"):
        logit_attribution(tiny_model("gemma2", kind="interface"), task)
    with pytest.raises(headscope.HeadscopeError, match="language-model head|unembedding"):
        logit_attribution(tiny_model("bert"), task)
    with pytest.raises(headscope.HeadscopeError, match="on must be"):
        logit_attribution(tiny_model("llama"), task, on="both")
    with pytest.raises(headscope.HeadscopeError, match="headscope.Task"):
        logit_attribution(tiny_model("llama"), {"clean": task.clean})
    big = Task(clean=task.clean + 200, corrupted=task.corrupted + 200, answer=task.answer, wrong=task.wrong)
    with pytest.raises(headscope.HeadscopeError, match="vocabulary"):
        logit_attribution(tiny_model("llama"), big)
