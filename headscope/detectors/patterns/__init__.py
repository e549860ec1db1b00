"""The pattern detectors: one small module each, a formula over one layer's attention pattern.

induction, duplicate_token (their formulas shared in `copying`), previous_token, next_token,
self_token (the offset formula shared in `offsets`), positional, rare_word, sink, uniform, and
alignment (cross-attention only).
Each module defines its `Detector`; `headscope.detectors.registry.BUILTINS` lists them.
"""
