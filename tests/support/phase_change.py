"""The phase-change run of tests/training/test_phase_change.py, trained once per test session.

`train_phase(n_layers, steps, folder, callbacks)`: the tiny Llama of `headscope.training.toy`
trained on the benchmark's seed-0 data (one thread, batch 64, AdamW lr 1e-3); returns its losses
and the trained model. `held_out()`: the 64 rows the callbacks measure the ICL score on.
`labelled_heads(timeline)`: the previous-token heads of layer 0 and the induction heads of layer 1
that the callback's timeline labels at its last record, as circuit node names.
"""
import pandas as pd
import torch

from headscope.training.toy import repeated_segments, tiny_llama, train_toy

__all__ = ["STEPS", "EVERY", "SEED", "train_phase", "held_out", "labelled_heads"]

STEPS, EVERY, SEED = 340, 20, 0
ROWS = 600 * 64  # the benchmark's data: the first STEPS steps are its seed-0 run's


def train_phase(n_layers: int, steps: int, folder, callbacks):
    """`(losses, model)` of the toy model trained for `steps` steps (module docstring)."""
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    ids, _ = repeated_segments(ROWS, torch.Generator().manual_seed(SEED))  # the same rows and order whatever `steps`
    model = tiny_llama(n_layers)
    losses = train_toy(model, ids, steps, folder, callbacks, seed=SEED)
    return losses, model.eval()


def held_out() -> torch.Tensor:
    return repeated_segments(64, torch.Generator().manual_seed(10_000 + SEED))[0]


def labelled_heads(timeline) -> tuple[set, set]:
    """`(previous-token heads of layer 0, induction heads of layer 1)` labelled at the last record,
    as `a{layer}.h{head}`."""
    labels = pd.read_csv(timeline / "labels.csv")
    last = labels[labels.step == labels.step.max()]
    previous = {f"a0.h{h}" for h in last[(last.layer == 0) & (last.label == "previous_token")]["head"]}
    induction = {f"a1.h{h}" for h in last[(last.layer == 1) & (last.label == "induction")]["head"]}
    return previous, induction
