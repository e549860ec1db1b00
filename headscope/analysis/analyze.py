"""`analyze`: score every head of a model with the detectors, with confidence intervals.

`analyze` is a loop over `(probe, detectors)`: each probe the chosen detectors read is built
from its settings (`headscope.probes.kinds`), its batches run through the model inside
`capture(reduce=...)` with every detector of the probe reducing each layer as soon as it is
computed (`headscope.analysis.runner`), and each detector's `finalize` turns what the batches left into
rows of the scores table (`headscope.detectors.protocol`). When every detector of a probe reads the
pattern only through a `LazyPattern`'s entries and row statistics (all built-in mass and
entropy detectors do), the layer runs the fused kernel and the map is never computed
(`lazy=True`, the default). The same batches also run through a control model, an untrained
twin (`headscope.loading.control`), whose score for the same head (`control`) and best score over heads
(`control_max`) join the table; labels follow `headscope.detectors.labels`. From the weights, the OV
copying of every head and of its control twin (`headscope.head_geometry.ov_circuit.ov_table`) becomes
`Analysis.ov`, which qualifies induction and duplicate-token labels (`headscope.detectors.labels.ov_qualifier`).
"""
from __future__ import annotations

import datetime
import time
from typing import Iterable, Optional

import pandas as pd
import torch

from .. import __version__
from .result import Analysis, Example
from ..loading.control import resolve_control
from ..detectors import defaults, get
from ..errors import CannotScore, HeadscopeError
from ..hf.capture import capture
from ..detectors.labels import OV_COPIES_SHARE, OV_QUALIFIED, label_heads
from ..head_geometry.ov_circuit import OV_TOKENS, ov_table
from ..probes.kinds import probe_settings
from ..detectors.protocol import SCORE_COLUMNS
from .runner import MAP_BUDGET, Progress, collect
from ..probes.tokens import display_tokens
from ..causal import validate as run_validation

__all__ = ["analyze", "Progress"]

SINK_NOTE = ("{n} of {total} layers have a learned sink logit per head: each pattern row sums to less than 1 (the "
             "sink takes the rest), and every score reads the tokens' share only")


def _chosen(loaded, names, batch_size):
    if batch_size <= 0:
        raise HeadscopeError(f"batch_size must be at least 1, got {batch_size}")
    chosen = defaults(loaded.causal) if names is None else list(dict.fromkeys(names))
    if not chosen:
        raise HeadscopeError("no detectors chosen")
    dets = [get(n) for n in chosen]
    for det in dets:
        if det.bidirectional_only and loaded.causal:
            raise HeadscopeError(f"detector {det.name!r} needs a bidirectional model; {loaded.name} is causal")
    return dets


