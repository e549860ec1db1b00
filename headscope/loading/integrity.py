"""Damage caught before it becomes scores: weights that do not match their config, weights or
activations that are not finite.

- `check_loading_info(info, name)`: HeadscopeError when a checkpoint lacks tensors its config
  declares (transformers would fill them with random values) or holds tensors the config does
  not declare (a config of fewer layers than the weights, say). Task heads (pooler, classifier,
  lm_head ...) may be missing: the analysis never reads them.
- `check_weights(model, name)`: HeadscopeError naming the first parameter with NaN or inf.
- `check_hidden_states(hidden_states, mask, where)`: HeadscopeError naming the first layer whose
  output holds NaN or inf at a real (unpadded) token.
No torch at import: `headscope.loading.loader` imports this module and stays torch-free.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

from ..errors import HeadscopeError

__all__ = ["check_loading_info", "check_weights", "check_hidden_states", "TASK_HEADS"]

# Modules outside the attention stack that a checkpoint may leave out (a sentence-transformers
# export drops the pooler, a base model saved without its LM head): the analysis never reads them.
TASK_HEADS = ("pooler", "lm_head", "classifier", "score", "qa_outputs", "cls")
# Buffers older checkpoints store that current transformers recomputes.
_STALE_BUFFERS = re.compile(r"(position_ids|inv_freq|masked_bias|attn\.bias|_float_tensor)$")


def _listed(keys: Sequence[str], limit: int = 3) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_loading_info(info: dict, name: str) -> None:
    """Refuse a checkpoint whose tensors and config disagree.

    Args:
        info: transformers' loading info (`from_pretrained(..., output_loading_info=True)`).
        name: what the error calls the model (its folder).
    """
    mismatched = sorted(info.get("mismatched_keys", ()))
    if mismatched:
        key, stored, wanted = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise HeadscopeError(f"the weights of {name} do not match its config: {key} is {' x '.join(map(str, stored))} "
                             f"in the weights file, {' x '.join(map(str, wanted))} in the model config.json "
                             f"describes{more}; check config.json against the weights file")
    missing = [k for k in info.get("missing_keys", ()) if not any(part in TASK_HEADS for part in k.split("."))]
    unexpected = [k for k in info.get("unexpected_keys", ()) if not _STALE_BUFFERS.search(k)]
    if missing:
        raise HeadscopeError(f"the weights of {name} do not match its config: {len(missing)} tensors the config "
                             f"declares are missing ({_listed(missing)}) and would be random; check config.json "
                             f"against the weights file")
    if unexpected:
        raise HeadscopeError(f"the weights of {name} do not match its config: {len(unexpected)} tensors are not in "
                             f"the model the config describes ({_listed(unexpected)}); check config.json (its "
                             f"layer and head counts) against the weights file")


def check_weights(model, name: str) -> None:
    """HeadscopeError naming the first parameter holding NaN or inf (offloaded ones are skipped)."""
    import torch

    for param_name, param in model.named_parameters():
        if param.device.type == "meta" or not param.is_floating_point():
            continue
        with torch.no_grad():
            # A sum is finite only when every term is (NaN and inf carry through it), and it
            # reads the tensor once without a mask the size of the weights; a non-finite sum
            # (or one that overflowed) is then counted exactly.
            if torch.isfinite(param.sum(dtype=torch.float32)):
                continue
            bad = int((~torch.isfinite(param)).sum())
        if bad:
            raise HeadscopeError(f"the weights of {name} are damaged: {param_name} holds {bad} NaN or infinite "
                                 f"values of {param.numel()}; reload the model from an intact file")


def check_hidden_states(hidden_states: Optional[Sequence], mask, where: str) -> None:
    """HeadscopeError naming the first layer whose output is NaN or inf at a real token.

    Args:
        hidden_states: the model's `output_hidden_states` (embeddings first, then each layer), or None.
        mask: `[batch, pos]` True at real tokens.
        where: what was running ("probe text, batch 3"), for the message.
    """
    import torch

    if not hidden_states:
        return
    for index, states in enumerate(hidden_states):
        if states.shape[:2] != mask.shape:
            continue  # a stack of another length (a vision tower, say)
        if not torch.isfinite(states[mask.to(states.device)]).all():
            what = "the embeddings" if index == 0 else f"layer {index - 1}"
            raise HeadscopeError(f"non-finite activations (NaN or inf) in the output of {what} on {where}; "
                                 f"the weights or the dtype overflow (try --dtype float32)")
