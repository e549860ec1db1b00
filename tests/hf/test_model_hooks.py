"""Hook points inside Hugging Face models (`headscope.model_hooks`): on every family with
from_hf, each point sees what the same layer's `MultiHeadAttention.from_hf` module sees on the
same inputs; replacements act; hooks and routing never outlive their `with` block."""
import pytest
import torch

import headscope
from headscope.attention import MultiHeadAttention
from headscope.hf import route
from headscope.hf.adapters import adapter_for, attention_blocks, core_modules
from headscope.hf.from_hf import call_arguments
from headscope.hf.hooks import POINTS
from headscope.hf.verify import _named_inputs
from tests.support.tiny import INTERFACE_FAMILIES, tiny_config, tiny_inputs, tiny_model, output_of

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VERIFIED = [f for f in INTERFACE_FAMILIES if not adapter_for(tiny_config(f, kind="interface")).no_from_hf]


def _recorder(seen):
    def record(value, hook):
        seen[hook.name] = value.detach().clone()
    return record


@pytest.mark.parametrize("family", VERIFIED)
@torch.no_grad()
def test_inside_equals_alongside_hook_by_hook(family):
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    default = model.config._attn_implementation
    received, returned, inside = {}, {}, {}

    def keep(layer):
        def pre_hook(module, args, kwargs):
            received[layer] = _named_inputs(module, args, kwargs)
        return pre_hook

    def keep_returned(layer):
        def hook(module, args, output):
            returned[layer] = output  # T5's holds the position bias it used
        return hook

    def keep_selection(layer):  # DeepSeek-V3.2's indexer: the keys the layer attends to (`Adapter.selector`)
        def hook(module, args, output):
            received[layer]["indices"] = output
        return hook

    cores = dict(core_modules(model))
    handles = [core.register_forward_pre_hook(keep(layer), with_kwargs=True) for layer, core in cores.items()]
    handles += [core.register_forward_hook(keep_returned(layer)) for layer, core in cores.items()]
    selector = adapter_for(model.config).selector
    if selector:
        handles += [core.get_submodule(selector).register_forward_hook(keep_selection(layer))
                    for layer, core in cores.items()]
    try:
        with headscope.model_hooks(model, {"layers.*.attn.hook_*": _recorder(inside)}):
            model(**x)
    finally:
        for h in handles:
            h.remove()
    assert model.config._attn_implementation == default and not route.routed_models()
    assert len(inside) == 2 * len(POINTS)
    worst = 0.0
    for layer, block in attention_blocks(model):
        mine = MultiHeadAttention.from_hf(block, model.config)
        got = received[layer]
        if adapter_for(model.config).bias_in_call:  # UMT5: the bias the layer computes and hands its attention function
            length = got["hidden_states"].shape[1]
            got["bias_in_call"] = cores[layer].compute_bias(length, length)
        alongside = {}
        with mine.hooks({p: _recorder(alongside) for p in POINTS}):
            mine(**call_arguments(mine, model.config, got, returned[layer]))
        for p in POINTS:
            theirs, ours = alongside[p], inside[f"layers.{layer}.attn.{p}"]
            assert ours.shape == theirs.shape, p
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5, msg=f"{family} layer {layer} {p}")
            finite = theirs > torch.finfo(theirs.dtype).min / 2  # masked scores sit at the dtype's minimum
            worst = max(worst, (ours - theirs)[finite].abs().max().item())
    print(f"{family}: max |inside - alongside| over all points {worst:.2e}")


def _logits(model, x):
    return output_of(model(**x))


@torch.no_grad()
def test_pattern_replaced_by_itself_is_bit_identical_and_uniform_changes_it():
    model = tiny_model("llama", kind="interface")
    x = tiny_inputs()
    with headscope.model_hooks(model, {"layers.1.attn.hook_pattern": lambda p, h: None}):
        read_only = _logits(model, x)
    with headscope.model_hooks(model, {"layers.1.attn.hook_pattern": lambda p, h: p.clone()}):
        itself = _logits(model, x)
    assert torch.equal(read_only, itself)

    def uniform(pattern, hook):
        causal = torch.ones(pattern.shape[-2:]).tril()  # (Tq, Tk)
        out = pattern.clone()
        out[:, 2] = causal / causal.sum(-1, keepdim=True)
        return out

    with headscope.model_hooks(model, {"layers.1.attn.hook_pattern": uniform}):
        changed = _logits(model, x)
    assert (changed - itself).abs().max() > 1e-3
    # The explicit path inside the model (forced by the read-only pattern hook) is the fused one.
    assert (_logits(model, x) - read_only).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
