"""Vision-language models' vision towers as the opt-in "vision" stack (gemma3's SigLIP, llava's
CLIP, mllama's local and global vision transformers; tiny random-init models with one 28-pixel
image per example, tests/support/tiny.py): the default stays the text decoder; with
`sites="vision"` headscope inside the model changes nothing, its patterns are the modules' own
eager weights (bidirectional), every vision site that ran is captured, ablation equals zeroing
the head's slice of the output projection's input and restores the model, and a tower that
never ran (text alone) is reported and refused. qwen2_5_vl's vision attention runs once per
image or window (cu_seqlens): its vision stack is refused in one line, and the tower still
runs right under headscope's kernel."""
import pytest
import torch

import headscope
from headscope.hf import route
from headscope.hf.sites import group_names, select, sites, vision_tower
from tests.support.contracts import eager_weights, head_zeroed_at
from tests.support.tiny import tiny_image_inputs, tiny_inputs, tiny_mllama, tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = ("gemma3", "llava", "mllama")
OUT = {"gemma3": "out_proj", "llava": "out_proj", "mllama": "o_proj"}  # output projection inside the site
LAYERS = {"gemma3": [0, 1], "llava": [0, 1], "mllama": [0, 1, 2]}  # mllama: 2 local layers, then 1 global
# The layer each family's ablation removes a head of: the last, but llava's image features are its
# tower's penultimate hidden state (vision_feature_layer -2), so its last layer never reaches the text.
ABLATED = {"gemma3": 1, "llava": 0, "mllama": 2}


def _model(family):
    return tiny_mllama(full=True) if family == "mllama" else tiny_model(family, kind="composite")


def _eager_vision_patterns(model, x) -> dict[int, torch.Tensor]:
    """The weights each vision attention module's eager path returns, by vision layer (modules
    found by their site's path)."""
    return eager_weights(model, {layer: model.get_submodule(site.name)
                                 for layer, site in select(model, "vision").sites.items()}, x)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_vision_tower_is_an_opt_in_stack(family):
    model = _model(family)
    found = sites(model)
    vision = [s for s in found if s.stack == "vision"]
    tower = dict(model.named_modules())
    prefix = next(name for name, module in tower.items() if module is vision_tower(model))
    assert [(s.kind, s.layer) for s in vision] == [("self", layer) for layer in LAYERS[family]]
    assert all(s.name.startswith(prefix + ".") and s.name in tower for s in vision)
    assert {"vision", "vision.self"} <= set(group_names(found))
    assert select(model).group == "text" and all(s.stack == "text" for s in select(model).sites.values())
    assert select(model, "vision").sites == select(model, "vision.self").sites
    assert select(model, "vision").n_heads == 2


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_capture_of_the_vision_tower_keeps_outputs_and_patterns_match_eager(family):
    model = _model(family)
    x = tiny_image_inputs(family)
    valid = x["attention_mask"].bool()
    before = model(**x).logits
    with headscope.capture(model, sites="vision") as cap:
        captured = model(**x).logits
    assert (before - captured).abs()[valid].max() <= 1e-4
    assert sorted(cap.patterns) == LAYERS[family] and cap.not_run == []
    eager = _eager_vision_patterns(model, x)
    assert sorted(eager) == LAYERS[family]
    for layer in LAYERS[family]:
        mine, theirs = cap.patterns[layer], eager[layer]
        assert mine.shape == theirs.shape and mine.shape[1] == 2
        assert (mine - theirs).abs().max() <= 1e-5
        assert mine[:, :, 0, -1].min() > 0  # bidirectional: the first patch sees the last
    assert not route.routed_models()


