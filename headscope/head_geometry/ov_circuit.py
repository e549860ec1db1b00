"""OV copying: does a head's output raise the logit of the token it attends to? (Elhage et al. 2021)

A head's OV circuit maps a source token to logits: W_E W_V W_O W_U (`[vocab, vocab]`, row
convention x @ W; with GQA a query head uses its key/value head's W_V). It has rank <= d_head, so
it is never built whole: rows come in blocks of `block_size` tokens as
(W_E[rows] W_V) (W_O W_U), and its nonzero eigenvalues are those of the small matrix
W_O W_U W_E W_V (`[d_head, d_head]`; AB and BA share nonzero eigenvalues).

- copy_top1: share of source tokens t whose own logit is the strict maximum of row t (chance
  1 / vocab).
- positive_eig_share: sum of the positive real parts of the eigenvalues / sum of their moduli;
  1 for a copying circuit (all eigenvalues positive). Chance: 0.5 for a random matrix with real
  eigenvalues; with complex pairs less (about 0.32 for eigenvalues uniform in a disk).

A head whose z passes an output gate (`AttentionConfig.output_gate`: Qwen3-Next's z * sigmoid(W_gate x),
per element, from the query's input) has no such fixed circuit: its map is W_V diag(sigmoid(W_gate x))
W_O, which depends on the input, and dropping the gate scores a circuit the model never runs (a
positive diagonal between W_V and W_O can change the signs of the eigenvalues), so `head_ov_weights`
and `ov_copying` refuse such a model in one line and `analyze` notes the OV table as not computed.
They refuse in the same way a family whose adapter says its heads have no such circuit (`Adapter.no_ov`): zamba2's
shared attention block reads the hidden state joined to the embeddings (W_V is `[2 d_model, d_head]`)
and, above all, its output never reaches the residual stream linearly: o_proj's output passes the
block's RMSNorm, its MLP and a linear layer, and is added to the next Mamba mixer's input, not
to the residual, so W_O W_U scores a path the model does not have.

A norm over all heads' outputs before W_O (`AttentionConfig.pre_out_norm`: BitNet's attn_sub_norm,
W_O RMSNorm(z)) makes a head's map W_V diag(g) W_O / rms(z), with g its gain (per element, fixed)
and rms(z) the root mean square of all heads' z at the query's position. The gain is folded into
W_O always (it sits inside the circuit, like the gate, but does not depend on the input); the
scale 1 / rms(z) is left out, as the residual norms' per-token scales are: it is one positive number
per position, the same for every head, and multiplying a circuit by a positive number changes
neither copy_top1 nor positive_eig_share.

Layer norms are not included by default (treated as identity), and neither are biases: the
per-token scale of a norm multiplies a whole row and does not change copy_top1, but its gains
(and the final norm's) are left out, as in Elhage et al.'s simplified circuit. With
`fold_norms=True` the gains fold in: W_V -> diag(g_in) W_V with g_in the gain of the norm that
feeds the layer's attention, W_U -> diag(g_final) W_U (`headscope.head_geometry.norm_gains` finds both).

- `ov_copying(loaded, fold_norms=False)` -> DataFrame layer, head, copy_top1, positive_eig_share.
- `ov_scores(W_E, W_V, W_O, W_U)`: the two numbers for one head's matrices.
- `head_ov_weights(model)`: every head's W_V and W_O slices (GQA resolved).
- `ov_table(loaded, control, heads)`: what `analyze` stores as `Analysis.ov` (every head's
  eigenvalue share and its control twin's, norm gains folded; copy_top1 of `heads` on
  `OV_TOKENS` seeded tokens), or None and the reason when the model has no unembedding or adapter.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..attention.module import MultiHeadAttention
from ..errors import HeadscopeError
from ..checks import check_count, check_loaded
from ..hf.adapters import _sub, adapter_for, attention_blocks, block_adapter
from ..hf.layouts import conv1d, linear
from ..hf.sites import select
from .norm_gains import norm_gains

__all__ = ["ov_copying", "ov_scores", "head_ov_weights", "ov_table", "OV_TOKENS", "OV_COLUMNS"]

OV_TOKENS = 512  # source tokens copy_top1 is scored on in `analyze` (the eigenvalue share uses every token)
OV_COLUMNS = ["layer", "head", "copy_top1", "positive_eig_share", "control_positive_eig_share"]


@torch.no_grad()
def ov_scores(W_E: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, W_U: torch.Tensor,
              block_size: int = 4096, rows: Optional[torch.Tensor] = None,
              UE: Optional[torch.Tensor] = None) -> tuple[float, float]:
    """copy_top1 and positive_eig_share of one head.

    Args:
        W_E: `[vocab, d_model]` embedding; W_V: `[d_model, d_head]`; W_O: `[d_head, d_model]`;
        W_U: `[d_model, vocab]` unembedding (all as x @ W).
        block_size: source tokens per block of rows.
        rows: source token ids to score copy_top1 on (default: every token; none: copy_top1 is NaN).
        UE: W_U W_E (`[d_model, d_model]`), computed once per model: then the eigenvalues come
            from W_O (W_U W_E) W_V and only the sampled rows of W_E W_V are computed.
    """
    rows = torch.arange(W_E.shape[0], device=W_E.device) if rows is None else rows.to(W_E.device)
    target = W_O @ W_U if len(rows) or UE is None else None  # (dh, V)
    source = W_E @ W_V if UE is None else None  # (V, dh)
    hits = 0
    for start in range(0, len(rows), block_size):
        ids = rows[start:start + block_size]
        logits = (source[ids] if source is not None else W_E[ids] @ W_V) @ target  # (blk, V)
        own = logits.gather(1, ids[:, None]).squeeze(1)
        logits.scatter_(1, ids[:, None], -float("inf"))
        hits += int((own > logits.max(dim=1).values).sum())
    # (dh, dh) = W_O W_U W_E W_V, same nonzero eigenvalues as the full circuit
    small = target @ source if UE is None else W_O @ UE @ W_V
    eig = torch.linalg.eigvals(small.double())
    share = float(eig.real.clamp(min=0).sum() / eig.abs().sum().clamp(min=1e-30))
    return hits / len(rows) if len(rows) else float("nan"), share


def head_ov_weights(model, sites: Optional[str] = None):
    """Every head's OV weights, layer by layer (through `MultiHeadAttention.from_hf`; for another
    group of sites, `sites="decoder.cross"`, read from its blocks by the family's adapter layout).

    Yields:
        `(layer, head, W_V, W_O)`: W_V `[d_model, d_value]` (the head's key/value head under GQA)
        and W_O `[d_value, d_model]`, fp32, row convention x @ W; residual norms not folded, the gain
        of a norm over all heads before W_O (`pre_out_norm`) folded into W_O: diag(g) W_O; under
        multi-head latent attention W_V is W_UV diag(g) W_DKV, the latent norm's gain folded in and
        its per-token scale left out (`MultiHeadAttention.input_weights`).
    Raises:
        HeadscopeError: a layer's z passes an output gate (no input-free OV circuit), or the
            family's adapter says why its heads have no OV circuit to score (`Adapter.no_ov`).
    """
    if sites is not None:
        yield from _group_ov_weights(model, sites)
        return
    adapter = adapter_for(model.config)
    if adapter is not None and adapter.no_ov:
        raise HeadscopeError(adapter.no_ov)
    for layer, block in attention_blocks(model):
        mha = MultiHeadAttention.from_hf(block, model.config, layer)
        cfg = mha.config
        if cfg.output_gate:
            raise HeadscopeError(f"OV copying is not available for layer {layer}: a sigmoid output gate, which depends "
                                 f"on the input, scales z per element between W_V and W_O, so the head has no fixed OV "
                                 f"circuit (from_hf, verify, capture, ablate and the other detectors work)")
        per_kv, dv = cfg.n_heads // cfg.n_kv_heads, cfg.d_value
        W_v = mha.input_weights()[2].detach().float().T  # (D, n_kv * dv); a latent's folded map (its gain in)
        W_o = mha.W_o.weight.detach().float().T  # (n_heads * dv, D)
        if cfg.pre_out_norm and getattr(mha.pre_out_norm, "weight", None) is not None:
            W_o = mha.pre_out_norm.weight.detach().float()[:, None] * W_o  # diag(g) W_O, (n_heads * dv, D)
        for head in range(cfg.n_heads):
            kv = head // per_kv
            yield layer, head, W_v[:, kv * dv:(kv + 1) * dv], W_o[head * dv:(head + 1) * dv]


def _group_ov_weights(model, sites: str):
    """`head_ov_weights` of a group of sites other than the default (an encoder-decoder's decoder
    self- or cross-attention): W_V from the block's value projection, W_O from its output
    projection, by the family's adapter (`Adapter.qkv`, `Adapter.out`). At cross-attention the
    circuit reads a token's embedding through the value projection as the encoder would hand it
    over unchanged (Elhage et al.'s simplified circuit, here across the two stacks)."""
    chosen = select(model, sites)
    adapter = adapter_for(model.config)
    if adapter is None or not chosen.blocks:
        raise HeadscopeError(f"OV copying of {sites} sites needs the family's adapter ({type(model).__name__} has none)")
    if any(block_adapter(model.config, block)[0] is not adapter for block in chosen.blocks.values()):
        raise HeadscopeError(f"OV copying reads token embeddings through the text family's attention; the {sites} "
                             f"sites are another tower's (a vision tower reads patches, not tokens)")
    for layer, block in sorted(chosen.blocks.items()):
        out = _sub(block, adapter.out)
        wo = (conv1d(out) if adapter.out_is_conv1d else linear(out))[0].detach().float()  # (D, H * dh)
        n_heads = chosen.n_heads
        d_head = wo.shape[1] // n_heads
        wv = adapter.qkv.extract(block, n_heads, n_heads, d_head)[2][0].detach().float()  # (n_kv * dh, D)
        per_kv = n_heads // (wv.shape[0] // d_head)
        for head in range(n_heads):
            kv = head // per_kv
            yield layer, head, wv[kv * d_head:(kv + 1) * d_head].T, wo[:, head * d_head:(head + 1) * d_head].T


def ov_copying(loaded, block_size: int = 4096, n_tokens: Optional[int] = None, seed: int = 0, fold_norms: bool = False,
               top1_heads: Optional[set] = None):
    """OV copying of every head of a model with an unembedding and an adapter.

    Args:
        loaded: a `headscope.load(...)` result (or anything with `.model`).
        block_size: source tokens per block of rows.
        n_tokens: score copy_top1 on a seeded sample of this many source tokens (None: all; 0:
            none, copy_top1 NaN, only the eigenvalue share).
        seed: chooses the sample.
        fold_norms: fold the gains of each layer's attention input norm into W_V and of the
            final norm into W_U (layers whose norm is not found stay unfolded; `attrs["folded"]`
            counts what was folded). A model looking at another group of sites (`Loaded.at`)
            is scored on that group's heads, its norms not folded.
        top1_heads: the `(layer, head)`s whose copy_top1 is computed (None: all); the others get
            NaN and only the eigenvalue share, which is cheap (W_O W_U of one head is `[d_head,
            vocab]`, most of the cost).
    Returns:
        pandas DataFrame layer, head, copy_top1, positive_eig_share.
    """
    check_loaded(loaded, "ov_copying")
    check_count("block_size", block_size)
    if n_tokens is not None:
        check_count("n_tokens", n_tokens, least=0)  # 0: no top-1 copying, the eigenvalue share only
    import pandas as pd

    model = loaded.model
    unembed = model.get_output_embeddings()
    if unembed is None:
        raise HeadscopeError(f"{type(model).__name__} has no unembedding (output embeddings): OV copying needs W_U")
    if any(p.device.type == "meta" for p in model.parameters()):
        raise HeadscopeError("some weights are offloaded (device_map with disk or CPU offload): OV copying reads "
                             "them from memory")
    W_E = model.get_input_embeddings().weight.detach().float()  # (V, D)
    W_U = unembed.weight.detach().float().T.to(W_E.device)  # (D, V): nn.Linear stores (V, D)
    # The tokens both have: past the vocabulary, an unembedding's padding or an embedding's extra rows
    # (mllama's image tokens, which it never predicts).
    vocab = min(W_E.shape[0], W_U.shape[1])
    W_E, W_U = W_E[:vocab], W_U[:, :vocab]
    sites = getattr(loaded, "sites", None)
    gains, final = norm_gains(model) if fold_norms and sites is None else ({}, None)  # other sites: not folded
    if final is not None:
        W_U = final.to(W_E.device)[:, None] * W_U  # diag(g_final) W_U
    rows = None
    if n_tokens is not None and n_tokens < W_E.shape[0]:  # 0: an empty sample
        rows = torch.randperm(W_E.shape[0], generator=torch.Generator().manual_seed(seed))[:n_tokens]
    elif top1_heads is not None:
        rows = torch.arange(W_E.shape[0])
    UE = W_U @ W_E  # (D, D), once: each head's eigenvalues then cost O(D^2 dh), not O(V D dh)
    out = []
    for layer, head, W_v, W_o in head_ov_weights(model, sites):
        W_v, W_o = W_v.to(W_E.device), W_o.to(W_E.device)  # layers may sit on other devices (device_map)
        if gains.get(layer) is not None:
            W_v = gains[layer].to(W_E.device)[:, None] * W_v  # diag(g_in) W_V
        scored = rows if top1_heads is None or (layer, head) in top1_heads else torch.zeros(0, dtype=torch.long)
        top1, share = ov_scores(W_E, W_v, W_o, W_U, block_size, scored, UE)
        out.append({"layer": layer, "head": head, "copy_top1": top1, "positive_eig_share": share})
    frame = pd.DataFrame(out, columns=["layer", "head", "copy_top1", "positive_eig_share"])
    frame.attrs["folded"] = {"layers": sum(g is not None for g in gains.values()), "final": final is not None}
    return frame


def ov_table(loaded, control=None, heads: Optional[set] = None, n_tokens: int = OV_TOKENS, seed: int = 0):
    """OV copying of the model and of its control, as `analyze` stores it (`Analysis.ov`).

    The eigenvalue share of every head of both; copy_top1 only of the model's `heads` (analyze
    passes those the qualifier applies to): each head's `[d_head, vocab]` W_O W_U is most of the
    cost (about 3 GFLOP per SmolLM2 head), and the control's copy_top1 is at chance (1/vocab on
    random-init models, tests/head_geometry/test_ov_circuit.py).

    The norm gains are folded in (`fold_norms=True`): they are part of the map the model applies to
    a head's input and to the logits, and leaving them out scores a circuit the model does not run
    (on SmolLM2 folding moves the median head's share from 0.66 to 0.63; docs/detectors.md).

    Args:
        loaded: the analysed model.
        control: its control twin (a `Loaded`), or None (the control column is NaN).
        heads: the `(layer, head)`s whose copy_top1 is computed (None: all; the rest NaN).
        n_tokens: copy_top1 is scored on this many seeded source tokens.
        seed: chooses them (the same tokens for model and control).
    Returns:
        `(frame, None)`: DataFrame with `OV_COLUMNS`; or `(None, reason)` when the model has no
        unembedding or no attention adapter (a BERT encoder without an LM head, say), or has
        offloaded weights.
    """
    try:
        frame = ov_copying(loaded, n_tokens=n_tokens, seed=seed, fold_norms=True, top1_heads=heads)
    except HeadscopeError as err:
        return None, str(err)
    frame["control_positive_eig_share"] = float("nan")
    if control is not None:
        try:
            twin = ov_copying(control, n_tokens=0, fold_norms=True)
        except HeadscopeError:
            twin = None  # a given control without an unembedding: the model's numbers stand alone
        if twin is not None and len(twin) == len(frame):
            frame["control_positive_eig_share"] = twin["positive_eig_share"].to_numpy()
    return frame[OV_COLUMNS], None