@torch.no_grad()
def test_editing_z_equals_ablate(family):
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    with headscope.ablate(model, heads=[(0, 1)]):
        ablated = _logits(model, x)
    with headscope.model_hooks(model, [("layers.0.attn.hook_z", zero_head)]):
        edited = _logits(model, x)
    assert (ablated - _logits(model, x)).abs().max() > 1e-3
    assert torch.equal(ablated, edited)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
@torch.no_grad()
def test_result_sums_to_the_output_and_edits_act(family):
    model = tiny_model(family, kind="interface")
    x = tiny_inputs()
    before = _logits(model, x)
    with headscope.model_hooks(model, {"layers.0.attn.hook_result": lambda r, h: r * 1.0}):
        same = _logits(model, x)
    torch.testing.assert_close(same, before, atol=1e-5, rtol=1e-5)

    def drop_head(result, hook):
        result = result.clone()
        result[:, :, 1] = 0
        return result

    with headscope.model_hooks(model, {"layers.0.attn.hook_result": drop_head}):
        dropped = _logits(model, x)
    with headscope.ablate(model, heads=[(0, 1)]):
        ablated = _logits(model, x)
    torch.testing.assert_close(dropped, ablated, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_filter_functions_wildcards_and_cleanup_on_exceptions():
    model = tiny_model("gpt2", kind="interface")  # shared (functools.cache): earlier tests may have left transformers' own hooks
    x = tiny_inputs()
    default = model.config._attn_implementation
    before = {name: dict(m._forward_hooks) for name, m in model.named_modules()}
    seen = {}
    with headscope.model_hooks(model, [(lambda name: name.endswith("hook_v"), _recorder(seen))]):
        model(**x)
    assert sorted(seen) == ["layers.0.attn.hook_v", "layers.1.attn.hook_v"]
    with pytest.raises(RuntimeError, match="inside"):
        with headscope.model_hooks(model, {"layers.*.attn.hook_result": lambda r, h: r,
                                           "layers.1.attn.hook_scores": lambda s, h: s}):
            raise RuntimeError("inside")
    assert model.config._attn_implementation == default and not route.routed_models()
    assert {name: dict(m._forward_hooks) for name, m in model.named_modules()} == before
    with pytest.raises(headscope.HeadscopeError, match="no hook point matches"):
        with headscope.model_hooks(model, {"blocks.0.attn.hook_z": lambda z, h: z}):
            pass


@torch.no_grad()
def test_cache_keeps_only_the_named_values_as_the_hooks_see_them():
    model = tiny_model("qwen2", kind="interface")
    x = tiny_inputs()
    names = ["layers.1.attn.hook_pattern", "layers.*.attn.hook_z"]
    seen = {}
    with headscope.model_hooks(model, [(name, _recorder(seen)) for name in names]):
        model(**x)
    with headscope.cache_activations(model, names, to="cpu") as c:
        model(**x)
    assert sorted(c.keys()) == ["layers.0.attn.hook_z", "layers.1.attn.hook_pattern", "layers.1.attn.hook_z"]
    for name in c.keys():
        assert torch.equal(c[name], seen[name])
    assert c["layers.1.attn.hook_pattern"].shape == (2, 4, 11, 11)
    with headscope.cache_activations(model, [lambda n: n == "layers.0.attn.hook_k"], dtype=torch.float16) as twice:
        model(**x)
        model(**x)
    assert twice["layers.0.attn.hook_k"].shape == (4, 2, 11, 16)  # two passes on batch; KV heads not expanded
    assert twice["layers.0.attn.hook_k"].dtype == torch.float16
    with pytest.raises(KeyError, match="not cached"):
        twice["layers.1.attn.hook_k"]
