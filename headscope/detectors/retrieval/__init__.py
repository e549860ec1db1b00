"""retrieval: heads that copy a needle from far back (Wu et al. 2024, retrieval heads).

Not a pattern detector: on needle-in-a-haystack prompts (`headscope.probes.kinds.NeedleProbe`)
it reads the answer queries' argmax keys and the model's own predictions, so it runs its own
forward passes (`Detector.run`), with no `[query, key]` map at any length. Per example,
    #{answer tokens the model predicts whose query's argmax key is that token inside the needle} / |needle|,
examples the model gets less than half right left out; label at >= 0.1 (their threshold) with
the CI lower bound above the control's best head. Opt-in (`--detectors retrieval`): the
prompts are thousands of tokens. Defined in `scoring.py` (`RETRIEVAL`), with `validate_retrieval`.
"""
