"""Probes: the inputs detectors are measured on.

- `base`: `ProbeBatch` (what a detector sees of one batch), `EvalProbe`, the special-token
  rule, the bundled natural text and the repeated-token sequences.
- `kinds`: the probe settings `analyze` takes (`TextProbe`, `RepeatedProbe`, `TreebankProbe`,
  `NeedleProbe`, `CopyProbe`) and `PROBE_KINDS`, the kind of probe a detector names.
- `copy`: the copy probe of encoder-decoders (`Seq2SeqBatch`: both inputs, a `ProbeBatch` per
  site kind).
- `treebank`: `TreebankProbe`, sentences aligned to tokens, with their dependency arcs.
- `conllu`: reading CoNLL-U files (the bundled treebank included).
- `align`: sub-word tokens to words through offsets.
- `needle`: needle-in-a-haystack prompts.
- `tokens`: tokens as shown to a person.
"""
