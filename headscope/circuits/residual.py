"""The residual stream at one position, taken apart into what wrote it, found by what the modules do.

A pre-norm transformer's last residual state is a sum: the embedding plus what every layer's
sublayers (attention, MLP, other mixers) added. `record(model, inputs, positions)` runs the model
once, keeps every module's input and output at the given positions, and `decompose` finds:
- the layer list (the one holding the analysed attention blocks; a hybrid's other layers too),
  each layer's input and output, and that each layer reads what the one before wrote;
- in each layer, the modules whose outputs sum to what the layer added (`out - in`): the
  attention block of the analysed sites, other attention blocks (an encoder-decoder's
  cross-attention), the MLP, another mixer (Mamba, convolution). A norm whose input is one of those
  outputs (Gemma's post-attention and post-feedforward norms) stands in for it;
- the final norm (the module reading the last layer's output) and what the unembedding reads.
Nothing is named by family: a layer whose outputs do not add up this way (post-norm BART and
BERT, Granite's residual multiplier) is refused in one line.

Norms are linear once their per-token scale is frozen at the run's own value (TransformerLens's
`apply_ln_to_stack`): `frozen_norm(norm, x, y)` measures a LayerNorm- or RMSNorm-like module's
gain g, bias b and centring, and the scale s of each row from what it did, so that
`y = g * P(x) / s + b` (P: subtract the mean, or not) and any part c of x maps to `g * P(c) / s`.
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
from torch import nn

from ..errors import HeadscopeError
from ..head_geometry.norm_gains import centres, measured_gain
from ..hf.adapters import family_of
from ..hf.sites import sites as all_sites

__all__ = ["close", "mismatch", "tolerance",
           "Frozen", "NormForm", "norm_form", "Writer", "Decomposition", "frozen_norm", "record", "decompose", "layer_list", "is_norm"]

RTOL = 1e-5  # equalities checked within this share of the largest term (fp32 sums of a few dozen terms)
EPS_FACTOR = 8  # in a lower precision: this many of its machine epsilons instead, when that is more


def tolerance(*tensors: torch.Tensor) -> float:
    """The relative tolerance of `close` for tensors of these dtypes: `RTOL`, or `EPS_FACTOR` machine
    epsilons of the least precise floating dtype among them (bfloat16: 0.0625, float16: 0.0078)."""
    eps = max((torch.finfo(t.dtype).eps for t in tensors if t.is_floating_point()), default=0.0)
    return max(RTOL, EPS_FACTOR * eps)


def close(a: torch.Tensor, b: torch.Tensor, *terms: torch.Tensor, like: Optional[torch.dtype] = None) -> bool:
    """`a` equals `b` within `tolerance` of the largest entry of `a`, `b` and the terms they were
    summed from (a difference of large states is only as exact as the states), compared in float32;
    `like`: the dtype the model computed in, where these tensors are float32 copies of its values.

    Raises:
        HeadscopeError: a tensor holds NaN or infinite values (then no sum can be checked).
    """
    return mismatch(a, b, *terms, like=like) is not None


def mismatch(a: torch.Tensor, b: torch.Tensor, *terms: torch.Tensor, like: Optional[torch.dtype] = None):
    """The largest |a - b| where `close(a, b, *terms, like=like)` holds, else None: of several
    candidate sums within the tolerance, the caller keeps the closest."""
    tensors = (a, b) + terms
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise HeadscopeError("the model's activations are not finite (NaN or inf), so its residual stream cannot be "
                             "taken apart: check its weights for non-finite values (headscope verify) and its dtype")
    scale = max(float(t.abs().max()) for t in tensors)
    if a.shape != b.shape:
        return None
    rtol = tolerance(*tensors, *([torch.empty(0, dtype=like)] if like is not None else []))
    error = float((a.float() - b.float()).abs().max())
    return error if error <= rtol * scale + 1e-12 else None


def is_norm(module: nn.Module, d_model: int) -> bool:
    """A leaf module with a `[d_model]` weight: a LayerNorm or RMSNorm (as `norm_gains` finds them)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 1 and weight.shape[0] == d_model \
        and not list(module.children())


