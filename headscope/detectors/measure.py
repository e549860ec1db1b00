"""Probes and measurements for causal checks: what a model's output loses when heads are removed.

The causal checks (`headscope.causal`) and the retrieval detector's needle accuracy both measure
with it, so it sits in detectors/, below both.

- `EvalProbe` (`headscope.probes.base`): token ids, targets, padding mask and which tokens are scored;
  each probe kind builds its own (`headscope.probes.kinds`, `eval_probe`).
- `masked_for_lm`: the masked-LM version of a probe.
- `metric_for(loaded)`: "next_token_loss" (causal LMs), "masked_token_loss" (encoders with an LM
  head), "hidden_change" (other encoders), "copy_token_loss" (an encoder-decoder's decoder sites:
  the teacher-forced copy, `headscope.probes.copy.as_copy_eval`); `METRICS` says what each one means.
- `ProbeRunner(loaded, probe, batch_size)`: runs the probe once unablated (recording each head's
  mean z over the probe's real tokens, for mean ablation) and then `.measure(heads, mode)`, both
  at the analysed group of sites (`loaded.sites`: a decoder's self- or cross-attention).
- `Measurement`: the metric's mean over scored tokens, the accuracy, and the per-token values.
- `icl_score(per_token, early, late)`, `icl_positions(seq_len)`: Olsson et al.'s in-context
  learning score.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..errors import HeadscopeError
from ..hf.capture import ablate
from ..hf.route import Session, layer_map, routed
from ..probes.base import EvalProbe

__all__ = [
    "EvalProbe", "Measurement", "ProbeRunner", "METRICS", "metric_for", "masked_for_lm", "icl_score", "icl_positions",
    "ICL_LATE", "ICL_EARLY", "ICL_WINDOW",
]

METRICS = {
    "next_token_loss": "mean cross-entropy of the next token, nats",
    "masked_token_loss": "mean cross-entropy of masked tokens (15% of scored tokens), nats",
    "hidden_change": "mean relative L2 change of the final hidden states, ||h' - h|| / ||h|| (no LM head)",
    "copy_token_loss": ("mean cross-entropy of the decoder predicting each token of a teacher-forced copy (decoder "
                        "position t, having read tokens < t, predicts the encoder's token t), nats"),
    "icl_score": "loss at a late token minus loss at an early one (Olsson et al. 2022), nats",
}
ICL_LATE, ICL_EARLY, ICL_WINDOW = 500, 50, 10
MASK_RATE = 0.15


@dataclass
class Measurement:
    """One probe's metric: `value` (mean over scored tokens), `accuracy` (NaN for hidden_change),
    `per_token` `[example, pos]` (NaN where not scored)."""

    value: float
    accuracy: float
    per_token: torch.Tensor


def metric_for(loaded) -> str:
    """Which metric a model gets (see `METRICS`): at a decoder's sites the copy's loss."""
    if loaded.two_inputs:
        return "copy_token_loss"
    if loaded.causal:
        return "next_token_loss"
    has_head = loaded.model.get_output_embeddings() is not None
    if has_head and getattr(loaded.tokenizer, "mask_token_id", None) is not None:
        return "masked_token_loss"
    return "hidden_change"


def masked_for_lm(probe: EvalProbe, mask_id: int, seed: int) -> EvalProbe:
    """The probe with a seeded 15% of its scored tokens (at least one per example) replaced by
    [MASK]; only those are scored."""
    gen = torch.Generator().manual_seed(seed + 2)
    chosen = (torch.rand(probe.scored.shape, generator=gen) < MASK_RATE) & probe.scored
    for i in range(len(probe)):
        if not chosen[i].any() and probe.scored[i].any():
            chosen[i, probe.scored[i].nonzero()[0, 0]] = True
    ids = probe.input_ids.clone()
    ids[chosen] = mask_id
    return EvalProbe(probe.name, ids, probe.targets, probe.attention_mask, chosen,
                     probe.description + f"; {MASK_RATE:.0%} of tokens masked")


class _MeanRecorder(Session):
    """Sums each head's z `[batch, pos, head, d_head]` over real tokens (the queries': a decoder's
    at its cross-attention) at the layers of `layer_of`; returns z unchanged."""

    def __init__(self, layer_of: dict[int, int]):
        self.layer_of = layer_of
        self.mask: Optional[torch.Tensor] = None  # (B, T) bool of the current batch
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def edit_z(self, layer, z):
        weight = self.mask[:, :, None, None].to(z.dtype)  # (B, T, 1, 1)
        total = (z.detach() * weight).sum(dim=(0, 1)).double()  # (H, D)
        self.sums[layer] = self.sums[layer] + total if layer in self.sums else total
        self.counts[layer] = self.counts.get(layer, 0) + int(self.mask.sum())
        return z

    def means(self) -> dict[int, torch.Tensor]:
        return {layer: (total / self.counts[layer]).float() for layer, total in self.sums.items()}


class ProbeRunner:
    """One probe through one model: the unablated run at construction, then ablated runs.

    Layers and heads are those of the analysed group (`loaded.sites`; an encoder-decoder's
    decoder group needs a probe with `decoder_input_ids`, and the model then reads both inputs).

    Attributes:
        baseline: the unablated `Measurement`.
        means: `{layer: [head, d_head]}` each head's mean z over the probe's real tokens (what
            mean ablation substitutes).
        metric: see `metric_for`.
    """

    def __init__(self, loaded, probe: EvalProbe, batch_size: int = 8):
        if probe.two_inputs != loaded.two_inputs:
            needs = "a decoder input (probes.copy.as_copy_eval)" if loaded.two_inputs else "no decoder input"
            raise HeadscopeError(f"the {probe.name} probe does not fit {loaded.name}'s {loaded.sites or 'default'} "
                                 f"sites: they need {needs}")
        self.loaded = loaded
        self.probe = probe
        self.batch_size = batch_size
        self.metric = metric_for(loaded)
        self._reference: list[torch.Tensor] = []  # final hidden states per batch (hidden_change)
        recorder = _MeanRecorder(layer_map(loaded.model, loaded.sites))
        self.baseline = self._run(lambda: routed(loaded.model, recorder), recorder)
        self.means = recorder.means()

    def measure(self, heads: Sequence[tuple[int, int]], mode: str) -> Measurement:
        """The probe's metric with `heads` ablated ("zero", or "mean" with the probe's means)."""
        means = self.means if mode == "mean" else None
        return self._run(lambda: ablate(self.loaded.model, heads, mode=mode, means=means, sites=self.loaded.sites),
                         None)

    @torch.no_grad()
    def _run(self, context, recorder: Optional[_MeanRecorder]) -> Measurement:
        model, device = self.loaded.model, self.loaded.device
        values, hits = [], []
        for number, start in enumerate(range(0, len(self.probe), self.batch_size)):
            rows = slice(start, start + self.batch_size)
            ids = self.probe.input_ids[rows].to(device)
            mask = self.probe.attention_mask[rows].to(device)
            inputs = dict(input_ids=ids, attention_mask=mask.long())
            if self.probe.two_inputs:  # unpadded copies (as_copy_eval): the decoder's mask is all True too
                inputs["decoder_input_ids"] = self.probe.decoder_input_ids[rows].to(device)
            if recorder is not None:
                recorder.mask = mask  # queries: the encoder's tokens, or the decoder's of the same length
            with context():
                out = model(**inputs)
            value, hit = self._per_token(out, number, self.probe.targets[rows].to(device), recorder is not None)
            values.append(value)
            hits.append(hit)
        per_token = torch.cat(values)
        per_token[~self.probe.scored] = float("nan")
        hit = torch.cat(hits)[self.probe.scored]
        return Measurement(_nanmean(per_token), _nanmean(hit), per_token)

    def _per_token(self, out, number: int, targets: torch.Tensor, is_baseline: bool):
        """`[batch, pos]` metric and hit (1/0, NaN without one) of one batch, on the CPU."""
        nan = torch.full(targets.shape, float("nan"))
        if self.metric == "hidden_change":
            hidden = out.last_hidden_state.float()  # (B, T, D)
            if is_baseline:
                self._reference.append(hidden)
            reference = self._reference[number]
            change = (hidden - reference).norm(dim=-1) / reference.norm(dim=-1).clamp_min(1e-12)
            return change.cpu(), nan
        value, hit = nan.clone(), nan.clone()
        shift = 1 if self.metric == "next_token_loss" else 0  # logits at t-1 predict token t
        for row in range(targets.shape[0]):  # one row at a time: [T, vocab] fp32 stays small
            logits = out.logits[row, : targets.shape[1] - shift].float()
            wanted = targets[row, shift:]
            value[row, shift:] = F.cross_entropy(logits, wanted, reduction="none").cpu()
            hit[row, shift:] = (logits.argmax(-1) == wanted).float().cpu()
        return value, hit


def _nanmean(values: torch.Tensor) -> float:
    kept = values[~values.isnan()]
    return float(kept.mean()) if kept.numel() else math.nan


def icl_positions(seq_len: int) -> tuple[int, int]:
    """(early, late) token indices of the ICL score for windows of `seq_len` tokens:
    late = min(seq_len - 1, 500), early = min(50, late // 2)."""
    late = min(seq_len - 1, ICL_LATE)
    return min(ICL_EARLY, late // 2), late


def icl_score(per_token: torch.Tensor, early: int, late: int) -> float:
    """Olsson et al. 2022's in-context learning score: loss at token `late` minus loss at token
    `early`. Each loss is the mean over examples and over the `min(10, early)` tokens ending at
    that index (far fewer examples than the paper's, so single tokens would be noise).

    Args:
        per_token: `[example, pos]` next-token loss of token `pos` (NaN where not scored).
        early, late: token indices, 1 <= early <= late // 2 (see `icl_positions`).
    """
    if not 1 <= early <= late // 2:
        raise HeadscopeError(f"the ICL score needs 1 <= early <= late // 2, got early {early}, late {late}")
    window = min(ICL_WINDOW, early)
    at = lambda index: _nanmean(per_token[:, index - window + 1:index + 1])
    return at(late) - at(early)