def _run(model, x) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and the vision tower's own output (its first: the last hidden state), read
    with a forward hook on the tower; mllama's image reaches its logits only faintly."""
    seen = []
    handle = vision_tower(model).register_forward_hook(lambda module, args, out: seen.append(out[0]))
    try:
        logits = model(**x).logits
    finally:
        handle.remove()
    return logits, seen[0]


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_vision_ablation_is_zeroing_the_heads_slice_of_the_output_projections_input(family):
    """The reference, independent of headscope: a pre-hook on the site's own output projection
    (found by the site's module path) zeroes head h's slice of its input."""
    model = _model(family)
    x = tiny_image_inputs(family)
    layer, head = ABLATED[family], 1
    out = model.get_submodule(select(model, "vision").sites[layer].name).get_submodule(OUT[family])
    before = _run(model, x)
    with headscope.ablate(model, heads=[(layer, head)], sites="vision"):
        ablated = _run(model, x)

    with head_zeroed_at(out, head, 2):
        reference = _run(model, x)
    assert (ablated[1] - before[1]).abs().max() > 1e-3  # the tower's output
    assert (ablated[0] - before[0]).abs().max() > (1e-4 if family == "mllama" else 1e-3)  # the logits
    for mine, theirs in zip(ablated, reference):
        assert (mine - theirs).abs().max() <= 1e-4
    assert all(torch.equal(a, b) for a, b in zip(before, _run(model, x)))
    assert not route.routed_models()


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_a_vision_tower_that_never_ran_is_reported_and_refused(family):
    """Text alone: the vision sites never run. capture reports them; ablating or hooking one is
    an error in one line, never a silent no-op."""
    model = _model(family)
    x = tiny_inputs()
    with headscope.capture(model, sites="vision") as cap:
        model(**x)
    assert cap.patterns == {} and cap.not_run == LAYERS[family]
    for enter in (lambda: headscope.ablate(model, heads=[(0, 0)], sites="vision"),
                  lambda: headscope.model_hooks(model, {"layers.0.attn.hook_z": lambda z, hook: z * 0}, sites="vision")):
        with pytest.raises(headscope.HeadscopeError, match="vision layer 0 did nothing: its attention never ran") as err:
            with enter():
                model(**x)
        assert "\n" not in str(err.value)
    assert not route.routed_models()


@torch.no_grad()
def test_hooks_and_cache_address_the_vision_tower():
    """cache_activations' vision patterns are capture's; hook_z zeroing a head is ablation;
    hook_result, which reads W_O through an adapter, is refused for the vision sites."""
    model = _model("gemma3")
    x = tiny_image_inputs("gemma3")
    with headscope.capture(model, sites="vision") as cap:
        model(**x)
    with headscope.cache_activations(model, ["layers.*.attn.hook_pattern", "layers.1.attn.hook_z"],
                                     sites="vision") as cache:
        model(**x)
    torch.testing.assert_close(cache["layers.0.attn.hook_pattern"], cap.patterns[0], atol=1e-6, rtol=0)
    assert cache["layers.1.attn.hook_z"].shape == (2, 4, 2, 16)  # (images, patches, head, d_head)

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    with headscope.model_hooks(model, {"layers.1.attn.hook_z": zero_head}, sites="vision"):
        hooked = model(**x).logits
    with headscope.ablate(model, heads=[(1, 1)], sites="vision"):
        ablated = model(**x).logits
    assert torch.equal(hooked, ablated)
    with pytest.raises(headscope.HeadscopeError, match="hook_result needs an adapter for the vision sites") as err:
        with headscope.model_hooks(model, {"layers.0.attn.hook_result": lambda r, hook: None}, sites="vision"):
            pass
    assert "\n" not in str(err.value)
    assert not route.routed_models()


@torch.no_grad()
def test_qwen2_5_vls_packed_vision_attention_is_refused_and_runs_right():
    """qwen2_5_vl's vision attention takes cu_seqlens and calls the attention function once per
    image or window (mask None, is_causal False): no single pattern per layer and forward pass,
    so its vision stack is refused in one line; captured by the text stack, the model's output
    (whose image features pass through headscope's kernel) is the default implementation's."""
    model = tiny_model("qwen2_5_vl", kind="composite")
    x = tiny_image_inputs("qwen2_5_vl")
    assert [s.layer for s in sites(model) if s.stack == "vision"] == [0, 1]
    for enter in (lambda: headscope.capture(model, sites="vision"),
                  lambda: headscope.ablate(model, heads=[(0, 0)], sites="vision"),
                  lambda: headscope.model_hooks(model, {"layers.0.attn.hook_z": lambda z, hook: z}, sites="vision")):
        with pytest.raises(headscope.HeadscopeError, match="runs the attention function once per image or window") as err:
            with enter():
                pass
        assert "\n" not in str(err.value)
    valid = x["attention_mask"].bool()
    before = model(**x).logits
    with headscope.capture(model) as cap:
        captured = model(**x).logits
    assert (before - captured).abs()[valid].max() <= 1e-4
    assert sorted(cap.patterns) == [0, 1, 2]
    assert not route.routed_models()


@pytest.mark.parametrize("family", FAMILIES + ("qwen2_5_vl",))
def test_family_table_lists_the_vision_stack_where_it_works(family):
    from headscope.hf.families import family_table

    model = _model(family)
    row = next(r for r in family_table() if r.model_type == family)
    groups = row.sites.split(", ")
    assert groups[0] == "text" and set(groups) <= set(group_names(sites(model)))
    assert ("vision" in groups) == (family != "qwen2_5_vl")