@torch.no_grad()
def _explorer_examples(loaded, built, n_show, length) -> list[Example]:
    examples = []
    for name, probe in built.items():
        ids = probe.explorer_ids(n_show, length)
        if ids is None:
            continue
        ids = ids.to(loaded.device)
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
    probes: Optional[Iterable] = None,
    *,
    batch_size: int = 8,
    seed: int = 0,
    explorer_examples: int = 2,
    explorer_len: int = 48,
    validate: bool = False,
    progress: Optional[Progress] = None,
    lazy: bool = True,
    control="random-init",
    map_budget: int = MAP_BUDGET,
    ov: bool = True,
) -> Analysis:
    """Score every head of a loaded model.

    Args:
        loaded: a `headscope.load(...)` result.
        detectors: detector names (default: all that apply to the model; see
            `headscope.detectors.names()`).
        probes: probe settings to use instead of the defaults, e.g.
            `[TextProbe(n_examples=16, seq_len=128), RepeatedProbe(repeat_len=25, repeats=4),
            TreebankProbe("my.conllu", n_sentences=100)]` (`headscope.probes.kinds`), or your own
            built `ProbeSet`s; a probe not given takes its defaults.
        batch_size: examples per forward pass.
        seed: chooses text windows, random tokens, treebank samples and bootstrap resamples.
        explorer_examples, explorer_len: examples per probe whose full maps are kept for the
            report's head explorer, truncated to this many tokens.
        map_budget: on the maps path, the bytes of fp32 pattern one layer may compute at once
            (default `MAP_BUDGET`, 256 MiB); a layer whose map is larger runs in head groups.
        validate: also run `headscope.validate` (ablate each label's top-3 heads against
            random heads, on at most 8 examples per probe) and keep its table in `.validation`.
        progress: `fn(stage, done, total)` called as batches finish.
        lazy: score from the fused kernel's output and row log-sum-exp where every detector of
            a probe allows it (no map is computed); False computes each layer's full map, the
            reference path (same scores to float rounding, slower).
        control: "random-init" (default): score the same probes on a twin with the same config
            and tokenizer and seeded random weights (skipped, and said so in `meta["control"]`,
            when it would not fit in memory); None or "none": no control; or a `Loaded` to use
            as the control. Learned-behaviour labels need the head's CI lower bound above the
            control's best head (`headscope.detectors.labels`).
        ov: compute every head's OV eigenvalue share from the weights, and the control's, and
            the copy_top1 of induction and duplicate-token heads, into `.ov`
            (`headscope.head_geometry.ov_circuit.ov_table`; skipped with a note in `meta["notes"]` when the
            model has no unembedding or adapter). False leaves `.ov` None.
    Returns:
        An `Analysis`.
    """
    started = time.perf_counter()
    given = list(probes or ())
    settings = probe_settings(given)
    dets = _chosen(loaded, detectors, batch_size)
    timings = {}
    t = time.perf_counter()
    twin, control_meta = resolve_control(loaded, control, seed)
    timings["control_init"] = time.perf_counter() - t
    t = time.perf_counter()
    groups = {name: [d for d in dets if d.probe == name] for name in dict.fromkeys(d.probe for d in dets)}
    built = {name: settings[name].build(loaded, seed) for name in groups}
    for name, probe in built.items():
        loaded.check_fits(f"the {name} probe", probe.seq_len)
    timings["probes"] = time.perf_counter() - t

    findings, how, sink_layers, skipped = {}, {}, set(), {}
    asked = detectors is not None
    for name, probe_dets in groups.items():
        patterned = [d for d in probe_dets if d.run is None]  # the others run their own passes
        model, twin_values = {}, {}
        if patterned:
            t = time.perf_counter()
            model, how[name], sinks = collect(loaded, built[name], patterned, batch_size, progress, lazy,
                                              map_budget=map_budget)
            sink_layers.update(sinks)
            timings[f"probe_{name}"] = time.perf_counter() - t
            if twin is not None:
                t = time.perf_counter()
                twin_values = collect(twin, built[name], patterned, batch_size, progress, lazy,
                                      stage=f"probe {name} (control)", map_budget=map_budget)[0]
                timings[f"probe_{name}_control"] = time.perf_counter() - t
        for det in probe_dets:
            t = time.perf_counter()
            try:
                if det.run is None:
                    findings[det.name] = det.finalize(model[det.name], twin_values.get(det.name), built[name], seed)
                else:  # model and control twin, its own forward passes
                    findings[det.name] = det.run(loaded, twin, built[name], seed, progress)
                    how[name] = "the detector's own passes"
                    timings[f"probe_{name}"] = timings.get(f"probe_{name}", 0.0) + time.perf_counter() - t
            except CannotScore as err:
                if asked or any(p.name == name for p in given):  # asked for: say why it cannot run
                    raise
                skipped[det.name] = str(err)  # among the defaults (a short context, say) it is left out

    t = time.perf_counter()
    dets = [d for d in dets if d.name in findings]
    frames = [findings[d.name].rows[SCORE_COLUMNS] for d in dets]
    scores = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SCORE_COLUMNS)
    names = {key: label for d in dets for key, label in findings[d.name].names.items()}
    labels = label_heads(scores, {d.name: d for d in dets}, names)
    timings["statistics"] = time.perf_counter() - t
    ov_frame, ov_skipped = None, "not asked for (ov=False)"
    if ov:
        t = time.perf_counter()
        qualified = labels[labels.label.isin(OV_QUALIFIED)]  # copy_top1 only where it qualifies a label: cost
        heads = {(int(l), int(h)) for l, h in zip(qualified.layer, qualified["head"])}
        ov_frame, ov_skipped = ov_table(loaded, twin, heads, seed=seed)
        timings["ov"] = time.perf_counter() - t
    t = time.perf_counter()
    examples = _explorer_examples(loaded, built, explorer_examples, explorer_len) if explorer_examples else []
    timings["explorer"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - started
    used = {name: built[name] for name, group in groups.items() if any(d.name in findings for d in group)}
    meta = _meta(loaded, dets, used, seed, timings, batch_size)
    meta["control"] = control_meta
    for name, probe in built.items():
        meta.update(probe.extra_meta)
    if skipped:
        meta["skipped_detectors"] = skipped
    for name in used:
        meta["probes"][name]["patterns"] = how[name]
    if sink_layers:
        meta["notes"] = [SINK_NOTE.format(n=len(sink_layers), total=loaded.n_layers)]
    meta["ov"] = {"n_tokens": OV_TOKENS, "copy_top1_of": list(OV_QUALIFIED), "fold_norms": True,
                  "copies_share": OV_COPIES_SHARE, "skipped": ov_skipped}
    if ov and ov_skipped:
        meta.setdefault("notes", []).append(f"OV copying not computed: {ov_skipped}")
    tables = {"ov": ov_frame} if ov_frame is not None else {}
    for det in dets:
        meta.update(findings[det.name].meta)
        for name, table in findings[det.name].tables.items():
            if name in tables:
                raise HeadscopeError(f"detector {det.name!r} returns a table {name!r}, which the analysis already has")
            tables[name] = table
    analysis = Analysis(scores=scores, labels=labels, meta=meta, examples=examples, tables=tables)
    if validate:
        t = time.perf_counter()
        n_examples = min([8] + [probe.meta()["n_examples"] for probe in used.values()])
        analysis.validation = run_validation(loaded, analysis, seed=seed, n_examples=n_examples, probes=given,
                                             batch_size=batch_size, progress=progress)
        meta["timings"]["validate"] = round(time.perf_counter() - t, 3)
        meta["timings"]["total"] = round(time.perf_counter() - started, 3)
    return analysis


def _meta(loaded, dets, probes, seed, timings, batch_size) -> dict:
    import transformers  # heavy: imported when an analysis is made, not with headscope

    config = loaded.model.config
    return {
        "model": loaded.name, "family": loaded.family, "causal": loaded.causal,
        "n_layers": loaded.n_layers, "n_heads": loaded.n_heads,
        "n_kv_heads": getattr(config, "num_key_value_heads", None) or loaded.n_heads,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "device": str(loaded.device), "dtype": str(loaded.model.dtype).replace("torch.", ""),
        "probes": {name: probe.meta() for name, probe in probes.items()},
        "batch_size": batch_size, "seed": seed,
        "versions": {"headscope": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "detectors": {d.name: d.describe() for d in dets},
    }
