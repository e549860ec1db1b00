"""Silence as an audio encoder reads it, for analysing an encoder-decoder whose encoder takes audio.

- `silence_log_mel(n_mel_bins, n_frames)`: `[mel bin, frame]` the log-mel features Whisper's
  feature extractor makes from an all-zero waveform (every entry `SILENCE_LOG_MEL`).
- `SilentAudio`: those features at the sizes one model's encoder takes, with the encoder
  positions that cross-attention reads (`features(n)`, `key_tokens()`, `description`).

Whisper's encoder (Radford et al. 2022) reads log-mel `input_features`, not tokens. At its
decoder's sites `headscope.analyze` runs the text probes through the decoder and feeds the
encoder this fixed input, the same for every example and for the control twin, so the decoder's
attention is read with an encoder that heard nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SILENCE_LOG_MEL", "silence_log_mel", "SilentAudio"]

MEL_FLOOR = 1e-10  # transformers' WhisperFeatureExtractor: clamp(mel, min=1e-10) before log10
# A zero waveform has zero power at every frequency, so every mel energy is the floor and every
# entry, and the maximum, is log10(1e-10) = -10: the dynamic-range clamp max(x, max - 8) keeps it,
# and the scale (x + 4) / 4 gives (-10 + 4) / 4 = -1.5.
SILENCE_LOG_MEL = (math.log10(MEL_FLOOR) + 4.0) / 4.0


def silence_log_mel(n_mel_bins: int, n_frames: int):
    """The log-mel features of an all-zero waveform, as transformers' `WhisperFeatureExtractor`
    makes them (`_torch_extract_fbank_features`, `_np_extract_fbank_features`), with its default
    dither of 0:

        mel = mel_filters.T @ |stft(waveform)|**2          # 0 everywhere for silence
        x = log10(clamp(mel, min=1e-10))                    # -10 everywhere
        x = maximum(x, x.max() - 8.0)                       # -10 (the max is -10)
        x = (x + 4.0) / 4.0                                 # -1.5

    so every entry is `SILENCE_LOG_MEL` (-1.5) whatever the number of mel bins and frames.

    Args:
        n_mel_bins: mel bins (Whisper's `config.num_mel_bins`: 80, or 128 for large-v3).
        n_frames: frames (Whisper's encoder takes `2 * config.max_source_positions`, 3000 for 30 s).
    Returns:
        A float32 tensor `[n_mel_bins, n_frames]`.
    """
    import torch  # heavy: only when features are made

    return torch.full((n_mel_bins, n_frames), SILENCE_LOG_MEL, dtype=torch.float32)


@dataclass(frozen=True)
class SilentAudio:
    """The silent input of one audio encoder.

    Attributes:
        n_mel_bins, n_frames: the features' sizes (`[mel bin, frame]`) the encoder takes.
        n_positions: the encoder's output positions, the keys of cross-attention (Whisper's
            convolutions halve the frames: `max_source_positions`).
    """

    n_mel_bins: int
    n_frames: int
    n_positions: int

    def features(self, n: int):
        """`[n, n_mel_bins, n_frames]` the same silence for each of `n` examples."""
        return silence_log_mel(self.n_mel_bins, self.n_frames).expand(n, -1, -1)

    def key_tokens(self) -> list[str]:
        """What the report's explorer shows at each encoder position (cross-attention's keys)."""
        return [f"silence {j}" for j in range(self.n_positions)]

    @property
    def description(self) -> str:
        return (f"silence log-mel (a zero waveform's features, every entry {SILENCE_LOG_MEL:g}), "
                f"{self.n_mel_bins} mel bins x {self.n_frames} frames, {self.n_positions} encoder positions")
