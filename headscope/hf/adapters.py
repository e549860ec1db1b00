"""Declarative adapters from Hugging Face architectures to headscope's canonical names.

Each family is one `Adapter` (`headscope.hf.adapter_spec`), a row of `ADAPTERS` in
`headscope.hf.adapter_table` (re-exported here): where the layers are, which submodule is the
attention block (what `MultiHeadAttention.from_hf` takes), which part of it calls transformers'
attention interface, how q/k/v/o weights are laid out, and the extras its attention computes
(rotary layout, q/k norms, clipping, soft-capping, sinks, latents). This module reads the table;
shared code never branches on an architecture name.

Capture, ablation and analysis need no adapter: in a model of another family, the modules whose
`forward` calls the attention interface are found by what they do (`discovered_cores`).

- `adapter_for(config)`: the adapter of a model's family, or None.
- `family_of(config)`: the adapter's family name, else the config's model type.
- `attention_blocks(model)`: `[(layer, block)]` for every layer of the default sites (needs an adapter).
- `AudioEncoder`: where a family's encoder reads log-mel features instead of tokens (Whisper's),
  the sizes it takes read from the config.
- `SiteGroup`: a family's other attention sites (an encoder-decoder's decoder self- and
  cross-attention); `headscope.hf.sites` lists them all and selects a group.
- `core_modules(model)`: `[(layer, module calling the attention interface)]`, layers numbered as
  the model numbers them (a hybrid's attention-free layers have none).
- `group_blocks(model, group)`: `[(layer, block)]` of a `SiteGroup`, layers without its block skipped.
- `analysed_body(model)`: the module analyze runs on token ids (the text stack, or the adapter's
  `body` inside it: T5's encoder).
- `text_config(config)`: the config of a model's text decoder (a composite config's
  `text_config`, else the config itself); `text_stack(model)`: the module it belongs to.
- `z_at_out(model)`: the output projections whose input is z (a norm mixes heads before them, or
  an output gate scales z after the attention function).
- `check_on_interface(model_class, model_type)`: the one-line refusal for models that bypass it.
- `VISION_ADAPTERS`, `vision_adapter_for(config)`: vision towers' attention, by
  `config.vision_config.model_type`; `block_adapter(config, block)`: the adapter describing an
  attention block and the config holding its sizes (the vision tower's or the text decoder's).
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Optional

from ..errors import HeadscopeError
from .adapter_spec import Adapter, AudioEncoder, Latent, LoRA, QKNorm, Rotary, SiteGroup, Temperature
from .adapter_table import ADAPTERS, VISION_ADAPTERS

if TYPE_CHECKING:  # torch is not imported by `import headscope`
    from torch import nn

__all__ = ["Adapter", "AudioEncoder", "SiteGroup", "Rotary", "QKNorm", "LoRA", "Latent", "Temperature", "ADAPTERS", "adapter_for", "family_of", "attention_blocks", "core_modules",
           "discovered_cores", "group_blocks", "stack_counts", "analysed_body", "check_on_interface", "out_projection", "z_at_out", "head_sizes", "config_value", "supported_families", "text_config",
           "text_stack", "VISION_ADAPTERS", "vision_adapter_for", "block_adapter"]


def supported_families() -> str:
    """One line naming the model types with an adapter."""
    return ", ".join(t for a in ADAPTERS for t in a.model_types)


def adapter_for(config) -> Optional[Adapter]:
    """The adapter for a model config, or None when its family has none; a vision-language
    model's is its text decoder's (llava's text_config is a llama config)."""
    types = (getattr(config, "model_type", None), getattr(text_config(config), "model_type", None))
    matches = [a for model_type in types for a in ADAPTERS if model_type in a.model_types]
    alone = getattr(config, "is_encoder_decoder", None) is False  # BartForCausalLM's config says so
    return next((a for a in matches if a.decoder_only == alone), matches[0] if matches else None)


def family_of(config) -> str:
    adapter = adapter_for(config)
    return adapter.family if adapter is not None else str(getattr(config, "model_type", "?"))


def _needs_adapter(config) -> Adapter:
    adapter = adapter_for(config)
    if adapter is None:
        raise HeadscopeError(
            f"architecture {getattr(config, 'model_type', None)!r} has no headscope adapter, which from_hf and verify "
            f"need (capture, ablate and analyze work without one); adapters: {supported_families()}"
        )
    return adapter


def check_on_interface(model_class: type, model_type: str) -> None:
    """HeadscopeError naming the reason when a model class's attention bypasses the interface."""
    if not model_class._can_set_attn_implementation():
        raise HeadscopeError(
            f"{model_class.__name__} ({model_type}) does not send attention through transformers' attention interface "
            f"(_can_set_attn_implementation() is False), so headscope cannot run inside it"
        )


def _sub(module: nn.Module, path: str) -> nn.Module:
    return module.get_submodule(path) if path else module


def attention_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """`[(layer index, attention block)]` for every layer of a Hugging Face model with an adapter
    (of its text decoder, for a vision-language model); a hybrid's attention layers only, under
    the model's own numbers (`Adapter.hybrid`)."""
    adapter = _needs_adapter(model.config)
    layers = _sub(text_stack(model), adapter.layers)
    if not adapter.hybrid:
        return [(i, _sub(layer, adapter.block)) for i, layer in enumerate(layers)]
    found = []  # a hybrid's layers without attention (Mamba, convolutions) have no block, or another mixer there
    for i, layer in enumerate(layers):
        try:
            block = _sub(layer, adapter.block)
        except AttributeError:
            continue
        if _calls_interface(type(_sub(block, adapter.core))):
            found.append((i, block))
    return found


def group_blocks(model: nn.Module, group: SiteGroup) -> list[tuple[int, nn.Module]]:
    """`[(layer index, attention block)]` of a site group, under the model's layer numbers; layers
    without the group's block are skipped (mllama's self-attention layers have no `cross_attn`), and
    a model without the group's stack has none (T5EncoderModel has no decoder)."""
    try:
        layers = _sub(text_stack(model), group.layers)
    except AttributeError:
        return []
    found = []
    for i, layer in enumerate(layers):
        try:
            found.append((i, _sub(layer, group.block)))
        except AttributeError:
            continue
    return found


def _calls_interface(cls: type) -> bool:
    """Whether `cls.forward` looks up transformers' attention interface (the name it reads)."""
    forward = inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def text_config(config):
    """The config of the text decoder: `config.get_text_config()` (a vision-language model's
    `text_config`), or `config` itself where it has no text part of its own. Not asked for the
    decoder's side: that gives flat encoder-decoder configs (T5) a decoder-flavoured copy."""
    getter = getattr(config, "get_text_config", None)
    try:
        return getter() if getter is not None else config
    except ValueError:  # several candidate text configs: none is "the" text decoder
        return config


def text_stack(model: nn.Module) -> nn.Module:
    """The module that runs the text decoder: the submodule holding `text_config` (a
    vision-language model's language model), else `model.base_model`, or, where that is the model
    itself though it wraps its base model as the child `model` holding its config
    (MllamaForCausalLM's base_model_prefix names an attribute it lacks), that child."""
    config = text_config(model.config)
    if config is not model.config:
        for module in model.modules():
            if module is not model and getattr(module, "config", None) is config:
                return module
    wrapped = getattr(model, "model", None)
    if model.base_model is model and getattr(wrapped, "config", None) is model.config:
        return wrapped
    return model.base_model


def analysed_body(model: nn.Module) -> nn.Module:
    """The module that runs the captured layers on token ids alone: the text stack, or the
    adapter's `body` inside it (an encoder-decoder's encoder)."""
    adapter = adapter_for(model.config)
    return _sub(text_stack(model), adapter.body if adapter is not None else "")


def discovered_cores(model: nn.Module) -> list[nn.Module]:
    """Every module of the text stack whose forward calls the attention interface, in module order."""
    return [m for m in text_stack(model).modules() if _calls_interface(type(m))]


def _numbered(stack: nn.Module, cores: list[nn.Module], n_layers) -> Optional[list[tuple[int, nn.Module]]]:
    """`[(layer, core)]` when every core sits in its own entry of one layer list of `n_layers`
    entries (the model's own numbering, whatever the other layers hold); None otherwise."""
    from torch.nn import ModuleList  # torch is not imported by `import headscope`

    paths = {id(m): name for name, m in stack.named_modules()}
    for name, layers in stack.named_modules():
        if not isinstance(layers, ModuleList) or len(layers) != n_layers:
            continue
        prefix = f"{name}." if name else ""
        found = []
        for core in cores:
            rest = paths[id(core)][len(prefix):].split(".", 1)[0] if paths[id(core)].startswith(prefix) else ""
            if not rest.isdigit():
                break
            found.append((int(rest), core))
        if len(found) == len(cores) and len({i for i, _ in found}) == len(found):
            return found
    return None


def core_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """`[(layer index, module that calls the attention interface)]`, in layer order.

    With an adapter, its paths say where they are (and, where the default sites are the whole
    stack, its groups' paths in that stack: mllama's cross-attention); otherwise they are discovered in the text
    stack, and each must sit in its own layer of the stack's layer list
    (`text_config(config).num_hidden_layers` entries). Layers keep the model's numbering: in a
    hybrid, layers without attention (Mamba, linear attention, convolutions) have no entry.
    """
    adapter = adapter_for(model.config)
    if adapter is not None:
        blocks = attention_blocks(model)
        if not adapter.default_sites:  # the whole stack: its groups there too (mllama's cross-attention)
            blocks += [pair for g in adapter.groups if g.stack == adapter.stack for pair in group_blocks(model, g)]
        return sorted(((i, _sub(block, adapter.core)) for i, block in blocks), key=lambda pair: pair[0])
    cores = discovered_cores(model)
    n_layers = getattr(text_config(model.config), "num_hidden_layers", None)
    numbered = _numbered(text_stack(model), cores, n_layers) if cores and n_layers else None
    if not cores:
        raise HeadscopeError(f"{type(model).__name__} has no module calling transformers' attention interface in its "
                             f"text decoder (no attention layers, as in a pure state-space model): nothing to capture")
    if numbered is None:
        raise HeadscopeError(
            f"{type(model).__name__} has {len(cores)} modules calling the attention interface that do not sit one "
            f"per layer in a list of its {n_layers} layers; without an adapter headscope needs each in its own layer "
            f"(encoder-decoders need an adapter)"
        )
    return sorted(numbered, key=lambda pair: pair[0])


def z_at_out(model: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """`[(core module, output projection)]` for the layers where something stands between the
    attention function and the output projection (a norm mixing heads, `Adapter.mixes_heads`, or
    an output gate, `Adapter.output_gate`): there z is the output projection's input. Empty for
    every other model."""
    adapter = adapter_for(model.config)
    if adapter is None or (adapter.mixes_heads is None and not adapter.output_gate):
        return []
    return [(_sub(block, adapter.core), _sub(block, adapter.out)) for _, block in attention_blocks(model)]


def out_projection(model: nn.Module, block: nn.Module) -> nn.Module:
    """The output projection (W_O) inside an attention block (of the text stacks or the vision tower)."""
    return _sub(block, block_adapter(model.config, block)[0].out)


def head_sizes(config) -> tuple[int, int, int, int]:
    """`(d_model, n_heads, n_kv_heads, d_head)` read from a transformers config (its text config);
    where the layers' sizes differ (gemma4_text), the first layer's (`config_value`)."""
    config = text_config(config)
    d_model = config.hidden_size
    n_heads = config.num_attention_heads
    n_kv = config_value(config, "num_key_value_heads") or n_heads
    d_head = config_value(config, "head_dim") or d_model // n_heads
    return d_model, n_heads, n_kv, d_head


def config_value(config, name: str, default=None):
    """`config.<name>` (`default` where absent); for an attribute a heterogeneous config sets per
    layer (gemma4_text's `head_dim` and `num_key_value_heads`, which transformers refuses to read
    globally), the first layer's value."""
    per_layer = getattr(config, "per_layer_attributes", None) or ()
    return getattr(config.per_layer_config[0] if name in per_layer else config, name, default)


def stack_counts(config) -> tuple[int, int]:
    """`(layers, query heads)` of the default stack: the text config's attributes the adapter's
    `counts` names (BartForCausalLM: its decoder's), else `num_hidden_layers` and `num_attention_heads`."""
    adapter = adapter_for(config)
    layers, heads = adapter.counts if adapter is not None and adapter.counts else ("num_hidden_layers",
                                                                                   "num_attention_heads")
    config = text_config(config)
    return getattr(config, layers), getattr(config, heads)


def vision_adapter_for(config) -> Optional[Adapter]:
    """The adapter of a vision tower's attention, by the model type of `config.vision_config` (or of `config`
    itself, a vision config); None where there is none."""
    vision = getattr(config, "vision_config", config)
    model_type = getattr(vision, "model_type", None)
    return next((a for a in VISION_ADAPTERS if model_type in a.model_types), None)


def block_adapter(config, block: nn.Module) -> tuple[Adapter, object]:
    """`(adapter, config holding its sizes)` for an attention block: the vision tower's where `config` is a
    vision config or the block is one of `config.vision_config`'s modules (they keep that config), else the
    text decoder's (`text_config`). HeadscopeError in one line where that has no adapter."""
    vision = getattr(config, "vision_config", config)
    adapter = vision_adapter_for(vision)
    if adapter is not None and (vision is config or getattr(block, "config", None) is vision):
        return adapter, vision
    text = text_config(config)
    return _needs_adapter(text), text
