"""Which model families headscope runs inside, and what works on each: data, not prose.

`family_table()` lists one `FamilyRow` per `config.model_type` with an adapter (read from
`headscope.hf.adapters.ADAPTERS`), the families tested without an adapter of their own
(`DISCOVERED`: vision-language models), one for any other model on transformers' attention interface, and the
families known to bypass the interface. `headscope models --families` prints it,
README.md holds it as `family_markdown()`, and tests/hf/test_families.py checks every row against
tiny models of each family (capture, ablate, lazy analyze, verify; the encoder-decoders' site
groups in tests/hf/test_encoder_decoders.py, the vision towers in tests/hf/test_vision_towers.py).
A row's `sites` names the groups of attention sites that capture, ablate, hooks and patch
address (`headscope.hf.sites`), the default first; its `analyze_sites` the groups analyze runs
at where not the default (an audio encoder's family: its decoder's, the encoder fed silence). A
vision-language row's notes say whether from_hf/verify reach its vision tower at sites="vision"
(`VISION_TOWERS`: the tower's config model type, described by `VISION_ADAPTERS` or not).
"""
from __future__ import annotations

from typing import NamedTuple

from .adapters import ADAPTERS, VISION_ADAPTERS
from .family_methods import METHODS, TITLES, method_cell, methods_legend, methods_of

__all__ = ["FamilyRow", "family_table", "family_markdown", "method_counts", "OUTSIDE_INTERFACE", "OTHER", "DISCOVERED", "VISION_TOWERS"]

OTHER = "any other"
# Families whose attention never calls transformers' attention interface
# (`_can_set_attn_implementation()` is False): headscope refuses them in one line.
OUTSIDE_INTERFACE = ("falcon", "bloom", "mpt", "gpt_neo")

_VLM = ("vision-language: its text decoder (text_config) with text-only probes; the vision tower is the "
        "opt-in stack sites=\"vision\" (bidirectional self-attention over the image's patches)")
_VLM_TEXT = ("vision-language: its text decoder ({}) with text-only probes; the vision tower is the opt-in stack "
             "sites=\"vision\" (bidirectional self-attention over the image's patches)")
_GATED_HYBRID = ": gated attention beside Gated DeltaNet layers, captured under the model's layer numbers"
_PACKED = ("; its vision attention runs once per image or window over one packed sequence of all images' patches "
           "(cu_seqlens): a layer's map is [1, head, patch, patch], block-diagonal, in the tower's window order; "
           "hook_z is the only hook point there")
_PACKED_IMAGES = ("; its vision attention runs once per image over one packed sequence of all images' patches "
                  "(cu_seqlens), without windows: a layer's map is [1, head, patch, patch], block-diagonal by image, in "
                  "input order; hook_z is the only hook point there")
