"""Tiny BART encoder-decoders for the cross-attention detectors: a random-init one, one with a
planted alignment head, and one whose planted head also copies.

- `random_bart(seed)`: `BartForConditionalGeneration`, vocab 99 (the planted char tokenizer's),
  d_model 48, 2 + 2 layers, 3 heads of 16, eager attention (so `output_attentions` returns
  the maps), random init.
- `planted_bart(seed)`: the same with hand-set weights where cross-attention head 0.0 attends
  from decoder position i to encoder position i, and every other head keeps its random init.
  Its logits are 0 (token embeddings and every output projection are zero): the head is seen,
  never used.
- `planted_copying_bart(seed)`: `planted_bart` whose head 0.0 also copies encoder token i into
  decoder position i, the only way the model predicts it (validate's ground truth).

How the head is planted: token embeddings are 0, so both stacks' hidden states are their
position embeddings, set to the same `[position, 48]` matrix P, whose rows are random
directions of a 16-dimensional subspace orthogonal to the all-ones vector, scaled to variance
1, so every LayerNorm (weight 1, bias 0) leaves them unchanged. Every sublayer's output
projection (self-attention out_proj, cross-attention out_proj, fc2) is zero, so the residual
stream stays P through both stacks. Head 0.0's query and key projections map onto that
subspace's coordinates U^T (scaled by `GAIN` on the query side), so its score for decoder i and
encoder j is GAIN * P_i . P_j / sqrt(16): largest at j = i.
"""
import torch

__all__ = ["random_bart", "planted_bart", "planted_copying_bart", "D_MODEL", "HEADS", "GAIN", "TOKEN_NORM", "COPY_GAIN"]

D_MODEL, HEADS, HEAD_DIM, MAX_POSITIONS = 48, 3, 16, 64
GAIN = 4.0


def random_bart(seed: int):
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    config = BartConfig(vocab_size=99, d_model=D_MODEL, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, max_position_embeddings=MAX_POSITIONS, pad_token_id=0, bos_token_id=2,
                        eos_token_id=1, decoder_start_token_id=2, attn_implementation="eager")
    return BartForConditionalGeneration(config).eval()


def _positions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P `[MAX_POSITIONS, D_MODEL]` (rows of mean 0 and variance 1) and U `[D_MODEL, HEAD_DIM]`,
    an orthonormal basis of the subspace the rows lie in."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.randn(D_MODEL, HEAD_DIM + 1, generator=gen)
    basis[:, 0] = 1.0  # orthogonalised against the all-ones vector, then dropped
    u = torch.linalg.qr(basis).Q[:, 1:]  # (D_MODEL, HEAD_DIM)
    directions = torch.nn.functional.normalize(torch.randn(MAX_POSITIONS, HEAD_DIM, generator=gen), dim=-1)
    return directions @ u.T * D_MODEL ** 0.5, u  # norm sqrt(48): variance 1 over 48 dims, mean 0


@torch.no_grad()
def planted_bart(seed: int = 0):
    model = random_bart(seed)
    p, u = _positions(seed)
    inner = model.model
    inner.shared.weight.zero_()  # token embeddings (shared by both stacks) carry nothing
    for stack in (inner.encoder, inner.decoder):
        offset = stack.embed_positions.offset
        stack.embed_positions.weight.zero_()
        stack.embed_positions.weight[offset:offset + MAX_POSITIONS] = p
        for layer in stack.layers:
            blocks = [layer.self_attn] + ([layer.encoder_attn] if hasattr(layer, "encoder_attn") else [])
            for attention in blocks:
                attention.out_proj.weight.zero_()
                attention.out_proj.bias.zero_()
            layer.fc2.weight.zero_()
            layer.fc2.bias.zero_()
    cross = inner.decoder.layers[0].encoder_attn
    cross.q_proj.weight[:HEAD_DIM] = GAIN * u.T
    cross.k_proj.weight[:HEAD_DIM] = u.T
    cross.q_proj.bias[:HEAD_DIM] = 0.0
    cross.k_proj.bias[:HEAD_DIM] = 0.0
    return model


TOKEN_NORM, COPY_GAIN = 3.0, 4.0


@torch.no_grad()
def planted_copying_bart(seed: int = 0):
    """`planted_bart` whose alignment head 0.0 also copies: token embeddings (tied to the LM head)
    are rows of norm `TOKEN_NORM` in a 16-dimensional subspace T orthogonal to the positions' and
    to the all-ones vector (so LayerNorms only rescale), head 0.0's value reads T's coordinates
    and its output projection writes them back times `COPY_GAIN`. Decoder position i then holds
    the token it read (i - 1) plus `COPY_GAIN` times encoder token i, so the LM head predicts
    token i; without head 0.0 nothing carries it. Every other output projection stays zero."""
    model = planted_bart(seed)
    _, u = _positions(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    ones = torch.ones(D_MODEL, 1) / D_MODEL ** 0.5
    frame = torch.linalg.qr(torch.cat([ones, u, torch.randn(D_MODEL, HEAD_DIM, generator=gen)], dim=1)).Q
    tokens = frame[:, 1 + HEAD_DIM:]  # (D_MODEL, HEAD_DIM): T, orthogonal to ones and to U
    directions = torch.nn.functional.normalize(torch.randn(model.config.vocab_size, HEAD_DIM, generator=gen), dim=-1)
    model.model.shared.weight.copy_(TOKEN_NORM * directions @ tokens.T)  # (vocab, D_MODEL)
    cross = model.model.decoder.layers[0].encoder_attn
    cross.v_proj.weight[:HEAD_DIM] = tokens.T
    cross.v_proj.bias[:HEAD_DIM] = 0.0
    cross.out_proj.weight[:, :HEAD_DIM] = COPY_GAIN * tokens
    return model
