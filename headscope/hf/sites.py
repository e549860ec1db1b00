"""Attention sites: every module of a model that calls transformers' attention interface, named.

A site is one such module, `Site(name, kind, stack, layer)`: its path in the model
(`model.decoder.layers.3.encoder_attn`), its kind and stack, and the model's own index of its
layer within the stack. Kinds: "self" (queries, keys and values from the stack's own states) and
"cross" (queries from the stack, keys and values from another input: the encoder's output, an
image). Stacks:
    text     the single stack of a decoder-only or encoder-only model, or the language model of a
             vision-language model
    encoder  an encoder-decoder's encoder (bart, whisper, t5), bidirectional self-attention
    decoder  an encoder-decoder's decoder: causal self-attention and cross-attention in every layer
    vision   a vision-language model's vision tower (the module holding `config.vision_config`:
             gemma3's SigLIP and llava's CLIP `model.vision_tower`, mllama's `model.vision_model`),
             bidirectional self-attention over the image's patches; opt-in (`sites="vision"`),
             found by what its modules do (they call the interface) and numbered in the order
             the tower runs them (mllama: its local transformer's layers, then its global ones)
A vision tower whose attention takes `cu_seqlens` (qwen2_5_vl's, Qwen3.5's, Qwen3-VL's) is *packed*: every image's patches
form one sequence, and the module calls the attention function once per packed piece (an image, or
a window of patches in the windowed layers). `headscope.hf.route` joins those calls into one
block-diagonal pattern per layer and forward pass (`[1, head, patch, patch]`, zero between pieces:
the attention the layer computed) and edits z at the output projection's input, the whole layer at
once. The patches are in the order the module sees them, qwen2_5_vl's internal window order: its
tower regroups the merge units (`unit = spatial_merge_size ** 2` consecutive patches) by
`window_index` (transformers' `vision_utils.get_vision_window_index(grid_thw, ...)`), so map
position `i` is input patch `window_index[i // unit] * unit + i % unit`; indexing both patch axes
by `torch.argsort` of those numbers gives the map in input order (Qwen3.5's tower has no windows:
its pieces are the images, its order the input's). Packed modules whose output
projection `_PACKED_OUT` does not name are refused by `select` in one line.

A group of sites is named "STACK" or "STACK.KIND" ("encoder", "decoder.self", "decoder.cross");
it must hold at most one site per layer, so "decoder" alone is refused. `capture`, `ablate`,
`model_hooks`, `cache_activations` and `patch` address one group through their `sites=`
argument, and their layer ints are the layers of that group. `sites=None`, the default, is the
analysed stack as it always was: the text stack, or an encoder-decoder's encoder (`Adapter.stack`).

- `sites(model)`: every site, in module order.
- `select(model, sites=None)`: the `Selection` a call addresses: by layer, its sites, the modules
  calling the interface, the attention blocks (with an adapter), the head count and the packed layers.
- `packed_cores(model)`: `[(module, output projection, heads)]` of every packed vision site.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..errors import HeadscopeError, UsageError
from .adapters import (_calls_interface, _sub, adapter_for, attention_blocks, core_modules, group_blocks, stack_counts,
                       vision_adapter_for)

if TYPE_CHECKING:  # torch is not imported by `import headscope`
    from torch import nn

__all__ = ["Site", "Selection", "STACKS", "KINDS", "sites", "select", "group_names", "vision_tower",
           "packed_cores"]

STACKS = ("text", "encoder", "decoder", "vision")
KINDS = ("self", "cross")
# Where vision-language models keep their vision tower, when no submodule holds `config.vision_config` itself.
_VISION_TOWERS = ("vision_tower", "visual", "vision_model")
# The output projection of a packed attention module (its child of this name; qwen2_5_vl's `proj`).
_PACKED_OUT = ("proj",)


@dataclass(frozen=True)
class Site:
    """One attention module of a model.

    Attributes:
        name: its module path in the model (`model.decoder.layers.3.encoder_attn`).
        kind: "self" or "cross".
        stack: "text", "encoder", "decoder" or "vision" (`STACKS`).
        layer: the model's index of its layer within the stack.
    """

    name: str
    kind: str
    stack: str
    layer: int

    @property
    def group(self) -> str:
        return f"{self.stack}.{self.kind}"


@dataclass(frozen=True)
class Selection:
    """The sites one call addresses, by layer.

    Attributes:
        group: what was asked for ("decoder.cross"; the default stack's name for `sites=None`).
        default: True for `sites=None` (messages then read as they always did).
        sites: `{layer: Site}`.
        cores: `{layer: module calling the attention interface}`.
        blocks: `{layer: attention block}` (holds the output projection; empty without an adapter;
            a vision tower's modules are their own blocks, by `VISION_ADAPTERS`).
        n_heads: query heads per site.
        packed: the layers whose module runs the attention function once per packed piece
            (module docstring): only hook_z among the hook points, and dense patterns only.
    """

    group: str
    default: bool
    sites: dict
    cores: dict
    blocks: dict
    n_heads: int
    packed: frozenset = frozenset()

    @property
    def layers(self) -> list[int]:
        return sorted(self.sites)

    @property
    def noun(self) -> str:
        """How messages name its layers: "layer", or "decoder.cross layer" outside the default."""
        return "layer" if self.default else f"{self.group} layer"


def _kind_of(core) -> str:
    """A discovered module is cross-attention when its forward takes `cross_attention_states`
    (mllama's text stack), else self-attention."""
    return "cross" if "cross_attention_states" in inspect.signature(type(core).forward).parameters else "self"


def _is_packed(core) -> bool:
    """A module whose forward takes `cu_seqlens` (qwen2_5_vl's vision attention) calls the
    attention function once per packed sequence (image or window), not once per forward pass."""
    return "cu_seqlens" in inspect.signature(type(core).forward).parameters


def _packed_out(core) -> Optional[nn.Module]:
    """A packed module's output projection, whose input `[patch, head * d_head]` is z."""
    return next((getattr(core, name) for name in _PACKED_OUT if hasattr(core, name)), None)


def vision_tower(model: nn.Module) -> Optional[nn.Module]:
    """A vision-language model's vision tower: the submodule holding `config.vision_config`
    (else `vision_tower`, `visual` or `vision_model` of the base model); None without one."""
    config = getattr(model.config, "vision_config", None)
    if config is None:
        return None
    held = next((m for m in model.modules() if m is not model and getattr(m, "config", None) is config), None)
    if held is not None:
        return held
    return next((getattr(model.base_model, name) for name in _VISION_TOWERS if hasattr(model.base_model, name)), None)


def _vision_sites(model: nn.Module, paths: dict) -> list[tuple[Site, Optional[nn.Module], nn.Module, int]]:
    """The vision tower's modules calling the interface, numbered 0.. in module order (the order
    gemma3's, llava's and mllama's towers run them); each is its own block where the tower has an
    adapter (`headscope.hf.adapters.VISION_ADAPTERS`), else there is none."""
    tower = vision_tower(model)
    if tower is None:
        return []
    cores = [m for m in tower.modules() if _calls_interface(type(m))]
    heads = getattr(model.config.vision_config, "num_attention_heads", None)
    described = vision_adapter_for(model.config) is not None
    return [(Site(paths[id(core)], _kind_of(core), "vision", layer), core if described else None, core,
             getattr(core, "num_heads", heads)) for layer, core in enumerate(cores)]


def packed_cores(model: nn.Module) -> list[tuple[nn.Module, nn.Module, int]]:
    """`[(module, output projection, heads)]` of the packed vision sites with a known output
    projection (module docstring); empty for every model without them."""
    tower = vision_tower(model)
    if tower is None:
        return []
    heads = getattr(model.config.vision_config, "num_attention_heads", None)
    packed = [m for m in tower.modules() if _calls_interface(type(m)) and _is_packed(m) and _packed_out(m) is not None]
    return [(core, _packed_out(core), getattr(core, "num_heads", heads)) for core in packed]


def _located(model: nn.Module) -> list[tuple[Site, Optional[nn.Module], nn.Module, int]]:
    """`[(site, block or None, core, n_heads)]` for every site, in module order."""
    paths = {id(m): name for name, m in model.named_modules()}
    order = {name: i for i, name in enumerate(paths.values())}
    adapter = adapter_for(model.config)
    cores = core_modules(model)  # refuses, in one line, a model without attention or with it out of place
    n_heads = stack_counts(model.config)[1]  # the default stack's (BartForCausalLM: its decoder's)
    found = _vision_sites(model, paths)
    if adapter is None:  # discovered in the text stack: one per layer, the kind read from the module
        for layer, core in cores:
            found.append((Site(paths[id(core)], _kind_of(core), "text", layer), None, core, n_heads))
        return sorted(found, key=lambda item: order[item[0].name])
    for layer, block in attention_blocks(model):
        core = _sub(block, adapter.core)
        found.append((Site(paths[id(core)], "self", adapter.stack, layer), block, core, n_heads))
    for group in adapter.groups:  # none where the model lacks the stack (T5EncoderModel has no decoder)
        heads = getattr(model.config, group.heads) if group.heads else n_heads
        for layer, block in group_blocks(model, group):  # mllama's: only its cross-attention layers
            core = _sub(block, adapter.core)
            found.append((Site(paths[id(core)], group.kind, group.stack, layer), block, core, heads))
    return sorted(found, key=lambda item: order[item[0].name])


def sites(model: nn.Module) -> list[Site]:
    """Every attention site of `model`, in module order.

    Args:
        model: a transformers model headscope runs inside.
    Returns:
        `[Site]`; an encoder-decoder with an adapter lists its encoder's self-attention and its
        decoder's self- and cross-attention, a vision-language model its vision tower's too.
    """
    return [site for site, *_ in _located(model)]


def group_names(found: list[Site]) -> list[str]:
    """The groups `found` holds, in order: each "STACK.KIND", plus "STACK" where one site per layer."""
    names = []
    for site in found:
        if site.group not in names:
            names.append(site.group)
    stacks = {s.stack for s in found}
    whole = [stack for stack in STACKS if stack in stacks
             and len({s.layer for s in found if s.stack == stack}) == sum(s.stack == stack for s in found)]
    return whole + names


def select(model: nn.Module, sites: Optional[str] = None) -> Selection:
    """The sites `sites` names in `model` ("decoder.cross"; None: the analysed stack).

    Args:
        model: a transformers model headscope runs inside.
        sites: "STACK" or "STACK.KIND" (module docstring), or None for the default stack.
    Returns:
        A `Selection`; HeadscopeError in one line for a group the model lacks or one with two
        sites in a layer.
    """
    located = _located(model)
    if not located:
        raise HeadscopeError(f"{type(model).__name__} has no attention site")
    default = sites is None
    if default:
        adapter = adapter_for(model.config)
        sites = (adapter.default_sites or adapter.stack) if adapter is not None else "text"
    if not isinstance(sites, str):
        raise HeadscopeError(f"sites must name a group such as 'decoder.cross', got {sites!r}")
    stack, _, kind = sites.partition(".")
    chosen = [item for item in located if item[0].stack == stack and (not kind or item[0].kind == kind)]
    available = ", ".join(group_names([item[0] for item in located]))
    if not chosen:
        raise UsageError(f"{type(model).__name__} has no {sites!r} attention sites; it has: {available}")
    unknown = next((core for _, _, core, _ in chosen if _is_packed(core) and _packed_out(core) is None), None)
    if unknown is not None:
        raise HeadscopeError(f"{type(unknown).__name__} runs the attention function once per image or window "
                             f"(cu_seqlens) and headscope does not know its output projection, so its {sites!r} sites "
                             f"are not captured or edited (they run untouched under the other groups)")
    by_layer = {item[0].layer: item for item in chosen}
    if len(by_layer) < len(chosen):
        raise HeadscopeError(f"{sites!r} holds several attention sites per layer; choose one kind ({available})")
    return Selection(group=sites, default=default, sites={l: item[0] for l, item in by_layer.items()},
                     cores={l: item[2] for l, item in by_layer.items()},
                     blocks={l: item[1] for l, item in by_layer.items() if item[1] is not None},
                     n_heads=chosen[0][3],
                     packed=frozenset(l for l, item in by_layer.items() if _is_packed(item[2])))
