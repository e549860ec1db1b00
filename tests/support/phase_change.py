"""The phase-change run of tests/training/test_phase_change.py, trained once per test session.

`train_phase(n_layers, steps, folder, callbacks)`: the tiny Llama of `headscope.training.toy`
trained on the benchmark's seed-0 data (one thread, batch 64, AdamW lr 1e-3); returns its losses
and the trained model. `held_out()`: the 64 rows the callbacks measure the ICL score on.
"""
import torch

from headscope.training.toy import repeated_segments, tiny_llama, train_toy

__all__ = ["STEPS", "EVERY", "SEED", "train_phase", "held_out"]

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
