"""A tiny GPT-2 with hand-set weights and one planted head of each kind, plus a char tokenizer.

Residual stream layout (d_model = 600): token one-hot [0, 99), position one-hot [99, 147),
"previous token" one-hot [147, 246) written by the previous-token head. Every input to a
layer norm is then exactly two-hot (layer 0) or three-hot (layer 1, up to softmax leakage of
order e^-30), so the norm is a known affine map that the q/k/v weights and biases undo.

Planted heads (layer.head):
    0.0 previous_token   q_i = e_(i-1), k_j = e_j           (position one-hots)
    0.1 sink             q = const, k_j = e_0 only for j = 0
    0.2 uniform          q = k = 0
    0.3 self             q_i = e_i, k_j = e_j
    1.0 induction        q_i = e_(token i), k_j = e_(token j-1)   (reads 0.0's output)
    1.1 duplicate_token  q_i . k_j = [token i = token j] - 2 [i = j]
    1.2, 1.3             attend to a fixed set of tokens (a content pattern no detector names)
0.0 copies the previous token into the residual stream; 1.0 copies the attended token into
the token block with weight 3, so the model predicts repeated sequences by induction.
"""
import string

import torch

VOCAB, POSITIONS, D_MODEL, N_HEADS = 99, 48, 600, 4
D_HEAD = D_MODEL // N_HEADS
TOK, POS, PREV = 0, VOCAB, VOCAB + POSITIONS
GAIN = 400.0  # q.k of a hit; times 1/sqrt(150) gives a score gap of ~33
PLANTED = {(0, 0): "previous_token", (0, 1): "sink", (0, 2): "uniform", (0, 3): "self",
           (1, 0): "induction", (1, 1): "duplicate_token"}


def char_tokenizer():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # 95 printable + "\n" = 96
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2}
    for c in chars:
        vocab[c] = len(vocab)
    assert len(vocab) == VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]", pad_token="[PAD]")


def _norm_constants(n_hot: int, eps: float) -> tuple[float, float]:
    mean = n_hot / D_MODEL
    var = n_hot / D_MODEL - mean ** 2
    return mean, (var + eps) ** 0.5


def _set_attention(attn, raw_q, raw_k, raw_v, q_bias, n_hot, eps):
    """Write raw maps (defined on the un-normalised n-hot stream) into c_attn, undoing ln_1."""
    mean, std = _norm_constants(n_hot, eps)
    raw = torch.cat([raw_q, raw_k, raw_v], dim=1)  # (D, 3D), Conv1D layout x @ W
    bias = mean * raw.sum(0)  # cancels the -mean/std shift of the normalised input
    bias[:D_MODEL] += q_bias
    attn.c_attn.weight.copy_(raw * std)
    attn.c_attn.bias.copy_(bias)


def planted_model():
    import transformers as tf

    config = tf.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=D_MODEL, n_layer=2, n_head=N_HEADS,
                           n_inner=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=2,
                           eos_token_id=2, tie_word_embeddings=True)
    model = tf.GPT2LMHeadModel(config).eval()
    eps = config.layer_norm_epsilon
    cols = lambda head, i: head * D_HEAD + i
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in [model.transformer.ln_f] + [b.ln_1 for b in model.transformer.h] + [b.ln_2 for b in model.transformer.h]:
            ln.weight.fill_(1.0)
        model.transformer.wte.weight[:, :VOCAB] = torch.eye(VOCAB)
        model.transformer.wpe.weight[:, POS:POS + POSITIONS] = torch.eye(POSITIONS)

        z = lambda: torch.zeros(D_MODEL, D_MODEL)
        q, k, v, qb = z(), z(), z(), torch.zeros(D_MODEL)
        for p in range(POSITIONS):
            if p >= 1:
                q[POS + p, cols(0, p - 1)] = GAIN  # 0.0 previous token
            k[POS + p, cols(0, p)] = 1.0
            q[POS + p, cols(3, p)] = GAIN  # 0.3 self
            k[POS + p, cols(3, p)] = 1.0
        qb[cols(1, 0)] = GAIN  # 0.1 sink: constant query ...
        k[POS + 0, cols(1, 0)] = 1.0  # ... meets only position 0
        for t in range(VOCAB):
            v[TOK + t, cols(0, t)] = 1.0  # 0.0 carries the token it attends to
        _set_attention(model.transformer.h[0].attn, q, k, v, qb, n_hot=2, eps=eps)
        out = model.transformer.h[0].attn.c_proj.weight  # (D_in, D_out)
        for t in range(VOCAB):
            out[cols(0, t), PREV + t] = 1.0

        q, k, v, qb = z(), z(), z(), torch.zeros(D_MODEL)
        for t in range(VOCAB):
            q[TOK + t, cols(0, t)] = GAIN  # 1.0 induction: my token ...
            k[PREV + t, cols(0, t)] = 1.0  # ... meets keys whose previous token it is
            v[TOK + t, cols(0, t)] = 1.0
            q[TOK + t, cols(1, t)] = GAIN  # 1.1 duplicate: same token ...
            k[TOK + t, cols(1, t)] = 1.0
            if t % 3 == 0:
                k[TOK + t, cols(2, 0)] = 1.0  # 1.2 looks at tokens with id divisible by 3
            if t % 4 == 1:
                k[TOK + t, cols(3, 0)] = 1.0  # 1.3 looks at tokens with id 1 mod 4
        for p in range(POSITIONS):
            q[POS + p, cols(1, VOCAB + p)] = -2 * GAIN  # ... but not itself
            k[POS + p, cols(1, VOCAB + p)] = 1.0
        qb[cols(2, 0)] = GAIN / 10
        qb[cols(3, 0)] = GAIN / 10
        _set_attention(model.transformer.h[1].attn, q, k, v, qb, n_hot=3, eps=eps)
        out = model.transformer.h[1].attn.c_proj.weight
        for t in range(VOCAB):
            out[cols(0, t), TOK + t] = 3.0  # induction output outvotes the current token
    return model


def save_planted(folder):
    """Write the planted model and its tokenizer as a local model folder."""
    planted_model().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder
