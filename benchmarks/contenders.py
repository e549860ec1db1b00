"""The contenders of the head-analysis benchmark, each processing the same two probe inputs.

Every contender gets `text` ids (natural text, for previous-token) and `repeated` ids (random
tokens twice, for induction), both `[batch, seq_len]`, and returns `{detector: [layer, head]}`
scores (None for the floors, which compute no maps).

- floor_sdpa (a): the model's default attention, no maps.
- floor_eager (a'): eager attention, no maps returned; the least any tool that computes the
  attention probabilities must spend.
- eager_maps (b): common practice: eager attention with output_attentions=True, then the same
  detector formulas (headscope's) applied to the returned maps.
- transformer_lens (c): TransformerBridge booted with hf_model=, then what `detect_head` does
  for one prompt (run_with_cache, TL's detection patterns and its `mul` measure), one prompt at
  a time as detect_head does.
- headscope (d): `headscope.analyze` with the same two detectors on the same tokens.
No contender computes the LM head's logits (all run the model body only).
"""
from __future__ import annotations

import copy

import torch

import headscope
from headscope.detectors import induction, previous_token
from headscope.probes.base import ProbeBatch, ProbeSet

__all__ = ["CONTENDERS", "release"]


@torch.no_grad()
def floor_sdpa(loaded, text, repeated, content_start):
    loaded.model.set_attn_implementation("sdpa")
    for ids in (text, repeated):
        loaded.body(input_ids=ids)
    return None


@torch.no_grad()
def floor_eager(loaded, text, repeated, content_start):
    loaded.model.set_attn_implementation("eager")
    try:
        for ids in (text, repeated):
            loaded.body(input_ids=ids)
    finally:
        loaded.model.set_attn_implementation("sdpa")
    return None


@torch.no_grad()
def eager_maps(loaded, text, repeated, content_start):
    loaded.model.set_attn_implementation("eager")
    scores = {}
    try:
        for name, det, ids, start in (("previous_token", previous_token, text, 0),
                                      ("induction", induction, repeated, content_start)):
            maps = loaded.body(input_ids=ids, output_attentions=True).attentions  # all layers kept
            batch = ProbeBatch(ids, torch.ones_like(ids, dtype=torch.bool), True, start)
            scores[name] = torch.stack([det(m.float(), batch).nanmean(0) for m in maps]).cpu()
            del maps
    finally:
        loaded.model.set_attn_implementation("sdpa")
    return scores


@torch.no_grad()
def headscope_analyze(loaded, text, repeated, content_start):
    probes = {"text": ProbeSet("text", text, 0, "benchmark text"),
              "repeated": ProbeSet("repeated", repeated, content_start, "benchmark repeated")}
    analysis = headscope.analyze(loaded, detectors=["previous_token", "induction"], probes=probes,
                                 batch_size=text.shape[0], explorer_examples=0)
    return {d: torch.tensor(analysis.score_grid(d)) for d in ("previous_token", "induction")}


_BRIDGE = {}


def release() -> None:
    """Drop TransformerLens's copy of the weights, so it does not count in later peaks."""
    _BRIDGE.clear()


def _bridge(loaded):
    from transformer_lens.model_bridge import TransformerBridge

    key = id(loaded.model)
    if key not in _BRIDGE:
        # The bridge rewires the model it is given, so it gets its own copy of the weights.
        twin = copy.deepcopy(loaded.model)
        _BRIDGE[key] = TransformerBridge.boot_transformers(loaded.name, hf_model=twin, tokenizer=loaded.tokenizer)
    return _BRIDGE[key]


@torch.no_grad()
def transformer_lens(loaded, text, repeated, content_start):
    from transformer_lens.head_detector import (
        compute_head_attention_similarity_score,
        get_induction_head_detection_pattern,
        get_previous_token_head_detection_pattern,
    )

    bridge = _bridge(loaded)
    cfg = loaded.model.config
    scores = {}
    for name, make, ids in (("previous_token", get_previous_token_head_detection_pattern, text),
                            ("induction", get_induction_head_detection_pattern, repeated)):
        total = torch.zeros(cfg.num_hidden_layers, cfg.num_attention_heads)
        for row in ids:  # detect_head handles one prompt at a time
            tokens = row[None]
            detection = make(tokens.cpu()).to(tokens.device)
            _, cache = bridge.run_with_cache(tokens, remove_batch_dim=True)
            for layer in range(cfg.num_hidden_layers):
                pattern = cache["pattern", layer, "attn"]
                for head in range(cfg.num_attention_heads):
                    total[layer, head] += compute_head_attention_similarity_score(
                        pattern[head], detection_pattern=detection, exclude_bos=False,
                        exclude_current_token=False, error_measure="mul")
            del cache
        scores[name] = total / len(ids)
    return scores


CONTENDERS = {
    "a_sdpa": floor_sdpa,
    "a_eager": floor_eager,
    "b_eager_maps": eager_maps,
    "d_headscope": headscope_analyze,
    "c_transformer_lens": transformer_lens,  # last: its copy of the weights stays resident
}
