"""`validate`: remove the heads a detector found and measure what breaks, against random heads.

For each label with heads (not "none" or "mixed"), its top-k heads by score are ablated, zero
and mean, and the model's metric (`metric_for`) is measured on the probe of the label's
detector (`Detector.probe`, built by its probe kind's `eval_probe`). The control ablates k
random heads from the same layers (as many per layer, none carrying the label), `n_random`
times. For detectors with `icl_check` (induction) the in-context learning score (Olsson et al.
2022) is also measured with their heads ablated and with the same random draws, as rows
labelled "icl_score". Labels come in the analysis's detector order.

An analysis of an encoder-decoder's decoder sites (`analyze(loaded, sites="decoder.cross")`) is
checked at the same group: each probe is read as a teacher-forced copy
(`headscope.probes.copy.as_copy_eval`: the encoder reads the example, the decoder the same tokens
shifted right), the metric is the decoder's loss of predicting each token ("copy_token_loss"),
and heads are ablated, and means recorded, at that group's layers. No "icl_score" rows there:
the decoder sees the whole text in the encoder, so a late token is easier for other reasons.
An encoder that reads audio (Whisper's, analysed with silence as its input) has no tokens to
copy, so its decoder's sites are refused in one line (`NO_VALIDATE_AUDIO`).
"""
from __future__ import annotations

import time
import zlib
from typing import Iterable, Optional

import numpy as np

from ..errors import HeadscopeError
from ..checks import check_analysis, check_count, check_loaded
from ..hf.adapters import adapter_for
from ..probes.copy import as_copy_eval
from ..probes.kinds import PROBE_KINDS, TextProbe, decoder_start, probe_settings
from ..detectors.protocol import Progress
from ..detectors.registry import REGISTRY, detector_spec
from ..detectors.stats import random_head_draws
from ..tables import VALIDATION_COLUMNS, read_csv, write_csv
from ..detectors.measure import METRICS, ProbeRunner, icl_positions, icl_score, masked_for_lm, metric_for

__all__ = ["validate", "read_csv", "write_csv", "COLUMNS", "MODES", "ICL_LABEL", "SKIPPED", "probe_for",
           "NO_VALIDATE_AUDIO"]

MODES = ("zero", "mean")
SKIPPED = frozenset({"none", "mixed"})
ICL_LABEL = "icl_score"
COLUMNS = VALIDATION_COLUMNS
NO_VALIDATE_AUDIO = ("validate is not available at {name}'s decoder sites: its metric is the decoder's loss of copying "
                     "the tokens the encoder read, and this encoder reads audio (silence in the analysis); analyze "
                     "without validate")


def probe_for(label: str, meta: Optional[dict] = None) -> str:
    """The probe a label's heads are checked on: its detector's (text for an unknown detector)."""
    probe = detector_spec(meta or {}, label).get("probe", "text")
    return probe if probe in PROBE_KINDS else "text"