# Families with no adapter of their own, each tested on a tiny model (tests/hf/test_hybrids_and_composites.py);
# a third item True: from_hf/verify work through the text decoder's adapter (gemma3_text, llama,
# qwen2_5_vl_text for qwen2_vl too, mllama_text_model, qwen3_5_text, qwen3_5_moe_text, qwen3_vl_text,
# qwen3_vl_moe_text, gemma4_text);
# a fourth:
# its groups of attention sites where not only "text".
_WITH_VISION = "text, vision"  # the text decoder (the default), the vision tower (tests/hf/test_vision_towers.py)
_WITH_CROSS = "text, text.self, text.cross"  # the text stack holds self- and cross-attention layers
DISCOVERED = (
    ("gemma3", _VLM, True, _WITH_VISION),
    ("llava", _VLM, True, _WITH_VISION),
    ("llava_next", _VLM, True, _WITH_VISION),
    ("llava_onevision", _VLM, True, _WITH_VISION),
    ("internvl", _VLM, True, _WITH_VISION),
    ("lfm2_vl", _VLM_TEXT.format("lfm2: attention beside convolution layers, captured under the model's layer numbers"),
     True, _WITH_VISION),
    ("cohere2_vision", _VLM, True, _WITH_VISION),
    ("paligemma", _VLM, True, _WITH_VISION),
    ("aya_vision", _VLM, True, _WITH_VISION),
    ("vipllava", _VLM, True, _WITH_VISION),
    ("mistral3", _VLM + "; its vision tower runs every image's patches as one sequence, a block-diagonal mask keeping "
                        "each image's patches to themselves: a layer's map is [1, head, patch, patch] over all images",
     True, _WITH_VISION),
    ("idefics3", _VLM, True, _WITH_VISION),
    ("smolvlm", _VLM, True, _WITH_VISION),
    ("qwen2_5_vl", _VLM + _PACKED, True, _WITH_VISION),
    ("qwen3_5", _VLM_TEXT.format("qwen3_5_text" + _GATED_HYBRID) + _PACKED_IMAGES, True, _WITH_VISION),
    ("qwen3_5_moe", _VLM_TEXT.format("qwen3_5_moe_text" + _GATED_HYBRID) + _PACKED_IMAGES, True, _WITH_VISION),
    ("qwen2_vl", _VLM_TEXT.format("qwen2_vl_text") + _PACKED_IMAGES, True, _WITH_VISION),
    ("qwen3_vl", _VLM_TEXT.format("qwen3_vl_text") + _PACKED_IMAGES, True, _WITH_VISION),
    ("glm4v", _VLM_TEXT.format("glm4v_text") + _PACKED_IMAGES, True, _WITH_VISION),
    ("glm4v_moe", _VLM_TEXT.format("glm4v_moe_text") + _PACKED_IMAGES, True, _WITH_VISION),
    ("qwen3_vl_moe", _VLM_TEXT.format("qwen3_vl_moe_text") + _PACKED_IMAGES, True, _WITH_VISION),
    ("gemma4", _VLM_TEXT.format("gemma4_text"), True, _WITH_VISION),
    ("mllama", _VLM + "; its vision layers numbered local then global; its cross-attention layers never run "
               "without an image: reported as not run, skipped by analyze with a note, an error to ablate, hook "
               "or verify",
     True, _WITH_CROSS + ", vision"),
)


# The model type of each vision-language family's vision config (`config.vision_config.model_type`): where
# `VISION_ADAPTERS` describes it, from_hf and verify work at sites="vision" (tests/hf/test_vision_towers.py).
VISION_TOWERS = {"gemma3": "siglip_vision_model", "llava": "clip_vision_model", "mllama": "mllama_vision_model",
                 "idefics3": "idefics3_vision", "smolvlm": "smolvlm_vision", "paligemma": "siglip_vision_model",
                 "llava_next": "clip_vision_model", "llava_onevision": "siglip_vision_model",
                 "internvl": "internvl_vision", "lfm2_vl": "siglip2_vision_model", "cohere2_vision": "siglip_vision_model",
                 "aya_vision": "siglip_vision_model", "vipllava": "clip_vision_model", "mistral3": "pixtral",
                 "qwen2_5_vl": "qwen2_5_vl_vision", "qwen3_5": "qwen3_5_vision", "qwen3_5_moe": "qwen3_5_moe_vision",
                 "qwen2_vl": "qwen2_vl_vision", "qwen3_vl": "qwen3_vl_vision", "qwen3_vl_moe": "qwen3_vl_moe_vision",
                 "glm4v": "glm4v_vision", "glm4v_moe": "glm4v_moe_vision",
                 "gemma4": "gemma4_vision"}


def _vision_note(model_type: str) -> str:
    """Where from_hf/verify reach a family's vision tower ("" for a family without one)."""
    tower = VISION_TOWERS.get(model_type)
    if tower is None:
        return ""
    adapter = next((a for a in VISION_ADAPTERS if tower in a.model_types), None)
    if adapter is None:
        return f"; from_hf/verify not available at sites=\"vision\" (no adapter for {tower})"
    return f"; from_hf/verify at sites=\"vision\" through its tower's adapter ({tower}: {adapter.notes})"


