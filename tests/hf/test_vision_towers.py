"""Vision-language models' vision towers as the opt-in "vision" stack (gemma3's SigLIP, llava's
CLIP, mllama's local and global vision transformers, qwen2_5_vl's windowed one, Qwen3.5's packed one
without windows, Gemma 4's; tiny random-init models with one 28-pixel image per example, qwen2_5_vl's
and Qwen3.5's of 4 x 6 patches, Gemma 4's of 18 patches on a 6 x 3 grid, tests/support/tiny.py):
the default stays the text decoder; with `sites="vision"` headscope inside the model changes
nothing, its patterns are the modules' own eager weights (bidirectional), every vision site that
ran is captured, ablation equals zeroing the head's slice of the output projection's input and
restores the model, and a tower that never ran (text alone) is reported and refused.
qwen2_5_vl's vision attention runs once per image or window (cu_seqlens) over one packed
sequence of patches: its map per layer is the eager weights of those calls placed along the
diagonal by the module's own cu_seqlens, in its window order (mapped back to the input order,
exactly the patches of one window see each other), and only hook_z among the hook points is offered;
Qwen3.5's (qwen3_5, qwen3_5_moe) runs the same way once per image, in input order. Gemma 4's tower
rotates each head's two halves by the patch's x and y: from_hf reorders the q/k dims into one
rotate-half layout, and a wrong reading of it (or of Qwen3.5's rotary) fails verify by far."""
import pytest
import torch
import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as modeling_qwen2_5_vl
import transformers.models.glm4v.modeling_glm4v as modeling_glm4v
import transformers.models.glm4v_moe.modeling_glm4v_moe as modeling_glm4v_moe
import transformers.models.qwen2_vl.modeling_qwen2_vl as modeling_qwen2_vl
import transformers.models.qwen3_5.modeling_qwen3_5 as modeling_qwen3_5
import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as modeling_qwen3_5_moe
import transformers.models.qwen3_vl.modeling_qwen3_vl as modeling_qwen3_vl
import transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe as modeling_qwen3_vl_moe
from transformers import AutoModelForImageTextToText
from transformers.vision_utils import get_vision_window_index

