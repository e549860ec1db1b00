"""A synthetic but realistic `Analysis` for report tests, built without a model.

- `fake_analysis(n_layers, n_heads, seed, with_syntax, control, ...)`: scores with CIs and the
  control model's scores (`control`, `control_max`) for every detector, labels that include
  "mixed", "none" and (with syntax) "syntactic:obj", metadata shaped like `headscope.analyze`'s
  (detector quantities, `control`, `treebank`), example patterns whose heads do what their label says, and tokens with
  HTML nasties (`<script>alert(1)</script>`, `&amp;`, `<b>&`, `</script>`); with `key_len`,
  cross-attention examples whose keys are other tokens (`Example.key_tokens`, nasties first).
- `fake_analysis_with_retrieval(scores)`: `fake_analysis` without syntax, sized by `scores`
  `[layer, head]`, with those scores added as the (opt-in) retrieval detector's rows.
- `NASTY_TOKENS`: those tokens, for escaping tests; `KEY_WORDS`: the cross-attention keys' words.
- `DETECTORS`: the detectors it scores (plus "syntactic" with syntax). What each one is (threshold,
  formula, source, probe, learned, gate, quantity, ...) is read from the registered `Detector`
  (`headscope.detectors.REGISTRY`), as `headscope.analyze` records it, so the fake cannot drift
  from the registry.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import pandas as pd

from headscope.analysis import Analysis, Example
from headscope.detectors import REGISTRY

__all__ = ["fake_analysis", "fake_analysis_with_retrieval", "NASTY_TOKENS", "KEY_WORDS", "DETECTORS"]

NASTY_TOKENS = ["<script>alert(1)</script>", "&amp;", "<b>&", "</script>"]
DETECTORS = ("previous_token", "induction", "duplicate_token", "self", "next_token", "sink", "uniform")
RELATIONS = ["nsubj", "obj", "det", "amod", "advmod"]
_PLAN = ["previous_token", "induction", "sink", "mixed", "none", "uniform", "duplicate_token",
         "syntactic:obj", "self", "none", "previous_token", "sink", "mixed", "induction"]
KEY_WORDS = ["Le", " chat", " assis", " sur", " le", " tapis"]  # cross-attention's keys: the encoder's tokens
_WORDS = ["The", " cat", " sat", " on", " the", " mat", ".", " A", " dog", " ran", ",", " and"]


def fake_analysis(n_layers: int = 4, n_heads: int = 3, seed: int = 0, with_syntax: bool = True,
                  *, n_examples: int = 2, seq_len: int = 14, created: str = "2025-01-02T03:04:05+00:00",
                  control: bool = True, key_len: Optional[int] = None) -> Analysis:
    """A deterministic synthetic Analysis.

    Args:
        n_layers, n_heads: grid size.
        seed: numpy seed for scores and patterns.
        with_syntax: add the "syntactic" detector, `.syntax`, `meta["syntax_best"]` and `meta["treebank"]`.
        control: a random-init control (`control`, `control_max` columns); False: NaN there and
            `meta["control"]["kind"] == "none"`.
        n_examples: number of stored examples (probes "text" and "repeated" alternate).
        seq_len: tokens per example (at least 8).
        created: the meta["created"] timestamp.
        key_len: None (self-attention examples), or that many key tokens of their own per
            example, as cross-attention's encoder tokens, with random `[query, key]` rows.
    Returns:
        An `Analysis`.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    detectors = list(DETECTORS) + (["syntactic"] if with_syntax else [])
    thresholds = {det: REGISTRY[det].threshold for det in detectors}
    plan = [[_PLAN[(layer * n_heads + head * 4 + seed) % len(_PLAN)] for head in range(n_heads)]
            for layer in range(n_layers)]
    if not with_syntax:
        plan = [["next_token" if p == "syntactic:obj" else p for p in row] for row in plan]

    score_rows, label_rows = [], []
    for layer in range(n_layers):
        for head in range(n_heads):
            wanted = {"mixed": ["previous_token", "induction"], "none": []}.get(plan[layer][head], [plan[layer][head].split(":")[0]])
            scores = {}
            for det in detectors:
                low, high = (thresholds[det] + 0.05, 0.97) if det in wanted else (0.0, 0.6 * thresholds[det])
                scores[det] = float(rng.uniform(low, high))
                n = int(rng.integers(80, 160))
                half = 1.96 * np.sqrt(scores[det] * (1 - scores[det]) / n)
                score_rows.append((layer, head, det, scores[det], max(0.0, scores[det] - half), min(1.0, scores[det] + half), n))
            clarity = {det: (scores[det] - thresholds[det]) / (1 - thresholds[det]) for det in detectors}
            passed = sorted((det for det in detectors if scores[det] >= thresholds[det]), key=clarity.get, reverse=True)
            passing = [det if det != "syntactic" else "syntactic:obj" for det in passed]  # clearest first
            if len(passing) == 1:
                label, score = passing[0], scores[passed[0]]
            else:  # "mixed" shows its clearest detector's score
                label, score = ("mixed", scores[passed[0]]) if passing else ("none", max(scores.values()))
            label_rows.append((layer, head, label, score, ";".join(passing)))
    scores_df = pd.DataFrame(score_rows, columns=["layer", "head", "detector", "score", "ci_low", "ci_high", "n"])
    # The control: a low score per head; its best head per detector stays below every label's CI.
    twin = rng.uniform(0.0, 0.2, len(scores_df)) if control else np.full(len(scores_df), np.nan)
    scores_df["control"] = twin
    scores_df["control_max"] = pd.Series(twin).groupby(scores_df["detector"]).transform("max").to_numpy()
    labels_df = pd.DataFrame(label_rows, columns=["layer", "head", "label", "score", "labels"])

    examples = [_example(rng, plan, i, max(8, seq_len)) for i in range(n_examples)]
    if key_len is not None:
        examples = [_cross_example(rng, example, key_len) for example in examples]
    meta = _meta(n_layers, n_heads, seed, detectors, seq_len, n_examples, created)
    meta["control"] = (
        {"kind": "random-init", "seed": seed + 1_000_003, "name": f"{meta['model']} (random-init control)",
         "note": "a twin with the same config and tokenizer and seeded random weights"} if control else
        {"kind": "none", "seed": None, "name": None,
         "note": "no control model: labels are not checked against an untrained twin"})
    syntax = None
    if with_syntax:
        syntax, meta["syntax_best"] = _syntax(rng, plan)
        meta["treebank"] = {"source": "bundled", "n_sentences": 445, "natural": 445}
    return Analysis(scores=scores_df, labels=labels_df, meta=meta, examples=examples, syntax=syntax)