class FamilyRow(NamedTuple):
    model_type: str
    capture: bool  # capture, ablate, model_hooks, cache_activations and patch
    verify: bool  # MultiHeadAttention.from_hf and verify
    notes: str
    analyze: bool = True  # headscope analyze, at the default sites
    sites: str = "text"  # the groups of attention sites, default first (headscope.hf.sites)
    analyze_sites: str = ""  # where analyze runs at other groups only (whisper: the decoder's, with silent audio)


def _site_groups(adapter) -> str:
    """The default group, then the others; where the default stack also holds other groups' sites
    (mllama's cross-attention layers among its self-attention ones), its self-attention is a group too."""
    mixed = not adapter.default_sites and any(g.stack == adapter.stack for g in adapter.groups)
    own = [adapter.default_sites or adapter.stack] + ([f"{adapter.stack}.self"] if mixed else [])
    return ", ".join(own + [f"{g.stack}.{g.kind}" for g in adapter.groups])


def _analyze_sites(adapter) -> str:
    """The groups analyze runs at when it refuses the default one: an audio encoder's decoder."""
    if adapter.audio_encoder is None:
        return ""
    return ", ".join(f"{g.stack}.{g.kind}" for g in adapter.groups) + " (silent audio)"


def family_table() -> tuple[FamilyRow, ...]:
    rows = [FamilyRow(t, True, not a.no_from_hf, a.notes, not a.no_analyze, _site_groups(a), _analyze_sites(a))
            for a in ADAPTERS for t in ((a.family,) if a.decoder_only else a.model_types)]
    for model_type, notes, *extra in DISCOVERED:
        verify, groups = tuple(extra) + (False, "text")[len(extra):]
        vision = _vision_note(model_type)
        text = " of its text decoder" if vision else ""
        how = "; from_hf/verify through its text decoder's adapter" if verify else f"; from_hf/verify{text} need an adapter"
        rows.append(FamilyRow(model_type, True, verify, notes + how + vision, sites=groups))
    rows.append(FamilyRow(OTHER, True, False, "any model whose attention modules call the interface, each in its own "
                                               "entry of the text decoder's layer list (layers without attention are "
                                               "allowed); encoder-decoders need an adapter; from_hf/verify need an "
                                               "adapter"))
    rows += [FamilyRow(t, False, False, "attention bypasses the interface (_can_set_attn_implementation() is False)",
                       False, "")
             for t in OUTSIDE_INTERFACE]
    return tuple(rows)


def _method_cells(row: FamilyRow) -> str:
    if row.model_type == OTHER:  # not measurable as one family: what the adapter-less case allows
        return " | ".join(["needs an adapter", "yes", "needs an adapter", "needs an adapter"])
    if not row.capture:
        return " | ".join("no" for _ in METHODS)
    methods = methods_of(row.model_type)
    return " | ".join(method_cell(methods[m]) for m in METHODS)


def method_counts() -> str:
    """One sentence: on how many of the families on the attention interface each circuit method runs."""
    rows = [r for r in family_table() if r.capture and r.model_type != OTHER]
    runs = {m: sum(methods_of(r.model_type)[m] is None for r in rows) for m in METHODS}
    return (f"Of the {len(rows)} families on transformers' attention interface, DLA runs on {runs['dla']}, "
            f"AtP on {runs['atp']}, EAP and EAP-IG on {runs['eap']} and composition on {runs['composition']}.")


def family_markdown() -> str:
    """The table as Markdown, then what its circuit methods' refusals mean (`headscope.hf.family_methods`)."""
    yes = {True: "yes", False: "no"}
    titles = " | ".join(TITLES[m] for m in METHODS)
    lines = [f"| family | capture / ablate | from_hf / verify | analyze | sites | {titles} | notes |",
             "|---|---|---|---|---|" + "---|" * len(METHODS) + "---|"]
    lines += [f"| {r.model_type} | {yes[r.capture]} | {yes[r.verify]} | {r.analyze_sites or yes[r.analyze]} | "
              f"{r.sites or '-'} | {_method_cells(r)} | {r.notes} |" for r in family_table()]
    return "\n".join(lines) + "\n\n" + methods_legend() + "\n\n" + method_counts()