import headscope
from headscope.attention.module import MultiHeadAttention
from headscope.hf import adapters, route
from headscope.hf.from_hf import rotary_tables
from headscope.hf.adapter_spec import Rotary
from headscope.hf.sites import group_names, select, sites, vision_tower
from tests.support.contracts import eager_weights, head_zeroed_at, run_eager, with_adapter_changed
from tests.support.tiny import tiny_config, tiny_image_inputs, tiny_inputs, tiny_mllama, tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = ("gemma3", "llava", "llava_next", "llava_onevision", "internvl", "lfm2_vl", "cohere2_vision", "paligemma",
            "aya_vision", "vipllava", "mistral3", "idefics3", "smolvlm", "mllama", "qwen2_5_vl", "qwen2_vl", "qwen3_5",
            "qwen3_5_moe", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe", "gemma4")
DENSE = ("gemma3", "llava", "llava_next", "llava_onevision", "internvl", "lfm2_vl", "cohere2_vision", "paligemma", "aya_vision", "vipllava", "mistral3", "idefics3", "smolvlm", "mllama", "gemma4")  # one call of the attention function per layer and forward pass
PACKED = ("qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe")  # one call per image or window (cu_seqlens)
OUT = {"gemma3": "out_proj", "llava": "out_proj", "llava_next": "out_proj", "llava_onevision": "out_proj",
       "internvl": "projection_layer", "lfm2_vl": "out_proj", "cohere2_vision": "out_proj",
       "paligemma": "out_proj", "aya_vision": "out_proj",
       "vipllava": "out_proj", "mistral3": "o_proj", "idefics3": "out_proj", "smolvlm": "out_proj", "mllama": "o_proj", "qwen2_5_vl": "proj", "qwen2_vl": "proj", "qwen3_5": "proj",
       "qwen3_5_moe": "proj", "qwen3_vl": "proj", "qwen3_vl_moe": "proj", "glm4v": "proj", "glm4v_moe": "proj",
       "gemma4": "o_proj"}  # inside the site
LAYERS = {"gemma3": [0, 1], "llava": [0, 1], "llava_next": [0, 1], "llava_onevision": [0, 1], "internvl": [0, 1],
          "lfm2_vl": [0, 1], "cohere2_vision": [0, 1], "paligemma": [0, 1], "aya_vision": [0, 1], "vipllava": [0, 1, 2],
          "mistral3": [0, 1], "idefics3": [0, 1], "smolvlm": [0, 1], "mllama": [0, 1, 2], "qwen2_5_vl": [0, 1], "qwen2_vl": [0, 1], "qwen3_5": [0, 1],
          "qwen3_5_moe": [0, 1], "qwen3_vl": [0, 1], "qwen3_vl_moe": [0, 1], "glm4v": [0, 1], "glm4v_moe": [0, 1],
          "gemma4": [0, 1]}  # mllama: 2 local, 1 global
# The layer each family's ablation removes a head of: the last, but llava's image features are its
# tower's penultimate hidden state (vision_feature_layer -2), so its last layer never reaches the text;
# qwen2_5_vl's windowed layer 0.
ABLATED = {"gemma3": 1, "llava": 0, "llava_next": 0, "llava_onevision": 1, "internvl": 1, "lfm2_vl": 1,
           "cohere2_vision": 1, "paligemma": 1, "aya_vision": 1, "vipllava": 2, "mistral3": 1, "idefics3": 1, "smolvlm": 1, "mllama": 2, "qwen2_5_vl": 0, "qwen2_vl": 1, "qwen3_5": 1, "qwen3_5_moe": 1, "qwen3_vl": 1,
           "qwen3_vl_moe": 1, "glm4v": 1, "glm4v_moe": 1, "gemma4": 1}
# Each packed tower's pieces per layer (cu_seqlens over both images' 48 patches): qwen2_5_vl's layer 0 two
# windows per image, its layer 1 and the other towers' layers the two images.
BOUNDS = {"qwen2_5_vl": {0: [0, 16, 24, 40, 48], 1: [0, 24, 48]}, "qwen2_vl": {0: [0, 24, 48], 1: [0, 24, 48]},
          "qwen3_5": {0: [0, 24, 48], 1: [0, 24, 48]},
          "qwen3_5_moe": {0: [0, 24, 48], 1: [0, 24, 48]}, "qwen3_vl": {0: [0, 24, 48], 1: [0, 24, 48]},
          "qwen3_vl_moe": {0: [0, 24, 48], 1: [0, 24, 48]}, "glm4v": {0: [0, 24, 48], 1: [0, 24, 48]},
          "glm4v_moe": {0: [0, 24, 48], 1: [0, 24, 48]}}
MODELING = {"qwen2_5_vl": modeling_qwen2_5_vl, "qwen2_vl": modeling_qwen2_vl, "qwen3_5": modeling_qwen3_5,
            "qwen3_5_moe": modeling_qwen3_5_moe,
            "qwen3_vl": modeling_qwen3_vl, "qwen3_vl_moe": modeling_qwen3_vl_moe, "glm4v": modeling_glm4v,
            "glm4v_moe": modeling_glm4v_moe}
SCALE = {"gemma4": 1.0}  # the score scale where not d_head ** -0.5 (Gemma 4's scores are unscaled)


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


@pytest.mark.parametrize("family", DENSE)
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
        if family == "mistral3":  # both images' 4 patches in one sequence, each image's seeing only its own
            assert mine[:, :, 0, 3].min() > 0 and mine[:, :, :4, 4:].abs().max() == 0
        else:
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
    hook_result reads W_O through the tower's adapter: each head's result is its slice of the output
    projection's input (read there with a pre-hook) times W_O's columns, and they sum to the
    projection's output less its bias (read with a forward hook)."""
    model = _model("gemma3")
    x = tiny_image_inputs("gemma3")
    with headscope.capture(model, sites="vision") as cap:
        model(**x)
    with headscope.cache_activations(model, ["layers.*.attn.hook_pattern", "layers.1.attn.hook_z"],
                                     sites="vision") as cache:
        model(**x)
    torch.testing.assert_close(cache["layers.0.attn.hook_pattern"], cap.patterns[0], atol=1e-6, rtol=0)
    assert cache["layers.1.attn.hook_z"].shape == (2, 4, 2, 16)  # (images, patches, head, d_head)

    _assert_zeroing_hook_z_is_ablation(model, x, layer=1, head=1)
    out = model.get_submodule(select(model, "vision").sites[0].name).out_proj
    seen, results = {}, []
    handles = [out.register_forward_pre_hook(lambda module, args: seen.update(z=args[0])),
               out.register_forward_hook(lambda module, args, output: seen.update(out=output))]
    try:
        with headscope.model_hooks(model, {"layers.0.attn.hook_result": lambda r, hook: results.append(r)},
                                   sites="vision"):
            model(**x)
    finally:
        for handle in handles:
            handle.remove()
    result = results[0]
    assert result.shape == (2, 4, 2, 32)  # (images, patches, head, d_model)
    z = seen["z"].view(2, 4, 2, 16)
    for head in range(2):
        by_hand = z[:, :, head] @ out.weight[:, head * 16:(head + 1) * 16].T
        assert (result[:, :, head] - by_hand).abs().max() <= 1e-5
    assert (result.sum(dim=2) + out.bias - seen["out"]).abs().max() <= 1e-5
    assert not route.routed_models()


def _qwen(family="qwen2_5_vl"):
    return tiny_model(family, kind="composite"), tiny_image_inputs(family)


def _eager_packed_patterns(model, x, monkeypatch, family="qwen2_5_vl") -> tuple[dict, dict]:
    """A packed tower's vision maps built without headscope, and each layer's cu_seqlens: the model
    on eager attention, transformers' eager attention function (the family's modeling file's)
    wrapped to keep the weights
    `[1, head, n, n]` of each call by a vision module, a forward pre-hook on each module keeping
    the cu_seqlens it is given; call i's weights placed at rows and columns
    [cu_seqlens[i], cu_seqlens[i + 1]) of a zero map."""
    modules = {layer: model.get_submodule(site.name) for layer, site in select(model, "vision").sites.items()}
    layer_of = {id(module): layer for layer, module in modules.items()}
    weights, bounds = {layer: [] for layer in modules}, {}
    modeling = MODELING[family]
    eager = modeling.eager_attention_forward

    def keeping(module, *args, **kwargs):
        out, w = eager(module, *args, **kwargs)
        if id(module) in layer_of:
            weights[layer_of[id(module)]].append(w)
        return out, w

    def keep_bounds(layer):
        def hook(module, args, kwargs):
            bounds[layer] = kwargs["cu_seqlens"].tolist()
        return hook

    monkeypatch.setattr(modeling, "eager_attention_forward", keeping)
    handles = [module.register_forward_pre_hook(keep_bounds(layer), with_kwargs=True)
               for layer, module in modules.items()]
    run_eager(model, x, handles)
    maps = {}
    for layer, pieces in weights.items():
        edges = bounds[layer]
        assert len(pieces) == len(edges) - 1
        joined = torch.zeros(1, 2, edges[-1], edges[-1])
        for piece, start, end in zip(pieces, edges, edges[1:]):
            assert piece.shape == (1, 2, end - start, end - start)
            joined[..., start:end, start:end] = piece
        maps[layer] = joined
    return maps, bounds


@pytest.mark.parametrize("family", PACKED)
@torch.no_grad()
def test_packed_vision_attention_is_captured_block_diagonally(family, monkeypatch):
    """One map per layer and forward pass, `[1, head, patch, patch]` over both images' 48 patches:
    the eager weights of the layer's calls (qwen2_5_vl: 4 windows in layer 0, the 2 images in layer
    1; Qwen3.5: the 2 images in both) along the diagonal, zero between them; the model's output
    (image features through headscope's kernel) is the default implementation's."""
    model, x = _qwen(family)
    assert select(model, "vision").packed == frozenset({0, 1}) and select(model).packed == frozenset()
    valid = x["attention_mask"].bool()
    before = model(**x).logits
    with headscope.capture(model, sites="vision") as cap:
        captured = model(**x).logits
    assert (before - captured).abs()[valid].max() <= 1e-4
    assert sorted(cap.patterns) == [0, 1] and cap.not_run == []
    eager, bounds = _eager_packed_patterns(model, x, monkeypatch, family)
    assert bounds == BOUNDS[family]
    for layer, edges in bounds.items():
        mine = cap.patterns[layer]
        assert mine.shape == eager[layer].shape == (1, 2, 48, 48)
        assert (mine - eager[layer]).abs().max() <= 1e-5
        assert (mine.sum(dim=-1) - 1).abs().max() <= 1e-5
        on_blocks = torch.zeros(48, 48, dtype=torch.bool)
        for start, end in zip(edges, edges[1:]):
            on_blocks[start:end, start:end] = True
        assert torch.equal(mine[..., ~on_blocks], torch.zeros_like(mine[..., ~on_blocks]))
        assert mine[..., on_blocks].min() > 0
    assert not route.routed_models()


@torch.no_grad()
def test_qwen2_5_vls_map_in_input_order_joins_exactly_the_patches_of_a_window():
    """The documented way back from the module's window order (headscope.hf.sites): map position
    i is input patch window_index[i // 4] * 4 + i % 4. In input order (per image, merge units of
    2 x 2 patches row by row over a 2 x 3 grid), layer 0's patches see exactly those of their
    window (2 x 2 units: columns 0-1 and column 2), layer 1's those of their image."""
    model, x = _qwen()
    with headscope.capture(model, sites="vision") as cap:
        model(**x)
    config = model.config.vision_config
    window_index, _ = get_vision_window_index(x["image_grid_thw"], config.spatial_merge_size, config.window_size,
                                              config.patch_size)
    unit = config.spatial_merge_size ** 2
    back = torch.argsort((window_index[:, None] * unit + torch.arange(unit)).flatten())
    patch = torch.arange(48)
    image, column = patch // 24, (patch % 24) // unit % 3
    window = image * 2 + column // 2
    for layer, group in ((0, window), (1, image)):
        in_input_order = cap.patterns[layer][..., back, :][..., back]
        assert torch.equal(in_input_order[0] > 0, (group[:, None] == group[None, :]).expand(2, -1, -1))


@pytest.mark.parametrize("family", PACKED)
@torch.no_grad()
def test_packed_vision_hooks_offer_hook_z_and_refuse_the_pieces(family):
    """hook_z is the output projection's whole input `[1, patch, head, d_head]` (read there with a
    pre-hook as the reference); zeroing a head in it is ablation; the points each call sees one
    image or window of (q, k, v, scores, pattern) and lazy or head-group capture are refused in one line."""
    model, x = _qwen(family)
    proj = model.get_submodule(select(model, "vision").sites[0].name).proj
    seen = []
    handle = proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        model(**x)
    finally:
        handle.remove()
    with headscope.cache_activations(model, ["layers.0.attn.hook_z"], sites="vision") as cache:
        model(**x)
    z = cache["layers.0.attn.hook_z"]
    assert z.shape == (1, 48, 2, 16)
    assert (z[0].flatten(1) - seen[0]).abs().max() <= 1e-5

    _assert_zeroing_hook_z_is_ablation(model, x, layer=0, head=1)
    for point in ("hook_q", "hook_pattern"):
        with pytest.raises(headscope.HeadscopeError, match=f"{point} at the vision sites would see one image") as err:
            with headscope.model_hooks(model, {f"layers.0.attn.{point}": lambda v, hook: None}, sites="vision"):
                pass
        assert "\n" not in str(err.value)
    for options in (dict(lazy=True), dict(chunk_heads=1)):
        with pytest.raises(headscope.HeadscopeError, match="run attention once per image or window") as err:
            with headscope.capture(model, sites="vision", reduce=lambda layer, p, mask: p, **options):
                pass
        assert "\n" not in str(err.value)
    assert not route.routed_models()


class _LazyWatcher(route.Session):
    """A session taking lazy patterns of the packed vision layers, past capture's own refusal."""

    def __init__(self, layer_of):
        self.layer_of = layer_of

    def wants_pattern(self, layer):
        return True

    def takes_lazy(self, layer):
        return True


@torch.no_grad()
def test_the_kernel_refuses_piecewise_reading_of_a_packed_layer_in_one_line():
    model, x = _qwen()
    with pytest.raises(headscope.HeadscopeError, match="runs the attention function once per image or window") as err:
        with route.routed(model, _LazyWatcher(route.layer_map(model, "vision"))):
            model(**x)
    assert "\n" not in str(err.value)
    assert not route.routed_models() and not route._PIECES


@pytest.mark.parametrize("family", FAMILIES)
def test_family_table_lists_the_vision_stack_where_it_works(family):
    from headscope.hf.families import family_table

    model = _model(family)
    row = next(r for r in family_table() if r.model_type == family)
    groups = row.sites.split(", ")
    assert groups[0] == "text" and set(groups) <= set(group_names(sites(model)))
    assert "vision" in groups


# from_hf and verify at the vision sites: each tower's adapter (headscope.hf.adapters.VISION_ADAPTERS).


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_verify_of_the_vision_tower_agrees_on_every_layer(family):
    """One row per vision layer, named by its module path; outputs within 1e-4 of the module's own
    output projection, patterns within 1e-5 of its eager weights (qwen2_5_vl: its calls' weights
    joined along the diagonal)."""
    model = _model(family)
    table = headscope.verify(model, tiny_image_inputs(family), sites="vision")
    chosen = select(model, "vision")
    assert table["layer"].tolist() == LAYERS[family]
    assert table["site"].tolist() == [chosen.sites[layer].name for layer in LAYERS[family]]
    assert table["max_abs_diff_output"].max() <= 1e-4
    assert table["max_abs_diff_pattern"].max() <= 1e-5
    assert not route.routed_models()


def _seen_by(module, model, x) -> tuple[dict, object]:
    """What `module` received (its forward's keyword inputs, hidden states first) and returned on
    the model's eager path, read with a forward pre-hook and a forward hook."""
    seen = {}

    def keep_inputs(module, args, kwargs):
        seen["received"] = dict(zip(("hidden_states",), args), **kwargs)

    def keep_output(module, args, output):
        seen["returned"] = output

    run_eager(model, x, [module.register_forward_pre_hook(keep_inputs, with_kwargs=True),
                         module.register_forward_hook(keep_output)])
    return seen["received"], seen["returned"]


@pytest.mark.parametrize("family", DENSE)
@torch.no_grad()
def test_from_hf_fed_a_vision_layers_inputs_reproduces_its_output_and_eager_weights(family):
    """The last vision layer's module: its hidden states and mask (mllama's aspect-ratio mask; none
    for SigLIP and CLIP; Gemma 4's of the patches, and its rotary tables with their dims in the order
    from_hf gave q and k) fed to the headscope module give its output and its eager weights."""
    model = _model(family)
    x = tiny_image_inputs(family)
    layer = LAYERS[family][-1]
    module = model.get_submodule(select(model, "vision").sites[layer].name)
    mine = MultiHeadAttention.from_hf(module, model.config)
    assert (mine.config.d_model, mine.n_heads, mine.config.d_head, mine.config.causal) == (32, 2, 16, False)
    assert mine.config.scale == pytest.approx(SCALE.get(family, 0.25))
    received, (output, weights) = _seen_by(module, model, x)
    rotary = rotary_tables(mine, model.config, received.get("position_embeddings"), module)
    out, pattern = mine(received["hidden_states"], received.get("attention_mask"), rotary=rotary, return_pattern=True)
    assert out.shape == output.shape and (out - output).abs().max() <= 1e-4
    assert pattern.shape == weights.shape and (pattern - weights).abs().max() <= 1e-5


@pytest.mark.parametrize("family", PACKED)
@torch.no_grad()
def test_from_hf_fed_a_packed_layer_reproduces_its_output_and_eager_weights(family, monkeypatch):
    """Layer 0 (qwen2_5_vl's windowed one): the module's packed hidden states `[48, 32]` as a batch of
    one, the rotary tables the tower passed, and a mask built here from its cu_seqlens (patches
    attend within their window or image) give its output, and the eager weights of its calls placed
    along the diagonal."""
    model, x = _qwen(family)
    module = model.get_submodule(select(model, "vision").sites[0].name)
    mine = MultiHeadAttention.from_hf(module, model.config)
    assert (mine.config.d_model, mine.n_heads, mine.config.rotary_dim, mine.config.causal) == (32, 2, 16, False)
    received, output = _seen_by(module, model, x)
    edges = received["cu_seqlens"].tolist()
    allowed = torch.zeros(48, 48, dtype=torch.bool)
    for start, end in zip(edges, edges[1:]):
        allowed[start:end, start:end] = True
    out, pattern = mine(received["hidden_states"][None], allowed[None, None], rotary=received["position_embeddings"],
                        return_pattern=True)
    assert (out[0] - output).abs().max() <= 1e-4
    eager, _ = _eager_packed_patterns(model, x, monkeypatch, family)
    assert (pattern - eager[0]).abs().max() <= 1e-5


@torch.no_grad()
def test_vision_from_hf_and_verify_refuse_in_one_line_without_the_towers_adapter(monkeypatch):
    """A tower no vision adapter describes has no blocks: verify refuses, naming the sites, and
    hook_result too; hook_result is refused at qwen2_5_vl's packed layers (one sequence of patches)."""
    model = _model("gemma3")
    monkeypatch.setattr(adapters, "VISION_ADAPTERS", ())
    assert select(model, "vision").blocks == {}
    for call in (lambda: headscope.verify(model, tiny_image_inputs("gemma3"), sites="vision"),
                 lambda: headscope.model_hooks(model, {"layers.0.attn.hook_result": lambda r, hook: None},
                                               sites="vision").__enter__()):
        with pytest.raises(headscope.HeadscopeError, match="needs an adapter for the vision sites|'vision' sites "
                                                           "have none") as err:
            call()
        assert "\n" not in str(err.value)
    monkeypatch.undo()
    model, x = _qwen()
    with pytest.raises(headscope.HeadscopeError, match="hook_result is not offered at the packed vision sites") as err:
        with headscope.model_hooks(model, {"layers.0.attn.hook_result": lambda r, hook: None}, sites="vision"):
            pass
    assert "\n" not in str(err.value)
    assert not route.routed_models()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_table_says_where_vision_from_hf_and_verify_work(family):
    """The tower's model type in the table is the model's own, and its note names it."""
    from headscope.hf.families import VISION_TOWERS, family_table

    model = _model(family)
    assert VISION_TOWERS[family] == model.config.vision_config.model_type
    assert adapters.vision_adapter_for(model.config) is not None
    row = next(r for r in family_table() if r.model_type == family)
    assert f'from_hf/verify at sites="vision" through its tower\'s adapter ({VISION_TOWERS[family]}' in row.notes


def _assert_zeroing_hook_z_is_ablation(model, x, layer, head):
    """Zeroing a vision head through hook_z gives exactly `ablate`'s logits."""
    def zero_head(z, hook):
        z = z.clone()
        z[:, :, head] = 0
        return z

    with headscope.model_hooks(model, {f"layers.{layer}.attn.hook_z": zero_head}, sites="vision"):
        hooked = model(**x).logits
    with headscope.ablate(model, heads=[(layer, head)], sites="vision"):
        ablated = model(**x).logits
    assert torch.equal(hooked, ablated)


@pytest.mark.parametrize("family, change", [("gemma4", dict(rotary=Rotary())), ("gemma4", dict(rotary=None)),
                                            ("qwen3_5", dict(rotary=None)), ("internvl", dict(qk_norm=None))])
@torch.no_grad()
def test_a_vision_adapter_read_wrongly_fails_verify_by_far(family, change, monkeypatch):
    """Gemma 4's rotary read as one rotate-half layout over the head (its two halves not told apart),
    either tower's rotary left out, or InternVL's q/k norms over all heads' features: verify's patterns
    are off by far more than its tolerance."""
    model, x = _model(family), tiny_image_inputs(family)
    assert headscope.verify(model, x, sites="vision")["max_abs_diff_pattern"].max() <= 1e-5
    with_adapter_changed(monkeypatch, model, vision=True, **change)
    assert headscope.verify(model, x, sites="vision")["max_abs_diff_pattern"].max() > 1e-2


@torch.no_grad()
def test_gemma4s_from_hf_module_holds_each_heads_q_in_one_rotate_half_layout():
    """What the adapter's notes say: the headscope module's hook_q (layer 0, fed the layer's own
    inputs) is the model's rotated query (read in the model with cache_activations) with each head's
    dims in the order [x part's first half, y part's first half, x's second half, y's second half]."""
    model, x = _model("gemma4"), tiny_image_inputs("gemma4")
    module = model.get_submodule(select(model, "vision").sites[0].name)
    mine = MultiHeadAttention.from_hf(module, model.config)
    with headscope.cache_activations(model, ["layers.0.attn.hook_q"], sites="vision") as cache:
        model(**x)
    theirs = cache["layers.0.attn.hook_q"]  # (images, head, patch, d_head)
    received, _ = _seen_by(module, model, x)
    seen = []
    with mine.hooks({"hook_q": lambda q, hook: seen.append(q)}):
        mine(received["hidden_states"], received.get("attention_mask"),
             rotary=rotary_tables(mine, model.config, received["position_embeddings"], module))
    order = torch.cat([torch.arange(0, 4), torch.arange(8, 12), torch.arange(4, 8), torch.arange(12, 16)])
    assert seen[0].shape == theirs.shape == (2, 2, 18, 16)
    assert (seen[0] - theirs[..., order]).abs().max() <= 1e-5
    assert (seen[0] - theirs).abs().max() > 1e-2  # the order matters


@torch.no_grad()
def test_gemma4s_clipped_projections_are_refused_by_from_hf_and_kept_by_capture():
    """With use_clipped_linears the tower's projections clamp their inputs and outputs (bounds set
    here, tight enough to cut): from_hf and verify refuse in one line, capture still gives the
    modules' own eager weights and changes no output, and ablation is still zeroing the head's
    slice of o_proj's input."""
    config = tiny_config("gemma4", kind="composite")
    config.vision_config.use_clipped_linears = True
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()  # tiny_model's, with clamps (no gates to fill)
    for name, buffer in model.named_buffers():
        if name.endswith(("input_min", "output_min", "input_max", "output_max")) and "vision_tower" in name:
            buffer.fill_(-0.5 if name.endswith("min") else 0.5)
    x = tiny_image_inputs("gemma4")
    module = model.get_submodule(select(model, "vision").sites[1].name)
    for call in (lambda: MultiHeadAttention.from_hf(module, model.config),
                 lambda: headscope.verify(model, x, sites="vision")):
        with pytest.raises(headscope.HeadscopeError, match="use_clipped_linears") as err:
            call()
        assert "\n" not in str(err.value)
    unclamped = []
    handle = module.q_proj.register_forward_pre_hook(lambda m, args: unclamped.append(args[0].abs().max()))
    try:
        before = model(**x).logits
    finally:
        handle.remove()
    assert unclamped[0] > 0.5  # the clamp of q_proj's input cuts
    with headscope.capture(model, sites="vision") as cap:
        assert (model(**x).logits - before).abs().max() <= 1e-4
    eager = _eager_vision_patterns(model, x)
    assert max((cap.patterns[layer] - eager[layer]).abs().max() for layer in (0, 1)) <= 1e-5
    with headscope.ablate(model, heads=[(1, 1)], sites="vision"):
        ablated = model(**x).logits
    with head_zeroed_at(module.o_proj, 1, 2):
        reference = model(**x).logits
    assert (ablated - before).abs().max() > 1e-3 and (ablated - reference).abs().max() <= 1e-4
    assert not route.routed_models()


@torch.no_grad()
def test_gemma4s_tower_with_fewer_key_value_heads_verifies():
    """Its two query heads sharing one key/value head (num_key_value_heads 1): from_hf reads the sizes
    from the module (head_dim, num_key_value_groups) and reorders the one key head's dims; verify agrees."""
    config = tiny_config("gemma4", kind="composite")
    config.vision_config.num_key_value_heads = 1
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    module = model.get_submodule(select(model, "vision").sites[0].name)
    mine = MultiHeadAttention.from_hf(module, model.config)
    assert (mine.n_heads, mine.config.n_kv_heads, mine.config.d_head) == (2, 1, 16)
    table = headscope.verify(model, tiny_image_inputs("gemma4"), sites="vision")
    assert table["max_abs_diff_output"].max() <= 1e-4 and table["max_abs_diff_pattern"].max() <= 1e-5
