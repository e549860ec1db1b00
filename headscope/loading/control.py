"""The control model: an untrained twin that shows what a detector gives for free.

Offers:
    random_twin(loaded, seed)          -- same class, config and tokenizer, seeded random weights.
    resolve_control(loaded, control, seed) -> (Loaded or None, meta dict)
    CONTROL_SEED_OFFSET                -- the twin's seed is the analysis seed plus this.

A label such as ``induction`` claims that a head learned something. A twin with the same
architecture, tokenizer and probes but random weights has learned nothing, so whatever it
scores (word-level attention favouring long words, flat causal attention favouring the first
word, ...) is what the architecture and the probes give without learning. `headscope.analyze`
scores the twin on the same probe batches (one more forward pass per batch) and a head keeps a
learned-behaviour label only when its score's CI lower bound is above the twin's best head
(`headscope.detectors.labels`).
"""
from __future__ import annotations

import copy
import os
from typing import Optional

from ..errors import HeadscopeError
from .loader import Loaded

__all__ = ["random_twin", "resolve_control", "CONTROL_SEED_OFFSET", "CONTROL_KINDS"]

CONTROL_SEED_OFFSET = 1_000_003  # far from the seeds people pick, so a twin is never the model itself
CONTROL_KINDS = ("random-init", "none")
MEMORY_SHARE = 0.5  # the twin is built only if its weights take at most this share of free memory


def random_twin(loaded: Loaded, seed: int) -> Loaded:
    """The model's architecture with seeded random weights (transformers' own initialisation).

    Args:
        loaded: the model to copy the config, class, dtype, device and tokenizer of.
        seed: seeds the initialisation; the global random state is left as it was.
    Returns:
        A `Loaded` in eval mode on the model's device.
    """
    import torch

    model = loaded.model
    config = copy.deepcopy(model.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        twin = type(model)._from_config(config, dtype=model.dtype)
    twin = twin.to(loaded.device).eval()
    name = f"{loaded.name} (random-init control, seed {seed})"
    return Loaded(model=twin, tokenizer=loaded.tokenizer, name=name, family=loaded.family, causal=loaded.causal)


def resolve_control(loaded: Loaded, control, seed: int) -> tuple[Optional[Loaded], dict]:
    """The control model an analysis asked for, and what to record about it.

    Args:
        loaded: the model under analysis.
        control: "random-init" (a seeded twin, when it fits in memory), None or "none" (no
            control), or a `Loaded` with the same layers, heads and tokenizer.
        seed: the analysis seed (the twin's is ``seed + CONTROL_SEED_OFFSET``).
    Returns:
        (the control or None, meta) with meta keys kind, seed, name and note.
    """
    if control is None or control == "none":
        return None, {"kind": "none", "seed": None, "name": None,
                      "note": "no control model: labels are not checked against an untrained twin"}
    if isinstance(control, Loaded):
        if (control.attention_layers, control.n_heads) != (loaded.attention_layers, loaded.n_heads):
            raise HeadscopeError(f"the control has {control.n_layers} layers x {control.n_heads} heads; "
                                 f"{loaded.name} has {loaded.n_layers} x {loaded.n_heads}")
        return control, {"kind": "given", "seed": None, "name": control.name,
                         "note": f"control model given by the caller: {control.name}"}
    if control != "random-init":
        raise HeadscopeError(f"unknown control {control!r}; use one of {', '.join(CONTROL_KINDS)} or a Loaded model")
    reason = _why_no_twin(loaded)
    if reason:
        return None, {"kind": "none", "seed": None, "name": None,
                      "note": f"no control model: {reason}; labels are not checked against an untrained twin"}
    twin_seed = seed + CONTROL_SEED_OFFSET
    twin = random_twin(loaded, twin_seed)
    return twin, {"kind": "random-init", "seed": twin_seed, "name": twin.name,
                  "note": "a twin with the same config and tokenizer and seeded random weights"}


def _why_no_twin(loaded: Loaded) -> Optional[str]:
    """Why a random twin cannot be built next to the model (None when it can)."""
    import torch

    if getattr(loaded.model, "hf_device_map", None):
        return "the model is spread over devices (device_map); pass a control model yourself"
    size = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    device = loaded.device
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _free_host_memory()
    if free is not None and size > MEMORY_SHARE * free:
        return (f"its weights ({size / 2**30:.1f} GiB) would take more than half of the free memory "
                f"({free / 2**30:.1f} GiB)")
    return None


def _free_host_memory() -> Optional[int]:
    """Bytes of memory available to new allocations (Linux MemAvailable; None elsewhere)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