@dataclass(frozen=True)
class Frozen:
    """A norm with its per-row scale frozen: `apply(c)` = g * P(c) / s, and `bias` = b.

    gain `[d]`, bias `[d]`, centred (P subtracts the mean), scale `[rows]`."""

    gain: torch.Tensor
    bias: torch.Tensor
    centred: bool
    scale: torch.Tensor

    def apply(self, part: torch.Tensor) -> torch.Tensor:
        """`part` `[rows, ..., d]` (a piece of the norm's input) as it reaches the output."""
        if self.centred:
            part = part - part.mean(-1, keepdim=True)
        shape = (-1,) + (1,) * (part.dim() - 1)
        return part * self.gain / self.scale.view(shape)


@dataclass(frozen=True)
class NormForm:
    """What a LayerNorm or RMSNorm does besides its per-row scale: `gain`, `bias`, `centred`
    (measured once; `freeze(x, y)` gives the `Frozen` norm of one run)."""

    gain: torch.Tensor
    bias: torch.Tensor
    centred: bool

    def freeze(self, x: torch.Tensor, y: torch.Tensor) -> Frozen:
        """The norm with its scale frozen at the rows `x` -> `y` `[..., d]` of a run."""
        gain, bias = self.gain.to(x.device, x.dtype), self.bias.to(x.device, x.dtype)
        part = x - x.mean(-1, keepdim=True) if self.centred else x
        top = (part * gain).norm(dim=-1)
        bottom = (y - bias).norm(dim=-1).clamp_min(torch.finfo(x.dtype).tiny)
        return Frozen(gain, bias, self.centred, (top / bottom).reshape(-1))


@torch.no_grad()
def norm_form(norm: nn.Module, d: int, dtype, device) -> NormForm:
    """Measure `norm`'s gain, bias and centring (`frozen_norm`'s probes)."""
    gain = measured_gain(norm, d).to(device, dtype)
    u = torch.ones(d, dtype=torch.float32, device=device)
    u[1::2] = -1.0
    probe = u.to(norm.weight.dtype)[None, None]
    bias = ((norm(probe) + norm(-probe)).float()[0, 0] / 2).to(device, dtype)
    return NormForm(gain, bias, centres(norm, d))


@torch.no_grad()
def frozen_norm(norm: nn.Module, x: torch.Tensor, y: torch.Tensor, where: str) -> Frozen:
    """Measure `norm` (gain, bias, centring) and freeze its scale at the rows `x` -> `y` `[rows, d]`.

    Measured in float32 and checked at the precision of `y`'s own dtype (a bfloat16 model's norm
    rounded its output to bfloat16). HeadscopeError naming `where` when the norm is not of the form
    g * P(x) / s(x) + b."""
    xf, yf = x.float(), y.float()
    frozen = norm_form(norm, x.shape[-1], torch.float32, x.device).freeze(xf, yf)
    if not close(frozen.apply(xf) + frozen.bias, yf, like=y.dtype):
        raise HeadscopeError(f"{where} is not a LayerNorm or RMSNorm (its output is not g * x / scale(x) + b), so "
                             f"its scale cannot be frozen for attribution")
    return frozen


@dataclass
class Writer:
    """A module whose output the residual stream adds (through `post_norm`, where one stands between).

    kind: "heads" (an attention block of the analysed sites: its heads are parts of their own),
    "attn" (an attention block of another group), "mlp", "mixer" (a layer's first writer where it
    has no attention: Mamba, convolution, linear attention)."""

    layer: int
    path: str
    kind: str
    module: nn.Module
    post_norm: Optional[nn.Module] = None
    post_path: str = ""


@dataclass
class Record:
    """What one forward pass left at the chosen positions: `[rows, ...]` per module path."""

    inputs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    order: list = field(default_factory=list)  # module paths in the order their forward ended


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return getattr(value, "last_hidden_state", None)


