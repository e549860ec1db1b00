"""`analyze`: score every head of a model with the detectors, with confidence intervals.

For each probe the detectors need, batches run through the model inside `capture(reduce=...)`,
so each layer's pattern is turned into per-example scores `[batch, head]` as soon as it is
computed and never stored (only a few short explorer examples keep their maps). When every
detector of a probe reads the pattern only through a `LazyPattern`'s entries and row
statistics (all built-in pattern detectors do), the layer runs the fused kernel and the map is
never computed either (`lazy=True`, the default). Scores are the
mean over probe examples with a 95% percentile-bootstrap interval (`headscope.stats`). The
same batches also run through a control model, an untrained twin (`headscope.control`), whose
score for the same head (`control`) and best score over heads (`control_max`) join the table;
labels follow `headscope.labels`.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Optional

import pandas as pd
import torch

from . import __version__
from .analysis import Analysis, Example
from .control import resolve_control
from .detectors.variants import best_variant
from .errors import HeadscopeError
from .hf.capture import capture
from .labels import label_heads
from .probes import ProbeSet, repeated_probe, text_probe
from .syntax import run_syntax
from .syntax.crossfit import NotEnoughArcs
from .tokens import display_tokens

__all__ = ["analyze", "Progress", "MAP_BUDGET"]

Progress = Callable[[str, int, int], None]  # (stage, done, total)
MAP_BUDGET = 256 * 2**20  # bytes of fp32 pattern computed at once before heads go in groups


def _check_args(loaded, names, n_examples, batch_size):
    from . import detectors as registry

    if n_examples <= 0:
        raise HeadscopeError(f"n_examples must be at least 1, got {n_examples}")
    if batch_size <= 0:
        raise HeadscopeError(f"batch_size must be at least 1, got {batch_size}")
    chosen = registry.defaults(loaded.causal) if names is None else list(dict.fromkeys(names))
    if not chosen:
        raise HeadscopeError("no detectors chosen")
    dets = [registry.get(n) for n in chosen]
    for det in dets:
        if det.bidirectional_only and loaded.causal:
            raise HeadscopeError(f"detector {det.name!r} needs a bidirectional model; {loaded.name} is causal")
    return dets


def _read_treebank(treebank):
    """(sentences, meta): None -> the bundled treebank; a path -> its sentences; a list -> itself."""
    from .treebank import bundled_treebank, read_conllu

    if treebank is None:
        sentences = bundled_treebank()
        natural = sum(s.sent_id.startswith("nat-") for s in sentences)
        return sentences, {"source": "bundled", "n_sentences": len(sentences), "natural": natural}
    if isinstance(treebank, (str, os.PathLike)):
        sentences = read_conllu(treebank)
        return sentences, {"source": str(treebank), "n_sentences": len(sentences), "natural": None}
    sentences = list(treebank)
    return sentences, {"source": "sentences given in Python", "n_sentences": len(sentences), "natural": None}


def _check_lengths(loaded, probes: dict[str, ProbeSet]) -> None:
    for name, probe in probes.items():
        loaded.check_fits(f"the {name} probe", probe.input_ids.shape[1])


def _build_probes(loaded, dets, n_examples, seq_len, repeat_len, repeats, seed) -> dict[str, ProbeSet]:
    probes = {}
    for name in dict.fromkeys(d.probe for d in dets):
        if name == "text":
            probes[name] = text_probe(loaded.tokenizer, n_examples, seq_len, seed)
        elif name == "repeated":
            vocab = loaded.model.config.vocab_size
            probes[name] = repeated_probe(loaded.tokenizer, n_examples, repeat_len, repeats, seed, vocab_size=vocab)
    return probes


@torch.no_grad()
def _run_probe(loaded, probe: ProbeSet, dets, batch_size, progress: Optional[Progress], lazy: bool = True,
               stage: Optional[str] = None, map_budget: int = MAP_BUDGET):
    """Per-example scores {detector: {layer: [examples, head]}}, how patterns were computed
    ("lazy", "maps" or "maps, N heads at a time"), and the layers whose heads have learned sink
    logits (their pattern rows sum to less than 1).

    Under torchrun the batches are dealt across processes and the results gathered in order.
    """
    from .distributed import gather, mine, rank_and_size

    batches = probe.batches(batch_size, loaded.causal, loaded.device)
    todo = [i for i in range(len(batches)) if mine(i)]
    report = progress if rank_and_size()[0] == 0 else None
    stage = stage or f"probe {probe.name}"
    if report:
        report(stage, 0, len(todo))
    done = []
    first = batches[0].input_ids if batches else None
    lazy = lazy and all(d.lazy for d in dets)
    chunk = _head_chunk(first.shape[0], first.shape[1], loaded.n_heads, map_budget) if first is not None and not lazy else None
    with capture(loaded.model, reduce=lambda layer, pattern, mask: _reduce(layer, pattern, current, dets),
                 chunk_heads=chunk, lazy=lazy) as cap:
        for n, i in enumerate(todo):
            current = {"batch": batches[i], "on": {}}
            loaded.body(input_ids=batches[i].input_ids, attention_mask=batches[i].attention_mask.long())
            done.append((i, {layer: results.pop() for layer, results in cap.results.items()}))
            if report:
                report(stage, n + 1, len(todo))
    per_batch = gather(done)  # [{layer: {detector: [batch, head]}}] in batch order
    how = "lazy" if lazy else ("maps" if chunk is None else f"maps, {chunk} heads at a time")
    sink_layers = sorted(layer for layer, extras in cap.extras.items() if "sinks" in extras)
    return {det.name: {layer: torch.cat([b[layer][det.name] for b in per_batch]) for layer in range(loaded.n_layers)}
            for det in dets}, how, sink_layers


SINK_NOTE = ("{n} of {total} layers have a learned sink logit per head: each pattern row sums to less than 1 (the "
             "sink takes the rest), and every score reads the tokens' share only")

def _head_chunk(batch: int, length: int, n_heads: int, budget: int) -> Optional[int]:
    """Heads per group so one group's map stays under `budget` bytes (None: all heads at once)."""
    per_head = batch * length * length * 4
    chunk = max(1, budget // per_head)
    return None if chunk >= n_heads else int(chunk)


def _reduce(layer, pattern, current, dets) -> dict:
    """One layer's pattern (or LazyPattern) -> {detector: [batch, head]} on the CPU; nothing is kept."""
    device = pattern.device  # with a device map each layer has its own
    if device not in current["on"]:
        current["on"][device] = current["batch"].to(device)
    batch = current["on"][device]
    return {det.name: det.score(pattern, batch).float().cpu() for det in dets}


@torch.no_grad()
def _explorer_examples(loaded, probes, n_show, length) -> list[Example]:
    examples = []
    for name, probe in probes.items():
        ids = probe.input_ids[:n_show, :length].to(loaded.device)
        with capture(loaded.model, to="cpu") as cap:
            loaded.body(input_ids=ids, attention_mask=torch.ones_like(ids))
        maps = torch.stack([cap.patterns[l] for l in range(loaded.n_layers)], dim=1)  # (N, L, H, T, T)
        for i in range(ids.shape[0]):
            tokens = display_tokens(loaded.tokenizer, ids[i].tolist())  # " word", not "Ġword"; bad bytes as <0xNN>
            examples.append(Example.from_float(name, i, tokens, maps[i].numpy()))
    return examples


def analyze(
    loaded,
    detectors: Optional[Iterable[str]] = None,
    n_examples: int = 16,
    seq_len: int = 128,
    batch_size: int = 8,
    seed: int = 0,
    *,
    repeat_len: int = 25,
    repeats: int = 4,
    explorer_examples: int = 2,
    explorer_len: int = 48,
    probes: Optional[dict[str, ProbeSet]] = None,
    treebank=None,
    n_sentences: Optional[int] = None,
    validate: bool = False,
    progress: Optional[Progress] = None,
    lazy: bool = True,
    map_budget: int = MAP_BUDGET,
    control="random-init",
) -> Analysis:
    """Score every head of a loaded model.

    Args:
        loaded: a `headscope.load(...)` result.
        detectors: detector names (default: all that apply to the model; see
            `headscope.detectors.names()`).
        n_examples: probe examples per probe (the bootstrap resamples these).
        seq_len: tokens per natural-text example.
        batch_size: examples per forward pass.
        seed: chooses text windows, random tokens and bootstrap resamples.
        repeat_len, repeats: the repeated-random-tokens probe (Olsson et al.: 25 x 4).
        explorer_examples, explorer_len: examples per probe whose full maps are kept for the
            report's head explorer, truncated to this many tokens.
        probes: your own `ProbeSet`s by probe name ("text", "repeated"), used instead of the
            bundled ones (n_examples, seq_len, repeat_len and repeats then do not apply to them).
        treebank: for the syntactic detector, a CoNLL-U file path or a list of
            `headscope.treebank.Sentence` (default: the bundled treebank, probes/syntax).
        n_sentences: score a seeded sample of this many treebank sentences (None, the default:
            all of them; the bundled treebank has 445).
        validate: also run `headscope.validate` (ablate each label's top-3 heads against
            random heads) and keep its table in `.validation`.
        progress: `fn(stage, done, total)` called as batches finish.
        lazy: score from the fused kernel's output and row log-sum-exp where every detector of
            a probe allows it (no map is computed); False computes each layer's full map, the
            reference path (same scores to float rounding, slower).
        map_budget: on the maps path, the bytes of fp32 pattern one layer may compute at once
            (default `MAP_BUDGET`, 256 MiB); a layer whose map is larger runs in head groups
            that fit (same scores; `meta["probes"]` says "maps, N heads at a time").
        control: "random-init" (default): score the same probes on a twin with the same config
            and tokenizer and seeded random weights (skipped, and said so in `meta["control"]`,
            when it would not fit in memory); None or "none": no control; or a `Loaded` to use
            as the control. Learned-behaviour labels need the head's CI lower bound above the
            control's best head (`headscope.labels`).
    Returns:
        An `Analysis`.
    """
    started = time.perf_counter()
    dets = _check_args(loaded, detectors, n_examples, batch_size)
    timings = {}
    t = time.perf_counter()
    twin, control_meta = resolve_control(loaded, control, seed)
    timings["control_init"] = time.perf_counter() - t
    t = time.perf_counter()
    sentences, treebank_meta = _read_treebank(treebank) if any(d.probe == "treebank" for d in dets) else (None, None)
    pattern_dets = [d for d in dets if d.probe != "treebank"]
    given = probes or {}
    built = _build_probes(loaded, [d for d in pattern_dets if d.probe not in given], n_examples, seq_len, repeat_len, repeats, seed)
    probes = {name: given.get(name) or built[name] for name in dict.fromkeys(d.probe for d in pattern_dets)}
    _check_lengths(loaded, probes)
    timings["probes"] = time.perf_counter() - t

    per_example: dict[str, dict[int, torch.Tensor]] = {}
    control_per_example: dict[str, dict[int, torch.Tensor]] = {}
    patterns, sink_layers = {}, set()
    for name, probe in probes.items():
        t = time.perf_counter()
        probe_dets = [d for d in dets if d.probe == name]
        scores, patterns[name], sinks = _run_probe(loaded, probe, probe_dets, batch_size, progress, lazy,
                                                   map_budget=map_budget)
        per_example.update(scores)
        sink_layers.update(sinks)
        timings[f"probe_{name}"] = time.perf_counter() - t
        if twin is not None:
            t = time.perf_counter()
            scores, _, _ = _run_probe(twin, probe, probe_dets, batch_size, progress, lazy,
                                      stage=f"probe {name} (control)", map_budget=map_budget)
            control_per_example.update(scores)
            timings[f"probe_{name}_control"] = time.perf_counter() - t

    names = {}
    for det in pattern_dets:
        if det.variants:  # one score per head: its best variant (e.g. positional offset), chosen per model
            per_example[det.name], chosen = best_variant(per_example[det.name], det.variants)
            names.update({(l, h, det.name): f"{det.name}:{v}" for (l, h), v in chosen.items()})
            if det.name in control_per_example:
                control_per_example[det.name], _ = best_variant(control_per_example[det.name], det.variants)

    syntax = None
    skipped_syntax = None
    if sentences is not None:
        t = time.perf_counter()
        try:
            syntax = run_syntax(loaded, sentences, batch_size=batch_size, progress=progress, seed=seed,
                                max_sentences=n_sentences, control=twin)
        except NotEnoughArcs as err:
            if detectors is not None or treebank is not None:  # asked for: say why it cannot run
                raise
            # Among the defaults (a model with a short context, say) it is left out and said so.
            dets = [d for d in dets if d.probe != "treebank"]
            skipped_syntax = f"syntactic detector skipped: {err}"
        timings["probe_treebank"] = time.perf_counter() - t

    t = time.perf_counter()
    scores = _score_table(per_example, pattern_dets, loaded.n_layers, loaded.n_heads, seed)
    if twin is not None:
        scores = _with_control(scores, _score_table(control_per_example, pattern_dets, loaded.n_layers, loaded.n_heads, seed))
    else:
        scores = scores.assign(control=float("nan"), control_max=float("nan"))
    if syntax is not None:
        rows = syntax.head_scores
        scores = pd.concat([scores, rows[list(scores.columns)]], ignore_index=True)
        names |= {(l, h, "syntactic"): f"syntactic:{r}" for l, h, r in zip(rows["layer"], rows["head"], rows["relation"])}
    labels = label_heads(scores, {d.name: d for d in dets}, names)
    timings["statistics"] = time.perf_counter() - t
    t = time.perf_counter()
    examples = _explorer_examples(loaded, probes, explorer_examples, explorer_len) if explorer_examples else []
    timings["explorer"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - started
    meta = _meta(loaded, dets, probes, seed, timings, batch_size)
    meta["control"] = control_meta
    if treebank_meta is not None:
        meta["treebank"] = treebank_meta
    if skipped_syntax:
        meta["syntax_notes"] = [skipped_syntax]
    for name, how in patterns.items():
        meta["probes"][name]["patterns"] = how
    if sink_layers:
        meta["notes"] = [SINK_NOTE.format(n=len(sink_layers), total=loaded.n_layers)]
    analysis = Analysis(scores=scores, labels=labels, meta=meta, examples=examples)
    if syntax is not None:
        _attach_syntax(analysis, syntax)
    if validate:
        from .validation import validate as run_validation

        t = time.perf_counter()
        analysis.validation = run_validation(loaded, analysis, seed=seed, n_examples=min(n_examples, 8), seq_len=seq_len,
                                             batch_size=batch_size, repeat_len=repeat_len, repeats=repeats,
                                             progress=progress)
        meta["timings"]["validate"] = round(time.perf_counter() - t, 3)
        meta["timings"]["total"] = round(time.perf_counter() - started, 3)
    return analysis


def _attach_syntax(analysis: Analysis, syntax) -> None:
    meta = analysis.meta
    meta["probes"]["treebank"] = {"n_examples": syntax.meta.get("n_sentences"), "seq_len": None,
                                  "description": f"{syntax.meta.get('n_sentences')} dependency-annotated sentences, "
                                                 f"{syntax.meta.get('n_arcs')} arcs"}
    meta["syntax_best"] = syntax.best.to_dict(orient="records")
    meta["syntax_notes"] = list(syntax.notes)
    analysis.syntax = syntax.table


def _with_control(scores, control):
    """Add the control's score for the same head and detector, and its best over heads."""
    keyed = control.set_index(["layer", "head", "detector"]).score
    best = control.groupby("detector").score.max()
    same = [keyed.get((l, h, d), float("nan")) for l, h, d in zip(scores.layer, scores["head"], scores.detector)]
    return scores.assign(control=same, control_max=scores.detector.map(best).astype(float))


def _score_table(per_example, dets, n_layers, n_heads, seed):
    from .stats import bootstrap_mean_ci

    frames = []
    for det in dets:
        values = torch.stack([per_example[det.name][layer] for layer in range(n_layers)])  # (L, N, H)
        rows = values.permute(0, 2, 1).reshape(n_layers * n_heads, -1)  # (L*H, N)
        mean, low, high, n = bootstrap_mean_ci(rows, seed=seed)
        frames.append(pd.DataFrame({
            "layer": torch.arange(n_layers).repeat_interleave(n_heads).numpy(),
            "head": torch.arange(n_heads).repeat(n_layers).numpy(),
            "detector": det.name, "score": mean.numpy(), "ci_low": low.numpy(), "ci_high": high.numpy(),
            "n": n.numpy(),
        }))
    if not frames:
        return pd.DataFrame(columns=["layer", "head", "detector", "score", "ci_low", "ci_high", "n"])
    return pd.concat(frames, ignore_index=True)


def _meta(loaded, dets, probes, seed, timings, batch_size) -> dict:
    import datetime

    import transformers

    config = loaded.model.config
    return {
        "model": loaded.name, "family": loaded.family, "causal": loaded.causal,
        "n_layers": loaded.n_layers, "n_heads": loaded.n_heads,
        "n_kv_heads": getattr(config, "num_key_value_heads", None) or loaded.n_heads,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "device": str(loaded.device), "dtype": str(loaded.model.dtype).replace("torch.", ""),
        "probes": {name: {"n_examples": len(p), "seq_len": int(p.input_ids.shape[1]), "description": p.description}
                   for name, p in probes.items()},
        "batch_size": batch_size, "seed": seed,
        "versions": {"headscope": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "detectors": {d.name: d.describe() for d in dets},
    }
