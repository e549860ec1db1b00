"""The copy probe: natural text through an encoder-decoder, the decoder teacher-forced to copy it.

- `copy_probe(tokenizer, n_examples, seq_len, decoder_start, seed)`: a `CopySet`. The encoder
  reads a window of the bundled text (`text_probe`, in the tokenizer's special tokens); the
  decoder reads the same tokens shifted right by one behind the model's decoder start token,
  as transformers' `shift_tokens_right` makes the decoder input from the labels. With the text
  as its own labels this is BART's denoising objective with no noise (Lewis et al. 2020): the
  decoder at position i has read encoder tokens 0..i-1 and predicts token i, so an aligned
  cross-attention head attends from decoder position i to encoder position i (the token it
  emits) or i - 1 (the one it just read).
- `as_copy(probe, decoder_start, audio=None)`: any built unpadded probe read the same way (with
  `audio`, a `SilentAudio`, an audio encoder's input instead of the tokens: the decoder still
  reads them, the encoder hears silence);
  `CopySet.explorer_batch(n, length)`: its first examples cut short, for the report's explorer.
- `shifted_right(ids, start)`, `decoder_start_token(model)`: the decoder input teacher-forcing
  `ids`, and the token it starts from (shared with `headscope.verify`'s `teacher_forced`).
- `as_copy_eval(probe, decoder_start)`: a causal check's `EvalProbe` read the same way, for
  `headscope.validate` at a decoder's sites: decoder position t predicts encoder token t, the
  decoder's next input, and the tokens the probe scored stay scored.
- `Seq2SeqBatch`: one batch of both inputs, in transformers' names (`input_ids`,
  `attention_mask` the encoder's; `decoder_input_ids`, `decoder_attention_mask`), and
  `for_site(kind)`: the `ProbeBatch` a detector at a site of that kind reads (encoder
  self-attention, decoder self-attention, cross-attention).

The encoder reads the tokens in text encoders (BART, T5, mT5, Marian); Whisper's encoder reads
audio features, so there it reads silence (`headscope.probes.audio`) and the copy probe, whose
decoder copies what the encoder read, has nothing to copy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..errors import CannotScore, HeadscopeError
from .audio import SilentAudio
from .base import EvalProbe, ProbeBatch, text_probe

__all__ = ["copy_probe", "as_copy", "as_copy_eval", "CopySet", "Seq2SeqBatch", "shifted_right", "decoder_start_token"]


def shifted_right(ids: torch.Tensor, start: int) -> torch.Tensor:
    """`[batch, T]` the decoder input teacher-forcing `ids` `[batch, T]`: `start`, then `ids` without
    its last token (transformers' `shift_tokens_right`)."""
    return torch.cat([torch.full_like(ids[:, :1], int(start)), ids[:, :-1]], dim=1)


def decoder_start_token(model) -> Optional[int]:
    """The token id `model`'s decoder starts from (`decoder_start_token_id` of its config, else
    of its generation config), or None where neither names one."""
    for config in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        start = getattr(config, "decoder_start_token_id", None)
        if start is not None:
            return int(start)
    return None


@dataclass
class Seq2SeqBatch:
    """One batch of an encoder-decoder probe.

    Attributes:
        input_ids, attention_mask: `[batch, source]` the encoder's tokens and mask (True: real).
        decoder_input_ids, decoder_attention_mask: `[batch, target]` the decoder's.
        content_start: the encoder's first probe token (after its special tokens).
        decoder_content_start: the decoder's first probe token.
        token_counts: `[vocab]` corpus frequency of each token id, or None.
        input_features: `[batch, mel bin, frame]` what an audio encoder reads instead of
            `input_ids` (None: the encoder reads `input_ids`); `attention_mask` then covers its
            frames, and `input_ids` are the probe's tokens, which only the decoder reads.
        key_mask: `[batch, encoder position]` the positions cross-attention reads where they are
            not the encoder's input positions (an audio encoder's, fewer than its frames; None:
            `attention_mask`).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    decoder_input_ids: torch.Tensor
    decoder_attention_mask: torch.Tensor
    content_start: int = 0
    decoder_content_start: int = 0
    token_counts: Optional[torch.Tensor] = None
    input_features: Optional[torch.Tensor] = None
    key_mask: Optional[torch.Tensor] = None
    _views: dict = field(default_factory=dict, repr=False)

    def to(self, device) -> "Seq2SeqBatch":
        move = lambda tensor: None if tensor is None else tensor.to(device)
        return Seq2SeqBatch(self.input_ids.to(device), self.attention_mask.to(device),
                            self.decoder_input_ids.to(device), self.decoder_attention_mask.to(device),
                            self.content_start, self.decoder_content_start, move(self.token_counts),
                            move(self.input_features), move(self.key_mask))

    def model_inputs(self, device=None) -> dict:
        """The keyword inputs of the encoder-decoder's forward pass (masks as integers), on `device`
        (default: where they are): the encoder's `input_features` in place of `input_ids` where
        it reads audio."""
        encoder = ({"input_ids": self.input_ids.to(device)} if self.input_features is None
                   else {"input_features": self.input_features.to(device)})
        return {**encoder, "attention_mask": self.attention_mask.long().to(device),
                "decoder_input_ids": self.decoder_input_ids.to(device),
                "decoder_attention_mask": self.decoder_attention_mask.long().to(device)}

    def for_site(self, kind: str) -> ProbeBatch:
        """The `ProbeBatch` detectors read at a site of `kind`, made once per kind (its masks
        are then shared across layers):

        - "bidirectional": the encoder's self-attention over its tokens.
        - "causal": the decoder's self-attention over its tokens.
        - "cross": decoder queries over encoder keys (`key_ids`, `key_mask` the encoder's; an
          audio encoder's keys have no tokens, `key_ids` None).
        """
        if kind not in self._views:
            if kind == "bidirectional" and self.input_features is not None:
                raise HeadscopeError("an audio encoder's self-attention reads no tokens: a token probe cannot be "
                                     "read at its sites")
            if kind == "bidirectional":
                view = ProbeBatch(self.input_ids, self.attention_mask, False, self.content_start, self.token_counts)
            elif kind == "causal":
                view = ProbeBatch(self.decoder_input_ids, self.decoder_attention_mask, True,
                                  self.decoder_content_start, self.token_counts)
            elif kind == "cross":
                tokens = self.input_features is None
                view = ProbeBatch(self.decoder_input_ids, self.decoder_attention_mask, False,
                                  self.decoder_content_start, self.token_counts,
                                  key_ids=self.input_ids if tokens else None,
                                  key_mask=self.attention_mask if self.key_mask is None else self.key_mask)
            else:
                raise HeadscopeError(f"unknown site kind {kind!r}; use causal, bidirectional or cross")
            self._views[kind] = view
        return self._views[kind]


@dataclass
class CopySet:
    """A built copy probe (`copy_probe`); every example the same length, no padding.

    Attributes:
        input_ids: `[example, pos]` the encoder's tokens.
        decoder_input_ids: `[example, pos]` the decoder's: the decoder start token, then
            `input_ids` without its last token.
        content_start: the encoder's first probe token; the decoder's is one later.
        description: what the probe holds, in words.
        token_counts: `[vocab]` corpus frequency of each token id.
        audio: what an audio encoder reads instead of `input_ids` (`SilentAudio`; None: the
            encoder reads `input_ids`).
    """

    input_ids: torch.Tensor
    decoder_input_ids: torch.Tensor
    content_start: int
    description: str
    token_counts: Optional[torch.Tensor] = None
    name: str = "copy"
    extra_meta: dict = field(default_factory=dict)
    audio: Optional[SilentAudio] = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def meta(self) -> dict:
        return {"n_examples": len(self), "seq_len": self.seq_len, "description": self.description}

    def explorer_ids(self, n: int, length: int) -> torch.Tensor:
        """`[n, length]` the first examples' encoder tokens, cut short."""
        return self.input_ids[:n, :length]

    def explorer_batch(self, n: int, length: int) -> Seq2SeqBatch:
        """The first `n` examples, both inputs cut to `length` tokens, whose maps the report's
        explorer keeps at a decoder's sites."""
        source, target = self.input_ids[:n, :length], self.decoder_input_ids[:n, :length]
        return self._batch(source, target)

    def batches(self, batch_size: int, causal: bool, device) -> list[Seq2SeqBatch]:
        """`Seq2SeqBatch`es of `batch_size` examples (`causal` is the decoder's, always causal here)."""
        return [self._batch(self.input_ids[start:start + batch_size].to(device),
                            self.decoder_input_ids[start:start + batch_size].to(device))
                for start in range(0, len(self), batch_size)]

    def _batch(self, source, target) -> Seq2SeqBatch:
        """Both inputs of these examples, unpadded; an audio encoder's silence for each of them,
        every frame and position real."""
        every = lambda n: torch.ones(source.shape[0], n, dtype=torch.bool, device=source.device)
        if self.audio is None:
            return Seq2SeqBatch(source, torch.ones_like(source, dtype=torch.bool), target,
                                torch.ones_like(target, dtype=torch.bool), self.content_start, self.content_start + 1,
                                self.token_counts)
        features = self.audio.features(source.shape[0]).to(source.device)  # (B, mel, frames)
        return Seq2SeqBatch(source, every(self.audio.n_frames), target, torch.ones_like(target, dtype=torch.bool),
                            self.content_start, self.content_start + 1, self.token_counts, features,
                            every(self.audio.n_positions))


def copy_probe(tokenizer, n_examples: int, seq_len: int, decoder_start: int, seed: int = 0) -> CopySet:
    """`n_examples` windows of `seq_len` tokens of the bundled text (`text_probe`'s, for the same
    seed) as the encoder's input, and the decoder's input they teacher-force.

    Args:
        tokenizer: the model's tokenizer.
        n_examples, seq_len: windows and tokens per window, special tokens included.
        decoder_start: the model's decoder start token id (`config.decoder_start_token_id`).
        seed: picks the windows.
    """
    text = text_probe(tokenizer, n_examples, seq_len, seed)
    return CopySet(text.input_ids, shifted_right(text.input_ids, decoder_start), text.content_start,
                   f"natural English from probes/text, {n_examples} windows of {seq_len} tokens; the decoder reads "
                   f"them shifted right behind its start token {int(decoder_start)} (teacher-forced copy)",
                   text.token_counts)


def as_copy(probe, decoder_start: int, audio: Optional[SilentAudio] = None) -> CopySet:
    """A built probe as an encoder-decoder's input: the encoder reads its examples, the decoder
    the same tokens shifted right behind `decoder_start` (as `copy_probe` does with text), so the
    detectors of decoder and cross-attention sites read the probe they read elsewhere (the
    repeated probe's copies stay copies in the decoder's input, one position later). A `CopySet`
    passes through; probes with padding (the treebank's) raise `CannotScore`.

    With `audio` (an audio encoder's `SilentAudio`) the encoder hears that silence instead and
    only the decoder reads the tokens; a `CopySet` of the encoder's tokens (the copy probe, whose
    decoder copies what the encoder read) then raises `CannotScore`: there is nothing to copy."""
    if isinstance(probe, CopySet):
        if probe.audio == audio:
            return probe
        if audio is None:
            raise CannotScore(f"the {probe.name} probe was built for an audio encoder's silence; this encoder reads "
                              f"tokens")
        raise CannotScore(f"the {probe.name} probe's decoder copies what the encoder reads, and this encoder hears "
                          f"{audio.description}, not the probe's tokens: there is nothing to copy")
    ids = getattr(probe, "input_ids", None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not hasattr(probe, "content_start") \
            or hasattr(probe, "sentences"):
        raise CannotScore(f"the {probe.name} probe cannot feed an encoder-decoder's decoder (it needs unpadded "
                          f"examples of one length, as the text and repeated probes have)")
    heard = "" if audio is None else f"; the encoder hears {audio.description}"
    return CopySet(ids, shifted_right(ids, decoder_start), probe.content_start,
                   f"{probe.description}; the decoder reads it shifted right behind its start token "
                   f"{int(decoder_start)} (teacher-forced copy){heard}", probe.token_counts, name=probe.name,
                   audio=audio)


def as_copy_eval(probe: EvalProbe, decoder_start: int) -> EvalProbe:
    """A causal check's probe as an encoder-decoder's teacher-forced copy (`headscope.validate` at
    a decoder's sites): the encoder reads `probe.input_ids`, the decoder the same tokens shifted
    right behind `decoder_start`, and decoder position t is scored on predicting token t (what
    `scored` marked: the loss of token t from the tokens before it, which the decoder has read).
    A probe that already has `decoder_input_ids` passes through; one with padding (the treebank's)
    raises `CannotScore`."""
    if probe.two_inputs:
        return probe
    if not probe.attention_mask.all():
        raise CannotScore(f"the {probe.name} probe cannot feed an encoder-decoder's decoder (it needs unpadded "
                          f"examples of one length, as the text and repeated probes have)")
    ids = probe.input_ids
    return EvalProbe(probe.name, ids, probe.targets, probe.attention_mask, probe.scored,
                     f"{probe.description}; the decoder reads it shifted right behind its start token "
                     f"{int(decoder_start)} and predicts each token (teacher-forced copy)",
                     shifted_right(ids, decoder_start))
