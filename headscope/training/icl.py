"""Olsson et al.'s in-context-learning score, at positions scaled to the sequence length.

    icl_score = mean over examples of  loss(token late) - loss(token early)

with loss(token t) = -log p(x_t | x_<t), the model's next-token loss at position t. Olsson et
al. 2022 ("In-context Learning and Induction Heads") take the 500th and the 50th token of
512-token contexts; the score falls from about -0.15 before induction heads form to about -0.4
nats after (later tokens gain from the context). Here the two positions keep Olsson's share of
the sequence length T: early = round(50 / 512 * T), late = round(500 / 512 * T), each within
[1, T - 1] (token 6 and 60 of a 61-token sequence; 6 and 62 of 64).

- `icl_positions(length)` -> (early, late).
- `token_losses(model, input_ids)` -> `[example, pos]` loss of each token (0 at position 0).
- `icl_score(model, input_ids)` -> (score, mean loss over every predicted token).
"""
from __future__ import annotations

import torch

__all__ = ["icl_positions", "token_losses", "icl_score", "OLSSON_EARLY", "OLSSON_LATE", "OLSSON_CONTEXT"]

OLSSON_EARLY, OLSSON_LATE, OLSSON_CONTEXT = 50, 500, 512


def icl_positions(length: int) -> tuple[int, int]:
    """Olsson's token 50 and token 500 of 512, scaled to `length` tokens."""
    if length < 3:
        raise ValueError(f"the ICL score needs sequences of at least 3 tokens, got {length}")
    clamp = lambda t: min(max(t, 1), length - 1)
    early = clamp(round(OLSSON_EARLY / OLSSON_CONTEXT * length))
    late = clamp(round(OLSSON_LATE / OLSSON_CONTEXT * length))
    return early, late  # early < late for every length >= 3


@torch.no_grad()
def token_losses(model, input_ids: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """`[example, pos]` next-token loss of each token under a causal LM (position 0: 0, nothing predicts it)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, input_ids.shape[0], batch_size):
        ids = input_ids[start:start + batch_size].to(device)
        logits = model(input_ids=ids).logits.float()  # (B, T, V)
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]  # (B, T - 1): loss of token t from tokens < t
        out.append(torch.cat([torch.zeros_like(nll[:, :1]), nll], dim=1).cpu())
    return torch.cat(out)


def icl_score(model, input_ids: torch.Tensor, batch_size: int = 16) -> tuple[float, float]:
    """(ICL score, mean loss over tokens 1 .. T-1) of `input_ids` `[example, pos]`."""
    losses = token_losses(model, input_ids, batch_size)
    early, late = icl_positions(input_ids.shape[1])
    return float((losses[:, late] - losses[:, early]).mean()), float(losses[:, 1:].mean())
