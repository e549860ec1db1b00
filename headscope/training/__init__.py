"""Heads over training: a timeline of head scores while a model trains, and across checkpoints.

- `timeline`: `Timeline` (`.record(model, step)` in a plain PyTorch loop, `.save(out)`), the
  timeline tables, `untouched` (modes, grad mode and random states given back).
- `callback`: `HeadscopeCallback`, the `transformers.TrainerCallback` that records a `Timeline`
  every few optimizer steps, logs its summary and writes it at every save.
- `icl`: Olsson et al.'s in-context-learning score at positions scaled to the sequence length.
- `timeline_probes`: the small probes of a timeline, from token ids when there is no text tokenizer.
- `checkpoints`: the steps of a Trainer output folder, model folders or hub revisions.
- `report`: a timeline folder's HTML page (data -> figures -> html).
- `toy`: the reproduction's task (a random segment repeated at a varying distance) and tiny Llamas.
"""
