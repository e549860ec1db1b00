"""What `analyze` feeds a decoder's sites: each probe as an encoder-decoder's teacher-forced copy.

- `silent_audio(loaded)`: what an encoder that reads audio hears there (the adapter's
  `audio_encoder`, Whisper's): the log-mel features of silence (`headscope.probes.audio`); None
  for an encoder of tokens.
- `as_copies(loaded, built, groups, named, given, audio)`: each built probe as a copy input
  (`headscope.probes.copy.as_copy`), the probes that cannot be one and their detectors left out
  with the reason.
- `silence_note(loaded, plan)`: the note saying what the audio encoder heard and, at
  cross-attention, which detectors that leaves.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CannotScore
from ..hf.adapters import adapter_for
from ..probes.audio import SilentAudio
from ..probes.copy import CopySet, as_copy
from ..probes.kinds import decoder_start

__all__ = ["silent_audio", "as_copies", "silence_note"]


def silent_audio(loaded) -> Optional[SilentAudio]:
    """What the encoder hears at a decoder's sites when it reads audio (the adapter's
    `audio_encoder`): silence at the sizes the config gives; None for an encoder of tokens, or
    sites that need no encoder input."""
    adapter = adapter_for(loaded.model.config)
    if not loaded.two_inputs or adapter is None or adapter.audio_encoder is None:
        return None
    return SilentAudio(*adapter.audio_encoder.sizes(loaded.model.config))


def as_copies(loaded, built, groups, named, given, audio=None):
    """Each built probe as an encoder-decoder's copy input (`as_copy`, the encoder hearing
    `audio` where it reads audio); among the defaults, a probe that cannot be one leaves its
    detectors out, saying why (named ones raise). A copy of the encoder's tokens (the copy
    probe) has nothing to copy from an encoder that hears silence: its detectors are left out
    even when its settings were given (the command line always gives them).

    Returns:
        (copies by probe name, skipped detector -> why, the detectors left out because the
        encoder hears silence)."""
    copies, skipped, unheard = {}, {}, []
    start = decoder_start(loaded)
    for name, probe in built.items():
        try:
            copies[name] = as_copy(probe, start, audio)
        except CannotScore as err:
            silent = audio is not None and isinstance(probe, CopySet)
            if named or (not silent and any(p.name == name for p in given)):  # asked for: say why it cannot run
                raise
            skipped.update({d.name: str(err) for d in groups[name]})
            unheard += [d.name for d in groups[name]] if silent else []
    return copies, skipped, tuple(unheard)


def silence_note(loaded, plan) -> str:
    """What an audio encoder heard, for `meta["notes"]`; at cross-attention, which detectors that
    leaves (those whose probe needs no encoder tokens) and which it left out."""
    note = (f"encoder input: {plan.audio.description}, the same in every example and in the control twin; the "
            f"decoder's attention is read with an encoder that heard nothing")
    if loaded.site_kind != "cross":
        return note
    left_out = f"; left out: {', '.join(plan.unheard)} (needs the encoder to read the copied tokens)" if plan.unheard \
        else ""
    kept = ", ".join(d.name for d in plan.detectors)
    return (f"{note}; cross-attention's keys are positions of that silence, so only detectors that read no encoder "
            f"tokens run ({kept}){left_out}")
