"""Composition scores: how strongly a later head reads what an earlier head writes, from the weights.

Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits") score a pair of heads,
A in an earlier layer and B in a later one, by

    score(A, B) = ||W_A W_B||_F / (||W_A||_F ||W_B||_F)

with W_A = W_V^A W_O^A, A's OV circuit `[d_model, d_model]` (row convention, x @ W), and W_B:
- Q-composition ("q"): B's QK circuit W_Q^B W_K^B^T, A's output read by B's queries: W_A W_QK^B;
- K-composition ("k"): the same circuit read by B's keys: W_A (W_QK^B)^T;
- V-composition ("v"): B's OV circuit W_V^B W_O^B: W_A W_OV^B.
The score is invariant to scaling either matrix: only the directions count, 1 when A writes into
the subspace B reads (and B reads it as A writes it), 0 when B ignores A.

Norms, as `headscope.head_geometry` folds them (`head_geometry.norm_gains`, `head_ov_weights`): the
gain g of the norm in front of each layer's attention multiplies the rows of that layer's W_Q, W_K
and W_V (diag(g) W); the gain of a norm over all heads' outputs before W_O (BitNet) is in W_O. A
q/k norm's gain (Qwen3 and Gemma 3: per head; OLMo 2: over the whole projection) multiplies the
columns of W_Q and W_K (W_Q diag(g_q)), measured as `norm_gains.measured_gain` measures a norm. A
norm between W_O and the residual stream (Gemma 2 and 3's `post_attention_layernorm`) multiplies
the columns of W_O (W_O diag(g_post)). A LayerNorm in front of the attention also removes the
mean: it reads x P diag(g) W with P = I - 11^T / d_model, so that layer's W_Q, W_K and W_V are
P diag(g) W (their columns centred), and, since every reader of such a model removes the mean,
W_O's output is centred too (W_O P), as TransformerLens's `fold_ln` and `center_writing_weights`
do. Every norm's per-token scale is left out (a positive number per position), as are biases.

Grouped-query attention: heads are named by their query head; a query head's W_K and W_V are its
key/value head's, so the heads of one group share them.

Baseline: the same score of random matrices of the same shapes: W_V `[d_model, d_value]`, W_O
`[d_value, d_model]` for A, and B's factors (W_Q, W_K `[d_model, d_head]`, or W_V, W_O), every
entry drawn i.i.d. from N(0, 1 / fan_in), `baseline_samples` draws (seed `seed`); `baseline` is
the mean and `baseline_std` the standard deviation over the draws, `z = (score - baseline) /
baseline_std`. The scale of the draws does not matter (the score ignores scale); random matrices
of these shapes score about 1 / sqrt(d_model) (ARENA 1.2).

Rotary (`rotary_offsets`): Elhage's QK circuit ignores rotary, which turns q and k by their
positions: the score of a query at position m and a key at n is x W_Q R_m R_n^T W_K^T y^T (R_p the
`[d_head, d_head]` rotation at position p, in the model's own tables and layout). With d = m - n,
the rotary-aware circuit is the average over the given offsets D:

    W_QK(D) = W_Q C W_K^T,    C = mean over d in D of R_d R_0^T

Fast-turning pairs of dims average out and slow ones stay: what is left is the part of the QK
circuit that does not depend on the offset (what an induction head needs, whose key may lie at
any distance). It replaces W_QK^B in Q- and K-composition (and in their baseline, with the same
C); V-composition is unchanged. A layer without rotary keeps its plain circuit, so on a model
without rotary the option changes nothing (`attrs["rotary_layers"]` is empty). Refused for
multi-head latent attention (its rotary dims come last and its rotary key is shared) and for q/k
norms after rotary (HunYuan, Llama 4: the gain sits between the rotations).

Refused in one line, as `head_ov_weights` refuses OV copying: a sigmoid output gate (W_O reads
z gated by the input) and a family whose adapter says its heads have no OV circuit (zamba2).

- `composition(loaded, kind="k", rotary_offsets=None, ...)` -> DataFrame `COLUMNS`.
- `head_factors(loaded)`: every attention layer's folded W_Q, W_K, W_V, W_O per query head.
- `composition_scores(left, right)`: the score of every (A, B) pair from their factors.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from ..attention.rotary import apply_rotary, rotary_cos_sin
from ..checks import check_count, check_loaded
from ..errors import HeadscopeError, UsageError
from ..head_geometry.norm_gains import attention_norms, centres, norm_gain
from ..head_geometry.ov_circuit import head_ov_weights
from ..head_geometry.run import attention_modules
from ..hf.adapters import analysed_body, attention_blocks, text_stack
from ..hf.from_hf import rotary_tables
from .target import check_token_inputs

__all__ = ["composition", "head_factors", "composition_scores", "HeadFactors", "KINDS", "COLUMNS",
           "BASELINE_SAMPLES"]

KINDS = ("q", "k", "v")
COLUMNS = ["src_layer", "src_head", "dst_layer", "dst_head", "kind", "score", "baseline", "baseline_std", "z"]
BASELINE_SAMPLES = 200
BASELINE_CHUNK = 25


@dataclass
class HeadFactors:
    """One attention layer's circuits, per query head, norm gains folded (fp64, x @ W).

    Attributes:
        layer: the model's number of the layer.
        W_Q, W_K: `[head, d_model, d_head]` (W_K: the head's key/value head's).
        W_V: `[head, d_model, d_value]`; W_O: `[head, d_value, d_model]`.
        rotation: C `[d_head, d_head]` (module docstring), or None: no rotary offsets asked for, or
            the layer has no rotary.
        folded: whether the gain of the layer's input norm is folded in (False: no norm found in
            front of the attention, as in OLMo 2).
        centred: whether that norm removes the mean (LayerNorm): W_Q, W_K, W_V and W_O centred.
        post_folded: whether a norm between W_O and the residual stream is folded into W_O.
    """

    layer: int
    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    rotation: Optional[torch.Tensor] = None
    folded: bool = False
    centred: bool = False
    post_folded: bool = False

    @property
    def keys(self) -> torch.Tensor:
        """W_K C^T `[head, d_model, d_head]`: W_Q (W_K C^T)^T = W_Q C W_K^T."""
        return self.W_K if self.rotation is None else self.W_K @ self.rotation.T


def composition(loaded, kind: str = "k", rotary_offsets: Union[None, int, Sequence[int]] = None,
                baseline_samples: int = BASELINE_SAMPLES, seed: int = 0):
    """Composition scores of every earlier -> later pair of attention heads (module docstring).

    Args:
        loaded: a `headscope.load(...)` result (or `Loaded.from_model(model, tokenizer)`).
        kind: "q", "k" or "v" composition.
        rotary_offsets: None (Elhage's score), or the relative offsets d = query - key the QK
            circuit is averaged over: an integer n for 1..n, or the offsets themselves (>= 0).
        baseline_samples: random draws of the baseline.
        seed: seeds the draws.
    Returns:
        pandas DataFrame with `COLUMNS`: src_layer, src_head, dst_layer, dst_head (the model's
        layer numbers, query heads), kind, score (NaN where a circuit is all zeros), baseline,
        baseline_std, z. `attrs`: kind, rotary_offsets, rotary_layers (the layers whose
        circuit the offsets changed), folded (layers whose input norm was folded), baseline
        (samples, seed, how drawn), seconds.
    Raises:
        HeadscopeError: the heads have no input-free OV circuit (an output gate, zamba2), the
            rotary variant is asked of latent attention or q/k norms after rotary, the weights are
            offloaded, or the model is looked at through another group of sites.
    """
    check_loaded(loaded, "composition")
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    check_count("baseline_samples", baseline_samples, least=2)
    offsets = _offsets(rotary_offsets)
    import pandas as pd

    started = time.perf_counter()
    factors = head_factors(loaded, offsets if kind in "qk" else None)
    gen = torch.Generator().manual_seed(seed)
    rows, baselines = [], []
    for i, src in enumerate(factors):
        left = _left(src.W_V, src.W_O)
        for dst in factors[i + 1:]:
            right = _right(dst.W_Q, dst.keys, dst.W_V, dst.W_O, kind)
            scores = composition_scores(left, right)  # (H_src, H_dst)
            mean, std = _baseline(src, dst, kind, baseline_samples, gen, baselines)
            for a in range(scores.shape[0]):
                for b in range(scores.shape[1]):
                    score = float(scores[a, b])
                    z = (score - mean) / std if std > 0 else float("nan")
                    rows.append((src.layer, a, dst.layer, b, kind, score, mean, std, z))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame.attrs.update(
        kind=kind, rotary_offsets=offsets, rotary_layers=[f.layer for f in factors if f.rotation is not None],
        folded=[f.layer for f in factors if f.folded], centred=[f.layer for f in factors if f.centred],
        post_folded=[f.layer for f in factors if f.post_folded],
        baseline={"samples": baseline_samples, "seed": seed,
                  "draw": "i.i.d. N(0, 1/fan_in) entries in matrices of each pair's shapes"},
        seconds=round(time.perf_counter() - started, 3))
    return frame


def head_factors(loaded, offsets: Optional[list] = None) -> list:
    """`HeadFactors` of every attention layer, in order (a hybrid's attention layers only).

    Args:
        loaded: as `composition` takes it.
        offsets: relative offsets for the rotary-aware QK circuit (None: none).
    """
    check_loaded(loaded, "composition")
    if getattr(loaded, "sites", None) is not None:
        raise HeadscopeError(f"composition scores the model's default attention stack, not {loaded.sites}: "
                             f"use the loaded model itself")
    model = loaded.model
    check_token_inputs(model, "composition cannot measure its norms")  # they are measured on token ids
    if any(p.device.type == "meta" for p in model.parameters()):
        raise HeadscopeError("some weights are offloaded (device_map with disk or CPU offload): composition reads "
                             "them from memory")
    ov: dict = {}
    try:
        for layer, head, W_v, W_o in head_ov_weights(model):  # refuses gated and no-OV heads, folds a pre-W_O norm
            ov.setdefault(layer, []).append((W_v.double().cpu(), W_o.double().cpu()))
    except HeadscopeError as err:
        raise HeadscopeError(f"composition scores need every head's OV circuit: {err}") from None
    norms = attention_norms(model)  # one recording pass finds both norms of every layer
    d_model = model.get_input_embeddings().weight.shape[1]
    modules = attention_modules(model)
    tables = _rotary_at(model, modules, offsets) if offsets is not None else {}
    out = []
    for layer, module in modules:
        cfg = module.config
        w_q, w_k, _ = (w.detach().double().cpu() for w in module.input_weights())  # (rows, d_in)
        per_kv = cfg.n_heads // cfg.n_kv_heads
        W_Q = w_q.view(cfg.n_heads, cfg.d_head, -1).transpose(1, 2)  # (H, d_in, D)
        W_K = w_k.view(cfg.n_kv_heads, cfg.d_head, -1).transpose(1, 2)  # (Hkv, d_in, D)
        gain_q, gain_k = _qk_gains(module)
        if gain_q is not None:
            W_Q, W_K = W_Q * gain_q[:, None, :], W_K * gain_k[:, None, :]  # W diag(g_q), per head
        W_K = W_K.repeat_interleave(per_kv, dim=0)  # (H, d_in, D): each query head's key head
        W_V = torch.stack([v for v, _ in ov[layer]])  # (H, d_in, Dv), GQA resolved
        W_O = torch.stack([o for _, o in ov[layer]])  # (H, Dv, d_model)
        pre, post = norms.get(layer, (None, None))
        folded = pre is not None
        if folded:
            g = norm_gain(pre, d_model).double().cpu()[None, :, None]  # diag(g) W on the rows (d_in)
            W_Q, W_K, W_V = W_Q * g, W_K * g, W_V * g
        centred = pre is not None and centres(pre, d_model)
        if centred:  # P diag(g) W: columns centred over d_in; W_O P: rows centred over d_model
            W_Q, W_K, W_V = (W - W.mean(dim=1, keepdim=True) for W in (W_Q, W_K, W_V))
            W_O = W_O - W_O.mean(dim=2, keepdim=True)
        if post is not None:  # W_O diag(g_post)
            W_O = W_O * norm_gain(post, d_model).double().cpu()[None, None, :]
        if W_Q.shape[1] != W_O.shape[2]:
            raise HeadscopeError(f"layer {layer}'s heads read {W_Q.shape[1]} dims and write {W_O.shape[2]}: "
                                 f"composition needs them to read the residual stream they write")
        out.append(HeadFactors(layer, W_Q, W_K, W_V, W_O, tables.get(layer), folded, centred, post is not None))
    return out


def composition_scores(left: tuple, right: tuple) -> torch.Tensor:
    """`[src head, dst head]` scores ||L_a P_b||_F / (||L_a||_F ||P_b||_F).

    Args:
        left: `(L, norm)`: L `[src head, r, d_model]` with ||X|| of W_A X equal to ||L X|| for any
            X (`_left`), and ||W_A||_F per head.
        right: `(P, norm)`: P `[dst head, d_model, s]` with ||X W_B|| equal to ||X P|| (`_right`),
            and ||W_B||_F per head.
    """
    L, left_norm = left
    P, right_norm = right
    H, r, d = L.shape
    G, _, s = P.shape
    product = L.reshape(H * r, d).float() @ P.permute(1, 0, 2).reshape(d, G * s).float()  # (H r, G s)
    numerator = product.view(H, r, G, s).double().square().sum((1, 3)).sqrt()  # (H, G)
    return numerator / (left_norm[:, None] * right_norm[None, :])  # 0 / 0 -> NaN: a head writing or reading nothing


def _left(W_V: torch.Tensor, W_O: torch.Tensor) -> tuple:
    """W_A = W_V W_O `[head, ...]`: with W_V = Q R (QR), ||W_V W_O X|| = ||R W_O X||;
    `(R W_O, ||W_V W_O||_F)`."""
    L = torch.linalg.qr(W_V, mode="r").R @ W_O  # (H, Dv, d_model)
    return L, L.flatten(1).norm(dim=1)


def _right(W_Q: torch.Tensor, K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, kind: str) -> tuple:
    """W_B as a tall factor P with ||X W_B|| = ||X P|| (W_B = P Q^T, Q orthonormal columns):
    q: W_Q K^T -> W_Q R_K^T; k: K W_Q^T -> K R_Q^T; v: W_V W_O -> W_V R_O^T (K = W_K C^T, the
    keys of `HeadFactors.keys`). `(P, ||W_B||_F)`."""
    tall, wide = {"q": (W_Q, K), "k": (K, W_Q), "v": (W_V, W_O.transpose(1, 2))}[kind]
    P = tall @ torch.linalg.qr(wide, mode="r").R.transpose(1, 2)  # (H, d_model, D)
    return P, P.flatten(1).norm(dim=1)


def _baseline(src: HeadFactors, dst: HeadFactors, kind: str, samples: int, gen: torch.Generator,
              cache: list) -> tuple[float, float]:
    """Mean and standard deviation of the score over random factors shaped as src's and dst's
    (dst's rotation kept), drawn once per distinct set of shapes and rotation."""
    shapes = (tuple(src.W_V.shape[1:]), tuple(src.W_O.shape[1:]), tuple(dst.W_Q.shape[1:]),
              tuple(dst.W_V.shape[1:]), tuple(dst.W_O.shape[1:]), kind)
    rotation = dst.rotation if kind in "qk" else None
    for key, turn, result in cache:
        if key == shapes and (turn is None if rotation is None else turn is not None and torch.equal(turn, rotation)):
            return result

    def draw(n, *shape):  # fp32: the draws' spread dwarfs its rounding
        return torch.randn(n, *shape, generator=gen) / shape[0] ** 0.5

    (d_model, d_value), (d_in, d_head), d_dst_value = src.W_V.shape[1:], dst.W_Q.shape[1:], dst.W_V.shape[2]
    turn = None if rotation is None else rotation.float()
    scores = []
    for start in range(0, samples, BASELINE_CHUNK):  # a chunk of draws at a time: a few of them are large
        n = min(BASELINE_CHUNK, samples - start)
        left = _left(draw(n, d_model, d_value), draw(n, d_value, d_model))
        keys = draw(n, d_in, d_head)
        right = _right(draw(n, d_in, d_head), keys if turn is None else keys @ turn.T, draw(n, d_in, d_dst_value),
                       draw(n, d_dst_value, d_model), kind)
        scores.append((left[0] @ right[0]).flatten(1).norm(dim=1) / (left[1] * right[1]))  # draw i against draw i
    scores = torch.cat(scores).double()
    result = (float(scores.mean()), float(scores.std()))
    cache.append((shapes, rotation, result))
    return result


def _offsets(given) -> Optional[list]:
    """The offsets as a sorted list of distinct integers >= 0 (None: none asked for)."""
    if given is None:
        return None
    if isinstance(given, int) and not isinstance(given, bool):
        check_count("rotary_offsets", given)
        return list(range(1, given + 1))
    try:
        values = sorted({int(d) for d in given if not isinstance(d, bool) and int(d) == d and d >= 0})
        complete = len(values) == len(set(given))
    except (TypeError, ValueError):
        values, complete = [], False
    if not values or not complete:
        raise UsageError(f"rotary_offsets takes an integer n (offsets 1..n) or integer offsets >= 0, got {given!r}")
    return values


def _qk_gains(module) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The q and k norms' gains `[head, d_head]` (k: per key/value head), or None without q/k norms.

    Measured as `norm_gains.measured_gain` measures a norm: the norm run on u and -u, u a vector
    of +1 and -1 over each head's dims (mean 0, mean square 1, which a norm over a head or over
    the whole projection leaves as it is up to its eps), so (norm(u) - norm(-u)) / 2u is the
    gain, bias cancelled, whatever the norm multiplies by (its weight, or 1 + weight).
    """
    cfg = module.config
    if not cfg.qk_norm:
        return None, None
    weight = next(module.parameters())
    u = torch.ones(cfg.d_head, dtype=torch.float64)
    u[1::2] = -1.0
    gains = []
    with torch.no_grad():
        for norm, heads in ((module.q_norm, cfg.n_heads), (module.k_norm, cfg.n_kv_heads)):
            x = u.expand(1, 1, heads, cfg.d_head).to(weight.device, weight.dtype)  # (B, T, H, D)
            gains.append(((norm(x) - norm(-x)).double().cpu()[0, 0] / (2 * u)))  # (H, D)
    return gains[0], gains[1]


def _rotary_at(model, modules, offsets: list) -> dict:
    """`{layer: C}` with C = mean over d of R_d R_0^T `[d_head, d_head]` for each rotary layer,
    R_p the rotation at position p from the tables the model passes its attention blocks in one
    forward pass over max(offsets) + 1 positions (`rotary_tables`), or the module's own tables
    where the model passes none."""
    for layer, module in modules:
        cfg = module.config
        if cfg.rotary_dim and (module.latent is not None or cfg.qk_norm_after_rotary):
            why = "multi-head latent attention" if module.latent is not None else "q/k norms after rotary"
            raise HeadscopeError(f"rotary_offsets is not available for layer {layer}: {why} (the rotary dims or "
                                 f"the norm's gain do not sit where the rotation would go); leave rotary_offsets None")
    length = max(offsets) + 1
    blocks = dict(attention_blocks(model))
    received: dict = {}

    def keep(layer):
        def hook(block, args, kwargs):
            received[layer] = kwargs.get("position_embeddings")
        return hook

    rotating = [(layer, module) for layer, module in modules if module.config.rotary_dim]
    if not rotating:
        return {}
    handles = [blocks[layer].register_forward_pre_hook(keep(layer), with_kwargs=True) for layer, _ in rotating]
    try:
        device = model.get_input_embeddings().weight.device
        ids = torch.zeros(1, length, dtype=torch.long, device=device)
        body = analysed_body(model)
        with torch.no_grad():
            (model if body is text_stack(model) else body)(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    out = {}
    for layer, module in rotating:
        cfg = module.config
        tables = rotary_tables(module, model.config, received.get(layer))
        if tables is None:  # the model passes none: the module's own, as it computes them
            tables = rotary_cos_sin(torch.arange(length), cfg.rotary_dim, cfg.rotary_base,
                                    interleaved=cfg.rotary_interleaved)
        cos, sin = (t.double().cpu().reshape(-1, length, t.shape[-1])[0] for t in tables)  # (length, rot)
        eye = torch.eye(cfg.d_head, dtype=torch.float64)[None, None]  # (1, 1, D, D): rows e_i

        def turn(p):  # R_p: row i is e_i rotated to position p, so q R_p is q rotated
            return apply_rotary(eye, cos[p:p + 1], sin[p:p + 1], cfg.rotary_interleaved)[0, 0]

        start = turn(0)
        out[layer] = torch.stack([turn(d) @ start.T for d in offsets]).mean(0)
    return out
