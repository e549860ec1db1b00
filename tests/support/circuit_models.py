"""Small models and tasks for the circuit tests: `random_task(seed)` (clean prompts of random tokens,
corrupted after position 2, random answers) and `scaled(model, std, seed)` (every matrix drawn
again at a scale where heads attend sharply enough for edges to matter)."""
import torch

from headscope.circuits.tasks import Task

from tests.support.tiny import VOCAB

__all__ = ["N", "LENGTH", "random_task", "scaled"]

N, LENGTH = 5, 8


def random_task(seed: int = 0, n: int = N, length: int = LENGTH) -> Task:
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, VOCAB, (n, length), generator=gen)
    corrupted = clean.clone()
    corrupted[:, 2:] = torch.randint(3, VOCAB, (n, length - 2), generator=gen)
    answer = torch.randint(3, 50, (n,), generator=gen)
    return Task(clean=clean, corrupted=corrupted, answer=answer, wrong=answer + 40)


def scaled(model, std: float, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model