def validate(
    loaded,
    analysis,
    k: int = 3,
    mode: str = "mean",
    n_random: int = 5,
    seed: int = 0,
    n_examples: int = 8,
    progress: Optional[Progress] = None,
    *,
    labels: Optional[Iterable[str]] = None,
    probes: Optional[Iterable] = None,
    icl: bool = True,
    icl_len: int = 512,
    batch_size: int = 8,
):
    """Ablate each label's top-k heads and compare the damage with k random heads' damage.

    Both ablation modes always run (a `mode` column): "zero" sets a head's z to 0, "mean" to its
    mean over the probe's real tokens on the unablated model. `mode` picks the rows whose
    verdict counts (`primary` is True on them); the report's chart and summary use only those.

    Args:
        loaded: a `headscope.load(...)` result.
        analysis: an `Analysis` of the same model (same layers x heads); one of a decoder's
            sites (`meta["sites"]["group"]`) is checked at that group (`loaded.at(group)`).
        k: heads ablated per label (fewer when the label has fewer).
        mode: "mean" or "zero": which rows are primary.
        n_random: random draws of heads per label (the control).
        seed: probe inputs, random draws and masked positions; use a seed other than the
            analysis's for inputs the detectors did not see.
        n_examples: examples per probe (treebank: 4 sentences per example).
        progress: `fn(stage, done, total)` called as forward passes finish (stage "validate").
        labels: check only these labels (default: every label with heads but none/mixed).
        probes: probe settings (`headscope.probes.kinds`) instead of the defaults, e.g.
            `[TextProbe(seq_len=64), RepeatedProbe(repeat_len=25, repeats=4)]`; their
            `n_examples` give way to `n_examples` (the repeated probe's loss is taken from the
            second token of the second copy on).
        icl: add "icl_score" rows (causal models, not a decoder's sites, when a detector with
            `icl_check`, induction, has heads checked): the ICL
            score on text windows of min(icl_len, context) tokens, late index
            min(T - 1, 500) minus early index min(50, late // 2) (see `measure.icl_score`).
        icl_len: tokens per ICL text window (Olsson et al. score token 500).
        batch_size: examples per forward pass.
    Returns:
        A pandas DataFrame with `COLUMNS`, one row per (label, mode): `heads` ("17.3;17.4"),
        `sites` (their attention modules, ";"-joined in the same order),
        `metric` (`measure.METRICS`), `baseline`, `ablated`, `delta` = ablated - baseline,
        next-token (or masked-token) accuracies, `random_deltas` (";"-joined, exact),
        `random_mean`, `random_max`, `ratio` = delta / random_mean, `hurts_more` = delta
        positive and above every random delta, `random_heads` (draws "|"-joined; "" when the label's layers
        have no other heads, and then the random columns are NaN). `attrs` holds the settings.
    """
    check_loaded(loaded, "validate")
    check_analysis(analysis, "validate")
    import pandas as pd

    started = time.perf_counter()
    loaded = _at_analysed_sites(loaded, analysis)
    adapter = adapter_for(loaded.model.config)
    if loaded.two_inputs and adapter is not None and adapter.audio_encoder is not None:
        raise HeadscopeError(NO_VALIDATE_AUDIO.format(name=loaded.name))
    _check_args(loaded, analysis, k, mode, n_random, n_examples, batch_size)
    settings = probe_settings(probes)
    chosen = _chosen_heads(analysis, k, labels)
    metric = metric_for(loaded)
    draws = {label: _random_draws(analysis, label, heads, n_random, seed) for label, heads in chosen.items()}
    icl_labels = [label for label in chosen if detector_spec(analysis.meta, label).get("icl_check")]
    with_icl = icl and loaded.causal and not loaded.two_inputs and bool(icl_labels)
    context = loaded.context_length
    icl_length = min(icl_len, context) if context else icl_len
    if with_icl and icl_length < 4:
        raise HeadscopeError(f"icl_len must be at least 4, got {icl_len}")

    probes_needed = list(dict.fromkeys(probe_for(label, analysis.meta) for label in chosen))
    probes_needed += ["icl_text"] if with_icl else []
    passes = sum(1 + len(draws[label]) for label in chosen) + sum(1 + len(draws[label]) for label in icl_labels
                                                                   if with_icl)
    total = len(probes_needed) + len(MODES) * passes
    done = [0]

    def tick():
        done[0] += 1
        if progress:
            progress("validate", done[0], total)

    if progress:
        progress("validate", 0, total)
    runners, cache = {}, {}
    for name in probes_needed:
        probe = _build_probe(loaded, name, settings, n_examples, icl_length, seed)
        loaded.check_fits(f"the {name} probe", probe.input_ids.shape[1])  # measured, wrapping included
        if metric == "masked_token_loss":
            probe = masked_for_lm(probe, loaded.tokenizer.mask_token_id, seed)
        runners[name] = ProbeRunner(loaded, probe, batch_size)
        tick()

    def measured(name, heads, ablation):
        key = (name, ablation, tuple(sorted(heads)))  # random draws can repeat on small models
        if key not in cache:
            cache[key] = runners[name].measure(heads, ablation)
        tick()
        return cache[key]

    rows = []
    for label, heads in chosen.items():  # already in the order rows are shown
        name = probe_for(label, analysis.meta)
        base = runners[name].baseline
        for ablation in MODES:
            hit = measured(name, heads, ablation)
            random = [measured(name, draw, ablation) for draw in draws[label]]
            rows.append(_row(label, ablation, mode, metric, name, heads, base.value, hit.value,
                             [m.value for m in random], draws[label], base.accuracy, hit.accuracy))
        if label in icl_labels and with_icl:
            rows += [_icl_row(runners["icl_text"], heads, ablation, mode, draws[label], measured) for ablation in MODES]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    names = loaded.site_names  # each head's attention module, as the analysis's tables name it
    frame["sites"] = [";".join(names.get(int(head.split(".")[0]), "") for head in heads.split(";")) if heads else ""
                      for heads in frame.heads]
    early, late = icl_positions(icl_length) if with_icl else (None, None)
    frame.attrs = {
        "mode": mode, "k": k, "n_random": n_random, "seed": seed, "n_examples": n_examples,
        "metric": metric, "metric_description": METRICS[metric], "sites": loaded.sites,
        "probes": {name: runner.probe.description for name, runner in runners.items()},
        "icl": {"seq_len": icl_length, "early": early, "late": late} if with_icl else None,
        "forward_passes": len(runners) + len(cache), "seconds": round(time.perf_counter() - started, 3),
    }
    return frame


def _icl_row(runner, heads, ablation, mode, draws, measured) -> dict:
    early, late = icl_positions(runner.probe.input_ids.shape[1])
    score = lambda m: icl_score(m.per_token, early, late)
    base = score(runner.baseline)
    ablated = score(measured("icl_text", heads, ablation))
    random = [score(measured("icl_text", draw, ablation)) for draw in draws]
    return _row(ICL_LABEL, ablation, mode, "icl_score", "icl_text", heads, base, ablated, random, draws,
                float("nan"), float("nan"))


