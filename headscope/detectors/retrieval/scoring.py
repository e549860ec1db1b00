"""Retrieval heads (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality").

On a needle prompt (`headscope.probes.needle`), the model is teacher-forced through the answer (the
needle again). At each answer token w_t, read from the query that predicts it (position t - 1),
a head *copies* w_t when its most-attended key j* = argmax_j A[t-1, j] lies inside the needle
and holds the same token (x_{j*} = w_t). Per example,

    retrieval(head) = #{answer tokens t: the model's argmax prediction is w_t and the head copies w_t} / |needle|

(Wu et al.'s `retrieval_calculate`: 1/|needle| per generated token whose top-1 attention lands
on that token inside the needle; the code is nightdessert/Retrieval_Head). As there, only
examples the model gets right count: an example enters a head's mean only when the model
predicts at least half of the answer tokens (theirs: ROUGE > 50 on the generated answer);
others are left out (NaN) and `n` counts the rest. A head is a retrieval head at >= 0.1
(their threshold), and, as for every learned label in headscope, with its 95% bootstrap CI
lower bound above the random-init control's best head (`headscope.detectors.labels.passes`). The twin
predicts no answer token, so its score counts every answer token and every example (no
prediction filter): the stricter control.

Only the answer queries' rows are computed: inside the forward pass (headscope's kernel, SDPA
for the layer's output) each layer's q at those few positions meets all keys,
A[t-1, :] = softmax(scale * q_{t-1} . k_j over keys j <= t-1), `[head, n_answer, key]` per layer,
reduced to its argmax at once. No `[query, key]` map is ever built, so memory stays that of a
plain forward pass. The argmax does not depend on the scale, a soft-cap (monotone) or a sink
logit (shared by a row); models whose mask adds a position bias (ALiBi) would need it and are not
handled.

- `retrieval_scores(loaded, lengths, depths, n_needles, ...)` -> `RetrievalResult`; a thin call
  into analyze's core: the same `NeedleProbe`, control and `run_retrieval` (the detector's
  `run`, over `score_needles`) as `headscope.analyze(loaded, ["retrieval"], [NeedleProbe(...)])`.
- `needle_copy_accuracy(loaded, examples, heads=(), mode="zero")`: share of answer tokens the model
  predicts, with heads ablated.
- `validate_retrieval(loaded, result, k=5, n_random=5, ...)`: top-k retrieval heads against
  random same-layer heads, by needle-copy accuracy, measured by `headscope.validate`'s core
  (`NeedleProbe.eval_probe`, `ProbeRunner`, `random_head_draws`).
- `answer_rows(q, k, queries, scale)`, `copy_scores(argmax_keys, ...)`: the two formulas above.
- `RETRIEVAL`: the detector (threshold, formula, source, `run`), registered as "retrieval" by
  `headscope.detectors.retrieval`; opt-in, as it needs long prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from ...loading.control import resolve_control
from ...errors import HeadscopeError
from ...checks import check_loaded
from ...tables import with_sites
from ...hf.adapters import core_modules
from ...hf.capture import ablate
from ...hf.route import Session, layer_map, routed
from ...attention.kernel import expand_kv
from ..labels import passes
from ...probes.needle import NEEDLES, QUESTION, NeedleExample, needle_probe
from ...probes.kinds import NeedleProbe
from ..protocol import Detector, Finding, Progress
from ..stats import bootstrap_mean_ci, random_head_draws
from ..measure import ProbeRunner

__all__ = ["RETRIEVAL", "THRESHOLD", "SUCCESS", "RetrievalResult", "retrieval_scores", "score_needles", "run_retrieval",
           "answer_rows", "copy_scores", "run_needle", "needle_copy_accuracy", "validate_retrieval"]

THRESHOLD = 0.1  # Wu et al. 2024
SUCCESS = 0.5  # share of answer tokens the model must predict for an example to count (their ROUGE > 50)


def answer_rows(q: torch.Tensor, k: torch.Tensor, queries: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """Causal attention rows of a few queries against every key, without the full map.

    Args:
        q: `[batch, head, pos, d_head]`; k: `[batch, kv_head, pos, d_head]` (as the model hands
            them to attention: rotary applied, key/value heads not expanded).
        queries: `[n]` query positions.
        scale: score scale (default `1 / sqrt(d_head)`).
    Returns:
        `[batch, head, n, key]` fp32 softmax(scale * q k^T) over keys j <= query.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    queries = queries.to(q.device)
    chosen = q[:, :, queries].float()  # (B, H, n, D)
    keys = expand_kv(k, q.shape[1]).float()  # (B, H, T, D)
    scores = torch.matmul(chosen, keys.transpose(-1, -2)) * scale  # (B, H, n, T)
    hidden = torch.arange(k.shape[-2], device=q.device)[None, :] > queries[:, None]  # (n, T)
    return scores.masked_fill(hidden, float("-inf")).softmax(-1)


def copy_scores(argmax_keys: torch.Tensor, input_ids: torch.Tensor, needle: slice, answer: slice,
                predicted: torch.Tensor) -> torch.Tensor:
    """Wu et al.'s retrieval score of every head on one example.

    Args:
        argmax_keys: `[..., n_answer]` each head's most-attended key from the query that
            predicts each answer token.
        input_ids: `[pos]` the prompt; needle, answer: their spans in it.
        predicted: `[n_answer]` bool, the answer tokens that count (the model's argmax was right).
    Returns:
        `[...]` #{counted answer tokens whose argmax key is in the needle and holds the same token} / |needle|.
    """
    targets = input_ids[answer].to(argmax_keys.device)  # (n,)
    in_needle = (argmax_keys >= needle.start) & (argmax_keys < needle.stop)
    same = input_ids.to(argmax_keys.device)[argmax_keys] == targets
    copied = in_needle & same & predicted.to(argmax_keys.device)
    return copied.sum(-1).double() / (needle.stop - needle.start)  # fp64: k / n exactly as Python has it


class _AnswerArgmax(Session):
    """Reads each layer's q and k as they enter attention; keeps the answer queries' argmax keys."""

    def __init__(self, model, queries: torch.Tensor, keep_rows: bool = False):
        self.layer_of = layer_map(model)
        self.scales = {i: getattr(core, "scaling", None) for i, core in core_modules(model)}
        self.queries = queries
        self.keep_rows = keep_rows
        self.argmax: dict[int, torch.Tensor] = {}  # layer -> (B, H, n)
        self.rows: dict[int, torch.Tensor] = {}  # layer -> (B, H, n, T), only with keep_rows

    def edit_qkv(self, layer, q, k, v):
        rows = answer_rows(q.detach(), k.detach(), self.queries, self.scales.get(layer))
        self.argmax[layer] = rows.argmax(-1).cpu()
        if self.keep_rows:
            self.rows[layer] = rows.cpu()
        return q, k, v


@torch.no_grad()
def run_needle(loaded, example: NeedleExample, keep_rows: bool = False):
    """One forward pass over a needle prompt.

    Returns:
        `(argmax_keys [layer, head, n_answer], predicted [n_answer] bool, rows)`, layers being
        `loaded.attention_layers`; rows is
        `{layer: [1, head, n_answer, key]}` with `keep_rows`, else empty.
    """
    model = loaded.model
    ids = example.input_ids[None].to(loaded.device)
    n = example.answer.stop - example.answer.start
    session = _AnswerArgmax(model, example.queries, keep_rows)
    with routed(model, session):
        logits = _answer_logits(model, ids, n)
    predicted = (logits.argmax(-1).cpu() == example.input_ids[example.answer])
    argmax = torch.stack([session.argmax[layer][0] for layer in loaded.attention_layers])  # (L, H, n), attention layers
    return argmax, predicted, session.rows


