"""The report's head explorer: the first examples of each probe with every analysed head's full map.

- `shown_examples(loaded, built, n_show, length, maps)`: `Example`s (`headscope.analysis.result`)
  of each built probe's first `n_show` examples cut to `length` tokens, for `analyze`, with the
  maps its passes kept (`headscope.detectors.runner.collect(explorer=...)`) or from a short pass.
- `explorer_inputs(loaded, probe, n_show, length)`: the model's keyword inputs for them and the
  token ids of the query and key axes (at a decoder's sites: the decoder's tokens as queries,
  the encoder's as cross-attention's keys).
- `explorer_maps(loaded, inputs)`: `[example, layer, head, query, key]` the analysed sites' maps.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..hf.capture import capture, stack_layers
from ..probes.tokens import display_tokens
from .result import Example

__all__ = ["shown_examples", "explorer_inputs", "explorer_maps"]


@torch.no_grad()
def shown_examples(loaded, built, n_show, length, maps: Optional[dict] = None) -> list[Example]:
    """The first examples of each probe with every analysed head's map, for the report's explorer.
    At a decoder's sites the queries are the decoder's tokens, and cross-attention's keys the
    encoder's (`Example.key_tokens`). `maps`: probe name -> `[example, layer, head, query, key]`
    maps of those examples already computed (by the probe's pass); the other probes run a pass
    of their examples alone."""
    examples, maps = [], maps or {}
    for name, probe in built.items():
        shown = explorer_inputs(loaded, probe, n_show, length)
        if shown is None:
            continue
        inputs, queries, keys = shown
        probe_maps = maps[name] if name in maps else explorer_maps(loaded, inputs)
        for i in range(queries.shape[0]):
            tokens = display_tokens(loaded.tokenizer, queries[i].tolist())  # " word", not "Ġword"; bad bytes as <0xNN>
            key_tokens = _key_tokens(loaded, probe, keys, i)
            examples.append(Example.from_float(name, i, tokens, probe_maps[i].numpy(), key_tokens))
    return examples


def explorer_inputs(loaded, probe, n_show, length):
    """`(inputs, queries, keys)`: the model's keyword inputs for a probe's first examples, the
    query axis's token ids `[example, query]` and the key axis's `[example, key]` (None: the
    queries'); None for a probe whose examples keep no maps."""
    if not loaded.two_inputs:
        ids = probe.explorer_ids(n_show, length)
        if ids is None:
            return None
        ids = ids.to(loaded.device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ids, None
    batch = probe.explorer_batch(n_show, length).to(loaded.device)  # both inputs, as the runner passes them
    inputs = batch.model_inputs()
    view = batch.for_site(loaded.site_kind)  # decoder self-attention: its tokens both ways; cross: encoder keys
    return inputs, view.input_ids, view.key_ids  # key_ids None at an audio encoder's cross-attention


def _key_tokens(loaded, probe, keys, i):
    """Example i's key axis for the explorer: the encoder's tokens at cross-attention, the audio
    encoder's positions of silence there (`SilentAudio.key_tokens`), None at self-attention."""
    if keys is not None:
        return display_tokens(loaded.tokenizer, keys[i].tolist())
    audio = probe.audio if loaded.two_inputs else None
    return audio.key_tokens() if audio is not None and loaded.site_kind == "cross" else None


@torch.no_grad()
def explorer_maps(loaded, inputs) -> torch.Tensor:
    """`[example, layer, head, query, key]` the analysed sites' maps on `inputs` (on the CPU)."""
    with capture(loaded.model, to="cpu", sites=loaded.sites) as cap:
        loaded.probe_pass(**inputs)
    return stack_layers(cap.patterns, loaded.n_layers)  # (N, L, H, Tq, Tk)