def fake_analysis_with_retrieval(scores: np.ndarray) -> Analysis:
    """`fake_analysis` (no syntax, no retrieval detector) of `scores.shape` `[layer, head]`, with
    `scores` as retrieval rows (`ci_low` = `ci_high` = the score, `n` 4, control 0)."""
    n_layers, n_heads = scores.shape
    analysis = fake_analysis(n_layers, n_heads, with_syntax=False)
    layers, heads = np.meshgrid(range(n_layers), range(n_heads), indexing="ij")
    rows = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "detector": "retrieval",
                         "score": scores.ravel(), "ci_low": scores.ravel(), "ci_high": scores.ravel(), "n": 4,
                         "control": 0.0, "control_max": 0.0})
    return dataclasses.replace(analysis, scores=pd.concat([analysis.scores, rows], ignore_index=True))


def _example(rng, plan, index: int, seq_len: int) -> Example:
    """Tokens (nasties first, then a repeated half for induction) and planned patterns."""
    probe = "text" if index % 2 == 0 else "repeated"
    half = max(1, (seq_len - 1 - len(NASTY_TOKENS)) // 2)
    body = [(_WORDS + NASTY_TOKENS)[int(k)] for k in rng.integers(0, len(_WORDS) + len(NASTY_TOKENS), half)]
    tokens = (["<s>"] + NASTY_TOKENS + body + body)[:seq_len]
    tokens += [_WORDS[k % len(_WORDS)] for k in range(seq_len - len(tokens))]
    n_layers, n_heads = len(plan), len(plan[0])
    patterns = np.zeros((n_layers, n_heads, seq_len, seq_len), dtype=np.float32)  # [layer, head, query, key]
    for layer in range(n_layers):
        for head in range(n_heads):
            patterns[layer, head] = _pattern(rng, plan[layer][head], tokens)
    return Example.from_float(probe, index, tokens, patterns)


def _cross_example(rng, example: Example, key_len: int) -> Example:
    """`example`'s queries over `key_len` keys of their own: `KEY_WORDS` behind the nasties."""
    keys = [(list(reversed(NASTY_TOKENS)) + KEY_WORDS * key_len)[k] for k in range(key_len)]
    n_layers, n_heads, n_queries = example.patterns.shape[:3]
    patterns = rng.dirichlet(np.full(key_len, 0.3), size=(n_layers, n_heads, n_queries))  # [layer, head, query, key]
    return Example.from_float(example.probe, example.index, example.tokens, patterns, key_tokens=keys)


def _pattern(rng, kind: str, tokens: list[str]) -> np.ndarray:
    """A causal `[query, key]` pattern whose main target follows `kind`, plus peaky noise."""
    T = len(tokens)
    allowed = np.tril(np.ones((T, T), dtype=np.float32))
    noise = rng.dirichlet(np.full(T, 0.3), size=T).astype(np.float32) * allowed
    noise /= noise.sum(-1, keepdims=True)
    target = np.zeros((T, T), dtype=np.float32)
    for i in range(T):
        earlier = [j for j in range(i) if tokens[j] == tokens[i]]
        if kind in ("previous_token", "mixed"):
            target[i, max(i - 1, 0)] += 1.0
        if kind in ("induction", "mixed"):
            target[i, earlier[-1] + 1 if earlier else 0] += 1.0
        if kind == "duplicate_token":
            target[i, earlier[-1] if earlier else i] = 1.0
        if kind in ("self", "next_token"):
            target[i, i] = 1.0
        if kind == "sink":
            target[i, 0] = 1.0
        if kind == "uniform":
            target[i, : i + 1] = 1.0
        if kind.startswith("syntactic"):
            target[i, (i * 7) % (i + 1)] = 1.0
    if kind == "none":
        return noise
    target /= target.sum(-1, keepdims=True)
    return 0.8 * target + 0.2 * noise


def _meta(n_layers, n_heads, seed, detectors, seq_len, n_examples, created) -> dict:
    probes = {
        "text": {"n_examples": 24, "seq_len": seq_len, "description": "natural text"},
        "repeated": {"n_examples": 24, "seq_len": seq_len, "description": "random tokens, repeated once"},
    }
    if "syntactic" in detectors:
        probes["syntax"] = {"n_examples": 40, "seq_len": 32, "description": "CoNLL-U sentences"}
    return {
        "model": f"fake/tiny-{n_layers}x{n_heads}", "family": "llama",
        "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": max(1, n_heads // 3), "causal": True,
        "parameters": 1_234_567 * n_layers, "probes": probes, "seed": seed,
        "versions": {"headscope": "0.1.0", "torch": "2.13.0", "transformers": "5.0.0"},
        "timings": {"capture": 1.25, "detect": 0.5, "total": 1.75 + n_examples * 0.01},
        "created": created,
        "detectors": {det: REGISTRY[det].describe() for det in detectors},  # as headscope.analyze records them
    }


def _syntax(rng, plan):
    """Per-relation accuracy of every head in both directions, and the best head per relation."""
    import pandas as pd

    rows, best = [], []
    for r, relation in enumerate(RELATIONS):
        baseline, n = 0.2 + 0.1 * r, 50 + 20 * r
        rel_rows = []
        for layer, row in enumerate(plan):
            for head, kind in enumerate(row):
                for direction in ("dep->head", "head->dep"):
                    top = kind == "syntactic:obj" and relation == "obj" and direction == "dep->head"
                    accuracy = float(rng.uniform(0.6, 0.9) if top else rng.uniform(0.0, baseline + 0.15))
                    # Heads labelled obj are also significant for nsubj (a second relation to list).
                    also = kind == "syntactic:obj" and relation == "nsubj" and direction == "dep->head"
                    accuracy = float(rng.uniform(0.6, 0.7)) if also else accuracy
                    margin = accuracy - baseline - 0.01
                    low, high = margin - 0.08, margin + 0.08
                    rel_rows.append((layer, head, relation, direction, accuracy, baseline, n,
                                     "offset -1" if r % 2 else "first word", margin, low, high, bool(low >= 0.1)))
        rows += rel_rows
        layer, head, _, direction, accuracy = max(rel_rows, key=lambda t: t[4])[:5]
        best.append({"relation": relation, "layer": layer, "head": head, "direction": direction,
                     "accuracy": accuracy, "baseline_kind": "offset -1" if r % 2 else "first word",
                     "baseline_accuracy": baseline, "held_out_margin": accuracy - baseline - 0.01,
                     "significant": accuracy - baseline > 0.2, "n": n})
    frame = pd.DataFrame(rows, columns=["layer", "head", "relation", "direction", "accuracy", "baseline", "n",
                                        "baseline_kind", "held_out_margin", "ci_low", "ci_high", "significant"])
    return frame, best