def _row(label, ablation, mode, metric, probe, heads, baseline, ablated, random, draws, base_acc, acc) -> dict:
    delta = ablated - baseline
    random_deltas = [value - baseline for value in random]
    random_mean = float(np.mean(random_deltas)) if random_deltas else float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = float(np.float64(delta) / np.float64(random_mean))
    return {
        "label": label, "mode": ablation, "primary": ablation == mode, "metric": metric, "probe": probe,
        "heads": _heads_text(heads), "n_heads": len(heads), "baseline": baseline, "ablated": ablated,
        "delta": delta, "baseline_accuracy": base_acc, "ablated_accuracy": acc,
        "random_deltas": ";".join(repr(float(d)) for d in random_deltas), "random_mean": random_mean,
        "random_max": max(random_deltas) if random_deltas else float("nan"), "ratio": ratio,
        # "Hurts": the metric must get worse, not merely improve less than under random heads.
        "hurts_more": bool(random_deltas) and delta > 0 and delta > max(random_deltas),
        "random_heads": "|".join(_heads_text(draw) for draw in draws),
    }


def _heads_text(heads) -> str:
    return ";".join(f"{layer}.{head}" for layer, head in heads)


def _label_order(labels: list[str], meta: dict) -> list[str]:
    """Labels of detectors in the analysis's detector order (then the registry's), each
    "icl_score" after its detector's label, then the others sorted."""
    fixed = [label for label in dict.fromkeys([*meta.get("detectors", {}), *REGISTRY]) if label in labels]
    out = []
    for label in fixed:
        out += [label, ICL_LABEL] if detector_spec(meta, label).get("icl_check") else [label]
    return out + sorted(set(labels) - set(fixed))


def _at_analysed_sites(loaded, analysis):
    """`loaded` at the group of sites the analysis scored (`meta["sites"]["group"]`; none: the
    default); HeadscopeError when `loaded` was pointed at another group."""
    group = (analysis.meta.get("sites") or {}).get("group")
    if loaded.sites is not None and loaded.sites != group:
        raise HeadscopeError(f"the analysis scored {group or 'the default'} sites but the loaded model looks at "
                             f"{loaded.sites}; pass the loaded model itself (validate follows the analysis)")
    return loaded.at(group)


def _check_args(loaded, analysis, k, mode, n_random, n_examples, batch_size):
    for name, value in (("k", k), ("n_random", n_random), ("n_examples", n_examples), ("batch_size", batch_size)):
        check_count(name, value)
    if mode not in MODES:
        raise HeadscopeError(f"unknown ablation mode {mode!r}; use 'zero' or 'mean'")
    if (analysis.n_layers, analysis.n_heads) != (loaded.n_layers, loaded.n_heads):
        raise HeadscopeError(
            f"the analysis is of a model with {analysis.n_layers} layers x {analysis.n_heads} heads "
            f"({analysis.meta.get('model', '?')}) but {loaded.name} has {loaded.n_layers} x {loaded.n_heads}"
        )


def _chosen_heads(analysis, k: int, labels: Optional[Iterable[str]]) -> dict[str, list[tuple[int, int]]]:
    """label -> its top-k heads (score descending; ties: lower layer, then head)."""
    table = analysis.labels
    present = [label for label in dict.fromkeys(table["label"].astype(str)) if label not in SKIPPED]
    if labels is None:
        wanted = present
    else:
        wanted = list(dict.fromkeys(labels))
        for label in wanted:
            if label in SKIPPED or label not in present:
                raise HeadscopeError(f"no heads labelled {label!r} to check; labels with heads: {', '.join(present) or 'none'}")
    chosen = {}
    for label in _label_order(wanted, analysis.meta):
        if label == ICL_LABEL:
            continue
        rows = table[table["label"] == label].sort_values(["score", "layer", "head"], ascending=[False, True, True])
        chosen[label] = [(int(r.layer), int(r.head)) for r in rows.head(k).itertuples(index=False)]
    return chosen


def _random_draws(analysis, label, heads, n_random: int, seed: int) -> list[list[tuple[int, int]]]:
    """`n_random` draws of heads from the layers of `heads`, as many per layer, none labelled `label`.

    The generator is seeded by (seed, label), so a label's draws do not depend on which other
    labels are checked. Empty when a layer has too few other heads.
    """
    table = analysis.labels
    labelled = {(int(r.layer), int(r.head)) for r in table[table["label"] == label].itertuples(index=False)}
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    return random_head_draws(heads, labelled, analysis.n_heads, n_random, rng) or []


def _build_probe(loaded, name, settings, n_examples, icl_length, seed):
    """The `EvalProbe` of a probe name: its settings' `eval_probe` (a hand-built `ProbeSet` has
    none, so its kind's defaults); "icl_text" is text windows of `icl_length` tokens."""
    if name == "icl_text":
        return TextProbe(n_examples, icl_length).eval_probe(loaded, n_examples, seed, name="icl_text")
    kind = settings[name] if hasattr(settings[name], "eval_probe") else PROBE_KINDS[name]()
    probe = kind.eval_probe(loaded, n_examples, seed)
    return as_copy_eval(probe, decoder_start(loaded)) if loaded.two_inputs else probe