def _answer_logits(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """`[n, vocab]` logits at the n positions before the last token (they predict the last n)."""
    try:
        out = model(input_ids=ids, logits_to_keep=n + 1)  # only these rows go through the unembedding
    except TypeError:  # a model class without logits_to_keep
        out = model(input_ids=ids)
    return out.logits[0, -(n + 1):-1].float()


@dataclass
class RetrievalResult:
    """What `retrieval_scores` returns.

    Attributes:
        scores: one row per head: layer, head, detector ("retrieval"), score, ci_low, ci_high, n,
            control, control_max, site (the head's attention module), retrieval (bool: the label rule).
        by_length: layer, head, length, score (mean over that length's counted examples), site.
        examples: one row per needle example: length, depth, needle, accuracy (share of answer
            tokens predicted), counted (accuracy >= SUCCESS).
        meta: settings, the control's description.
    """

    scores: object
    by_length: object
    examples: object
    meta: dict = field(default_factory=dict)
    probe: list = field(default_factory=list, repr=False)

    def top(self, n: int = 10):
        return self.scores.sort_values(["score", "layer", "head"], ascending=[False, True, True]).head(n)


def _per_example(loaded, examples, only_predicted: bool, progress: Optional[Progress], stage: str):
    """`([layer * head, example] scores with NaN for uncounted examples, accuracies)`."""
    columns, accuracy = [], []
    for number, example in enumerate(examples):
        argmax, predicted, _ = run_needle(loaded, example)
        share = float(predicted.float().mean())
        counted = predicted if only_predicted else torch.ones_like(predicted)
        score = copy_scores(argmax, example.input_ids, example.needle, example.answer, counted).flatten()
        if only_predicted and share < SUCCESS:
            score = torch.full_like(score, float("nan"))
        columns.append(score)
        accuracy.append(share)
        if progress:
            progress(stage, number + 1, len(examples))
    return torch.stack(columns, dim=1), accuracy


def score_needles(loaded, twin, examples: Sequence[NeedleExample], seed: int, progress: Optional[Progress] = None,
                  control_examples: Optional[Sequence[NeedleExample]] = None):
    """The scoring core that `retrieval_scores` and the `retrieval` detector share.

    Args:
        loaded: the model; twin: the control model or None.
        examples: needle prompts; control_examples: the twin's (default: the same).
        seed: bootstrap resamples.
        progress: `fn(stage, done, total)` after each forward pass.
    Returns:
        `(rows, by_length, per_example)`: rows with `SCORE_COLUMNS` (control NaN without a
        twin); per head and length its mean over counted examples (layer, head, length, score,
        n); per example length, depth, needle, accuracy, counted.
    """
    import pandas as pd

    values, accuracy = _per_example(loaded, examples, True, progress, "probe needle")
    mean, low, high, n = bootstrap_mean_ci(values, seed=seed)
    layers, H = torch.tensor(loaded.attention_layers), loaded.n_heads  # the model's numbers (a hybrid skips some)
    rows = pd.DataFrame({"layer": layers.repeat_interleave(H).numpy(), "head": torch.arange(H).repeat(len(layers)).numpy(),
                         "detector": RETRIEVAL.name, "score": mean.numpy(), "ci_low": low.numpy(), "ci_high": high.numpy(),
                         "n": n.numpy()})
    if twin is not None:
        twin_values, _ = _per_example(twin, examples if control_examples is None else control_examples, False, progress,
                                      "probe needle (control)")
        twin_mean = twin_values.mean(-1)
        rows["control"] = twin_mean.numpy()
        rows["control_max"] = float(twin_mean.max())
    else:
        rows["control"] = rows["control_max"] = float("nan")
    by_length = []
    for length in sorted({e.length for e in examples}):
        part = values[:, [i for i, e in enumerate(examples) if e.length == length]]
        present = ~part.isnan()
        means = torch.where(present, part, torch.zeros_like(part)).sum(-1) / present.sum(-1).clamp(min=1)
        means = torch.where(present.any(-1), means, torch.full_like(means, float("nan")))
        by_length.append(pd.DataFrame({"layer": rows.layer, "head": rows["head"], "length": length,
                                       "score": means.numpy(), "n": present.sum(-1).numpy()}))
    per_example = pd.DataFrame({"length": [e.length for e in examples], "depth": [e.depth for e in examples],
                                "needle": [e.needle_index for e in examples], "accuracy": accuracy,
                                "counted": [a >= SUCCESS for a in accuracy]})
    return rows, pd.concat(by_length, ignore_index=True), per_example


def run_retrieval(loaded, twin, probe, seed: int, progress: Optional[Progress] = None) -> Finding:
    """`RETRIEVAL.run`: what `headscope.analyze` (and `retrieval_scores`) calls with the built
    needle probe (`headscope.probes.kinds.NeedleSet`) and its control twin, which reads the
    probe's `control_examples()`. The per-length scores and the per-example accuracies become
    the analysis's `retrieval` and `needles` tables."""
    rows, by_length, per_example = score_needles(loaded, twin, probe.examples, seed, progress, probe.control_examples())
    return Finding(rows, tables={"retrieval": by_length, "needles": per_example})


def retrieval_scores(loaded, lengths: Sequence[int] = (2048, 4096, 8192), depths: Sequence[float] = (0.1, 0.5, 0.9),
                     n_needles: int = 1, seed: int = 0, *, max_len: Optional[int] = None, control="random-init",
                     control_max_len: Optional[int] = None, progress: Optional[Progress] = None,
                     needles: Sequence[str] = NEEDLES, question: str = QUESTION) -> RetrievalResult:
    """Retrieval score of every head on needle prompts, with bootstrap CIs and a control.

    A thin call into analyze's core: the same probe settings (`NeedleProbe`), the same control
    (`resolve_control`) and the same `RETRIEVAL.run` as `headscope.analyze(loaded, ["retrieval"],
    [NeedleProbe(lengths, depths, n_needles, max_len, needles, question, control_max_len)])`,
    so the same scores, returned as a `RetrievalResult` with the label rule's verdict per head.

    Args:
        loaded: a `headscope.load(...)` result of a causal model.
        lengths: prompt lengths in tokens; those above `max_len` (default: the model's context)
            are dropped.
        depths: needle depths, shares of the haystack.
        n_needles: needles per (length, depth).
        seed: needles, haystack windows and bootstrap resamples.
        max_len: longest prompt to build.
        control: as in `headscope.analyze` ("random-init", None, or a `Loaded`).
        control_max_len: score the control only on prompts up to this length (default: all);
            a random twin's argmax lands on the needle by chance more often in short prompts.
        progress: `fn(stage, done, total)` after each forward pass.
        needles, question: as in `headscope.probes.needle.needle_probe`.
    Returns:
        A `RetrievalResult`.
    """
    check_loaded(loaded, "retrieval_scores")
    settings = NeedleProbe(tuple(lengths), tuple(depths), n_needles, max_len, tuple(needles), question, control_max_len)
    probe = settings.build(loaded, seed)
    twin, control_meta = resolve_control(loaded, control, seed)  # as analyze resolves it
    finding = RETRIEVAL.run(loaded, twin, probe, seed, progress)  # what analyze calls
    frame = with_sites(finding.rows, loaded.site_names)  # each table names its heads' sites, as analyze's do
    if twin is not None:
        control_meta["lengths"] = sorted({e.length for e in probe.control_examples()})
    frame["retrieval"] = [passes(RETRIEVAL, s, lo, c) for s, lo, c in zip(frame.score, frame.ci_low, frame.control_max)]
    meta = {"model": loaded.name, "lengths": probe.lengths, "depths": list(depths), "n_needles": n_needles, "seed": seed,
            "threshold": THRESHOLD, "success": SUCCESS, "control": control_meta, "detector": RETRIEVAL.describe()}
    by_length, examples = (with_sites(finding.tables[name], loaded.site_names) for name in ("retrieval", "needles"))
    return RetrievalResult(frame, by_length, examples, meta, probe.examples)


@torch.no_grad()
def needle_copy_accuracy(loaded, examples: Sequence[NeedleExample], heads: Sequence[tuple[int, int]] = (),
                         mode: str = "zero") -> float:
    """Share of answer tokens the model predicts (argmax) over the examples, heads ablated.

    Args:
        loaded: the model; examples: needle prompts (`headscope.probes.needle.needle_probe`).
        heads: `[(layer, head), ...]` to ablate ("zero" or "mean", see `headscope.ablate`).
    """
    hits = total = 0
    for example in examples:
        ids = example.input_ids[None].to(loaded.device)
        n = example.answer.stop - example.answer.start
        if heads:
            with ablate(loaded.model, list(heads), mode=mode):
                logits = _answer_logits(loaded.model, ids, n)
        else:
            logits = _answer_logits(loaded.model, ids, n)
        hits += int((logits.argmax(-1).cpu() == example.input_ids[example.answer]).sum())
        total += n
    return hits / total


def validate_retrieval(loaded, result: RetrievalResult, k: int = 5, n_random: int = 5, seed: int = 0,
                       lengths: Sequence[int] = (1024,), depths: Sequence[float] = (0.1, 0.5, 0.9), n_needles: int = 2,
                       mode: str = "zero", batch_size: int = 4):
    """Ablate the top-k retrieval heads and `n_random` draws of random heads from the same layers.

    Measured by `headscope.validate`'s core: each length's prompts are the needle probe's
    `NeedleProbe.eval_probe` (seed + 1, so not the prompts the scores came from; every answer
    token scored) run by its `ProbeRunner`, whose accuracy is needle-copy accuracy (the share of
    answer tokens the model predicts, as `needle_copy_accuracy`); over several lengths the
    accuracies are pooled over their answer tokens. Random heads are drawn as `validate` draws
    them (`random_head_draws`): as many per layer as the top-k has there, none of the top-k.
    "mean" ablation substitutes each head's mean z over the unablated prompts (`validate`'s rule).

    Returns:
        DataFrame: ablation ("none", "top", "random 1", ...), heads ("l.h;..."), accuracy, delta
        (accuracy - unablated). `attrs["hurts_more"]`: top's delta is negative and below every
        random delta.
    """
    import numpy as np
    import pandas as pd

    if mode not in ("zero", "mean"):
        raise HeadscopeError(f"unknown ablation mode {mode!r}; use 'zero' or 'mean'")
    top = [(int(r.layer), int(r.head)) for r in result.top(k).itertuples(index=False)]
    draws = random_head_draws(top, set(top), loaded.n_heads, n_random, np.random.default_rng(seed))
    if draws is None:
        raise HeadscopeError(f"a layer of the top {len(top)} heads has too few other heads for a random draw")
    per_length = len(depths) * n_needles
    runners = [ProbeRunner(loaded, NeedleProbe((length,), tuple(depths), n_needles).eval_probe(loaded, per_length, seed + 1),
                           batch_size) for length in lengths]
    answers = [int(runner.probe.scored.sum()) for runner in runners]

    def accuracy(heads) -> float:
        measured = [runner.measure(heads, mode) if heads else runner.baseline for runner in runners]
        return sum(m.accuracy * n for m, n in zip(measured, answers)) / sum(answers)

    base = accuracy([])
    rows = [("none", [], base), ("top", top, accuracy(top))]
    rows += [(f"random {i + 1}", draw, accuracy(draw)) for i, draw in enumerate(draws)]
    frame = pd.DataFrame([{"ablation": name, "heads": ";".join(f"{l}.{h}" for l, h in heads), "accuracy": acc,
                           "delta": acc - base} for name, heads, acc in rows])
    random_deltas = frame.delta[frame.ablation.str.startswith("random")]
    frame.attrs = {"hurts_more": bool(frame.delta[1] < 0 and frame.delta[1] < random_deltas.min()), "mode": mode, "lengths": list(lengths),
                   "depths": list(depths), "n_needles": n_needles, "seed": seed + 1,
                   "n_examples": sum(len(runner.probe) for runner in runners)}
    return frame


def _not_a_pattern_detector(pattern, batch):
    raise HeadscopeError("retrieval reads its own needle probe: use headscope.analyze(loaded, detectors=['retrieval'])")


RETRIEVAL = Detector(
    name="retrieval", probe="needle", threshold=THRESHOLD, opt_in=True, quantity="share of needle tokens copied",
    formula="per needle example: #{answer tokens the model predicts whose query's argmax key is the same token "
            "inside the needle} / |needle|; examples where the model predicts < 50% of the answer left out",
    source="Wu et al. 2024 (retrieval heads; threshold 0.1, their code nightdessert/Retrieval_Head)",
    fn=_not_a_pattern_detector, run=run_retrieval, colour="#e6550d", short="retr",
    applies_to=("causal",))  # the needle probe teacher-forces next-token predictions