@contextmanager
def record(model: nn.Module, positions: torch.Tensor, length: int, d_model: int, within: str = "",
           keep_grad: bool = False) -> Iterator[Record]:
    """Inside the block, the first input and first output of shape `[batch, length, d_model]` (or
    `[batch * length, d_model]`, read as that) of every module under the path `within` (and of the unembedding) are kept at `positions`
    (`[batch]`, one position per row), as `[batch, d_model]` (detached unless `keep_grad`); tensors of
    other lengths (an encoder's, read by cross-attention) are not the stream's."""
    rec = Record()
    rows = torch.arange(positions.shape[0])
    handles = []

    def at(value):
        if isinstance(value, torch.Tensor) and tuple(value.shape) == (positions.shape[0] * length, d_model):
            value = value.view(positions.shape[0], length, d_model)  # Llama 4's MoE returns its rows flat
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (positions.shape[0], length, d_model):
            return None
        picked = value[rows.to(value.device), positions.to(value.device)]
        return picked if keep_grad else picked.detach()

    def hook(path):
        def keep(module, args, kwargs, output):
            first = args[0] if args else kwargs.get("hidden_states")
            x, y = at(first), at(_first_tensor(output))
            if x is not None:
                rec.inputs[path] = x
            if y is not None:
                rec.outputs[path] = y
                rec.order.append(path)
        return keep

    try:
        unembed = model.get_output_embeddings()
        for path, module in model.named_modules():
            if path and (path.startswith(within) or module is unembed):
                handles.append(module.register_forward_hook(hook(path), with_kwargs=True))
        yield rec
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class Decomposition:
    """How the last residual state at the recorded positions is a sum (module docstring).

    embed: the first layer's input path; layers: `[(layer, path)]`; writers: `{layer: [Writer]}`;
    final_norm: the path of the norm the last layer's output goes through (None: none); unembed:
    the unembedding's path; readout: the scalar between the final norm's output and the
    unembedding's input (T5's tied head multiplies by d_model ** -0.5; 1 elsewhere)."""

    embed: str
    layers: list
    writers: dict
    final_norm: Optional[str]
    unembed: str
    readout: float


def layer_list(model: nn.Module, selection) -> tuple[str, list]:
    """The path of the ModuleList holding one of `selection`'s attention blocks per entry, and its
    entries `[(i, path)]` (a hybrid's layers without attention included)."""
    blocks = selection.blocks
    if not blocks:
        raise HeadscopeError(f"attribution needs the {family_of(model.config)} family's adapter (it reads each head's "
                             f"output through W_O), which this model has none of")
    paths = {id(m): name for name, m in model.named_modules()}
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList):
            continue
        prefix = f"{name}."
        inside = [paths[id(b)][len(prefix):].split(".", 1)[0] for b in blocks.values()
                  if paths[id(b)].startswith(prefix)]
        if len(inside) == len(blocks) and all(part.isdigit() for part in inside):
            return name, [(i, f"{prefix}{i}") for i in range(len(module))]
    raise HeadscopeError(f"{type(model).__name__}'s attention blocks do not sit one per entry of a layer list, so "
                         f"its residual stream cannot be taken apart")


def decompose(model: nn.Module, rec: Record, selection, d_model: int) -> Decomposition:
    """Find the writers of the residual stream in `rec` (module docstring).

    Args:
        model: the model that ran.
        rec: what `record` kept.
        selection: the analysed attention sites (`headscope.hf.route.selection`), with blocks.
        d_model: the residual width.
    Raises:
        HeadscopeError in one line where the stream is not such a sum."""
    family = family_of(model.config)
    modules = dict(model.named_modules())
    paths = {id(m): name for name, m in modules.items()}
    block_paths = {paths[id(b)]: layer for layer, b in selection.blocks.items()}
    attention_paths = set(block_paths) | {site.name for site in all_sites(model)}
    _, layers = layer_list(model, selection)
    for (i, path), (_, after) in zip(layers, layers[1:]):
        if path not in rec.outputs or after not in rec.inputs or not close(rec.outputs[path], rec.inputs[after]):
            raise HeadscopeError(f"{family}: what layer {i + 1} reads is not what layer {i} wrote, so the residual "
                                 f"stream cannot be taken apart")
    writers = {}
    for i, path in layers:
        writers[i] = _writers(i, path, rec, modules, block_paths, attention_paths, d_model, family)
    last = layers[-1][1]
    final_norm = next((p for p, m in modules.items() if p in rec.inputs and is_norm(m, d_model)
                       and not p.startswith(last + ".") and close(rec.inputs[p], rec.outputs[last])), None)
    unembed_module = model.get_output_embeddings()
    if unembed_module is None or id(unembed_module) not in paths:
        raise HeadscopeError(f"attribution needs a model with an unembedding (a language-model head); "
                             f"{type(model).__name__} has none")
    unembed = paths[id(unembed_module)]
    seen = rec.outputs[final_norm] if final_norm else rec.outputs[last]
    reads = rec.inputs.get(unembed)
    readout = float((reads * seen).sum() / (seen * seen).sum().clamp_min(1e-30)) if reads is not None else 0.0
    if reads is None or not close(reads, readout * seen):
        raise HeadscopeError(f"{family}: the unembedding does not read the last layer's output through a final norm "
                             f"and a fixed scale, so logits cannot be taken apart")
    return Decomposition(layers[0][1], layers, writers, final_norm, unembed, readout)


def _writers(layer, layer_path, rec, modules, block_paths, attention_paths, d_model, family) -> list:
    """The modules whose outputs (or post-norms of them) add up to what layer `layer` added."""
    added = rec.outputs[layer_path] - rec.inputs[layer_path]
    prefix = layer_path + "."
    inside_attention = tuple(p + "." for p in attention_paths)
    candidates = [p for p in rec.order if p.startswith(prefix) and not p.startswith(inside_attention)]
    # One candidate per distinct output: the outermost module (shortest path) with it, and of two
    # at one depth the one that finished first (StableLM's MLP, not the dropout it feeds).
    kept: list[str] = []
    finished = {p: n for n, p in enumerate(rec.order)}
    for path in sorted(dict.fromkeys(candidates), key=lambda p: (p not in attention_paths, p.count("."), finished[p])):
        if not any(torch.equal(rec.outputs[path], rec.outputs[k]) for k in kept):
            kept.append(path)
    norms = [p for p in kept if is_norm(modules[p], d_model)]
    read = [x for p, x in rec.inputs.items() if p.startswith(prefix)]
    posts = {}  # writer path -> the norm reading its output (a norm whose output no module reads)
    for norm in norms:
        if any(torch.equal(rec.outputs[norm], x) for x in read):
            continue  # a pre-norm: a sublayer reads it
        source = next((p for p in kept if p not in norms and norm in rec.inputs
                       and torch.equal(rec.inputs[norm], rec.outputs[p])), None)
        if source is not None:
            posts[source] = norm
    pool = [p for p in kept if p not in norms]
    contribution = {p: rec.outputs[posts.get(p, p)] for p in pool}
    ours = [p for p in pool if p in block_paths]
    rest = [p for p in pool if p not in block_paths]
    # Of the sets that add up within the tolerance, the closest (then the smallest): in bfloat16 a
    # small MLP output can hide in the tolerance of a large stream, and leaving it out is not exact.
    match, best = None, None
    for size in range(0, min(4, len(rest)) + 1):
        for combo in itertools.combinations(rest, size):
            chosen = ours + list(combo)
            if not chosen:
                continue
            error = mismatch(sum(contribution[p] for p in chosen), added, rec.inputs[layer_path],
                             rec.outputs[layer_path], *(contribution[p] for p in chosen))
            if error is not None and (best is None or error < best):
                match, best = chosen, error
    if match is None:
        raise HeadscopeError(f"{family}: layer {layer} does not add its sublayers' outputs to the residual stream "
                             f"as they are (post-norm layers, or a residual multiplier), so attribution cannot take "
                             f"it apart")
    order = {p: n for n, p in enumerate(rec.order)}
    has_attention = any(p in attention_paths for p in match)
    found = []
    for n, path in enumerate(sorted(match, key=order.get)):
        if path in block_paths:
            kind = "heads"
        elif path in attention_paths:
            kind = "attn"
        else:
            kind = "mlp" if has_attention or n > 0 else "mixer"
        post = posts.get(path)
        found.append(Writer(layer, path, kind, modules[path], modules[post] if post else None, post or ""))
    return found
