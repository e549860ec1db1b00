"""Which circuit methods run on each model family, and why not where they do not: data.

The four methods (`METHODS`) are direct logit attribution (`headscope.logit_attribution`),
attribution patching (`headscope.attribute`: AtP, AtP* and exact patching), edge attribution
patching with its faithfulness (`headscope.circuit`: EAP, EAP-IG, `Circuit.evaluate`) and
composition scores (`headscope.composition`). Every family runs all four unless `REFUSED` names
the reason (`REASONS`): the one-line error the method raises says the same (its `phrase`).
The family table (`headscope.hf.families.family_markdown`) shows one column per method; a test
(tests/circuits/test_family_methods.py) runs each method on every family's tiny model and checks
that what runs is exact (the full circuit reproduces the clean run, the empty one the corrupted
run) and that what is refused is refused with its reason, so the table is measured, not declared.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["METHODS", "TITLES", "Reason", "REASONS", "REFUSED", "methods_of", "method_cell", "methods_legend"]

METHODS = ("dla", "atp", "eap", "composition")
TITLES = {"dla": "DLA", "atp": "AtP", "eap": "EAP", "composition": "composition"}


class Reason(NamedTuple):
    label: str  # the table's cell: "no (label)"
    text: str  # the legend under the table
    phrase: str  # a part of the one-line error the method raises


REASONS = {
    "post-norm": Reason("post-norm", "its sublayers' outputs reach the stream through a norm or a multiplier (post-norm layers, "
                        "a residual multiplier)", "does not add its sublayers' outputs to the residual stream"),
    "softcap": Reason("soft-capped logits", "soft-capped final logits are not a sum of the stream's parts (gradients through them are "
                      "fine: AtP and EAP run)", "soft-capped logits"),
    "readout": Reason("readout", "the unembedding reads the last layer through more than a norm and a fixed scale (a dense "
                      "head, a norm without a gain)", "does not read the last layer's output through a final norm"),
    "chain": Reason("layer inputs", "a layer's input is not what the layer before it wrote (several streams, per-layer "
                    "inputs, cross-attention layers that run only with an image)",
                    "reads is not what layer"),
    "per-layer": Reason("per-layer inputs", "a sublayer reads per-layer token inputs beside the stream",
                        "was not seen reading the residual stream"),
    "gate": Reason("output gate", "a sigmoid output gate that depends on the input, so a head has no fixed OV circuit",
                   "sigmoid output gate"),
    "ov": Reason("no OV", "a head's OV circuit is not available (no adapter for its layout)",
                 "composition scores need every head's OV circuit"),
    "audio": Reason("audio input", "the encoder reads audio features, not a task's token ids", "not token ids"),
}

_POST_NORM_ENCODERS = ("bert", "roberta", "electra", "xlm-roberta", "camembert", "data2vec-text", "xlm-roberta-xl",
                       "ernie", "roc_bert", "xmod", "nomic_bert", "distilbert")
_POST_NORM = dict(dla="post-norm", eap="post-norm")
_READOUT = dict(dla="readout", eap="readout")
_CHAIN = dict(dla="chain", eap="chain")
_GATE = dict(composition="gate")

REFUSED = {
    **{family: _POST_NORM for family in _POST_NORM_ENCODERS},
    "bart": _POST_NORM, "marian": _POST_NORM, "blenderbot-small": _POST_NORM, "plbart": _POST_NORM,
    "minicpm3": _POST_NORM, "minimax": _POST_NORM,
    "zamba2": dict(_POST_NORM, composition="ov"),
    "modernbert": _READOUT, "olmo": _READOUT, "nanochat": _READOUT,
    "gemma3n_text": _CHAIN, "hy_v4": dict(_CHAIN, composition="ov"),
    "gemma4_text": dict(eap="per-layer"), "gemma4": dict(eap="per-layer"),
    "gemma2": dict(dla="softcap"), "vaultgemma": dict(dla="softcap"),
    "afmoe": dict(composition="ov"), "doge": dict(composition="ov"), "laguna": dict(composition="ov"),
    "qwen3_next": _GATE, "qwen3_5_text": _GATE, "qwen3_5_moe_text": _GATE, "qwen3_5": _GATE, "qwen3_5_moe": _GATE,
    "lfm3": _GATE,
    "whisper": dict(dla="audio", atp="audio", eap="audio", composition="audio"),
    "bart_causal_lm": _POST_NORM, "mllama": _CHAIN, "mllama_text_model": _CHAIN,
}


def methods_of(model_type: str) -> dict:
    """`{method: None (runs) or a key of REASONS}` of a family on the attention interface."""
    refused = REFUSED.get(model_type, {})
    return {method: refused.get(method) for method in METHODS}


def method_cell(reason) -> str:
    """A table cell: "yes", or "no (<the reason's label>)"."""
    return "yes" if reason is None else f"no ({REASONS[reason].label})"


def methods_legend() -> str:
    """What each refusal label in the table means (Markdown)."""
    lines = [f"- **{reason.label}**: {reason.text}." for reason in REASONS.values()]
    return "Circuit methods: *DLA* `logit_attribution`, *AtP* `attribute` (AtP, AtP*, exact), *EAP* `circuit` " \
           "(EAP, EAP-IG and `Circuit.evaluate`), *composition* `composition`. Where a family says no:\n\n" + "\n".join(lines)
