"""A one-layer GPT-2 with hand-set weights for the argmax detectors (positional, rare_word).

Residual stream (d_model = 200): token one-hot [0, 99), position one-hot [99, 147); the input to
ln_1 is exactly two-hot, so the norm is a known affine map that the q/k/v weights undo (as in
planted.py). Uses planted.py's char tokenizer.

Planted heads (layer.head):
    0.0 positional:-2   q_i = e_(i-2), k_j = e_j            (position one-hots; `back` sets the 2)
    0.1 rare_word       q = const, k_j = rarity of token j   (rank of its count in the text probe
                                                             corpus, `headscope.probes.base.token_counts`)
    0.2 previous_token  q_i = e_(i-1), k_j = e_j
    0.3                 attends to tokens with id divisible by 3 (no detector names it)
"""
import torch

from headscope.probes.base import token_counts
from tests.support.planted import char_tokenizer

VOCAB, POSITIONS, D_MODEL, N_HEADS = 99, 48, 200, 4
D_HEAD = D_MODEL // N_HEADS
TOK, POS = 0, VOCAB
GAIN = 400.0
PLANTED = {(0, 0): "positional:-2", (0, 1): "rare_word", (0, 2): "previous_token"}


def rarity(tokenizer) -> torch.Tensor:
    """`[vocab]` in (0, 1]: 1 for the token least frequent in the text probe corpus, one step of
    1 / VOCAB less per rank (ties in count broken by id)."""
    counts = token_counts(tokenizer)[:VOCAB].double()
    rank = torch.empty(VOCAB)
    rank[torch.argsort(counts * VOCAB + torch.arange(VOCAB), stable=True)] = torch.arange(VOCAB, dtype=torch.float)
    return 1.0 - rank / VOCAB


def planted_positions_model(back: int = 2):
    """The model above, head 0.0 attending `back` tokens back (an offset head at -(period - 1)
    is what passes for induction on a repeated probe of one period)."""
    import transformers as tf

    config = tf.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=D_MODEL, n_layer=1, n_head=N_HEADS,
                           n_inner=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=2,
                           eos_token_id=2, tie_word_embeddings=True)
    model = tf.GPT2LMHeadModel(config).eval()
    cols = lambda head, i: head * D_HEAD + i
    rare = rarity(char_tokenizer())
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in (model.transformer.ln_f, model.transformer.h[0].ln_1, model.transformer.h[0].ln_2):
            ln.weight.fill_(1.0)
        model.transformer.wte.weight[:, TOK:TOK + VOCAB] = torch.eye(VOCAB)
        model.transformer.wpe.weight[:, POS:POS + POSITIONS] = torch.eye(POSITIONS)
        q, k, v = (torch.zeros(D_MODEL, D_MODEL) for _ in range(3))
        qb = torch.zeros(D_MODEL)
        for p in range(POSITIONS):
            if p >= back:
                q[POS + p, cols(0, p - back)] = GAIN  # 0.0 `back` tokens back
            if p >= 1:
                q[POS + p, cols(2, p - 1)] = GAIN  # 0.2 previous token
            k[POS + p, cols(0, p)] = 1.0
            k[POS + p, cols(2, p)] = 1.0
        qb[cols(1, 0)] = GAIN  # 0.1 constant query ...
        qb[cols(3, 0)] = GAIN / 10
        for t in range(VOCAB):
            k[TOK + t, cols(1, 0)] = float(rare[t])  # ... meets the rarest token it can see
            if t % 3 == 0:
                k[TOK + t, cols(3, 0)] = 1.0
        # Undo ln_1 on the two-hot input: x_norm = (x - mean) / std.
        mean = 2 / D_MODEL
        std = (2 / D_MODEL - mean ** 2 + config.layer_norm_epsilon) ** 0.5
        raw = torch.cat([q, k, v], dim=1)  # (D, 3D), Conv1D layout x @ W
        bias = mean * raw.sum(0)
        bias[:D_MODEL] += qb
        model.transformer.h[0].attn.c_attn.weight.copy_(raw * std)
        model.transformer.h[0].attn.c_attn.bias.copy_(bias)
    return model


def save_planted_positions(folder, back: int = 2):
    """Write the model and the char tokenizer as a local model folder."""
    planted_positions_model(back).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder
