"""`analyze`: score every head of a model with the detectors, with confidence intervals.

`analyze` is a loop over `(probe, detectors)`: each probe the chosen detectors read is built
from its settings (`headscope.probes.kinds`), its batches run through the model inside
`capture(reduce=...)` with every detector of the probe reducing each layer as soon as it is
computed (`headscope.detectors.runner`), and each detector's `finalize` turns what the batches left into
rows of the scores table (`headscope.detectors.protocol`). When every detector of a probe reads the
pattern only through a `LazyPattern`'s entries and row statistics (all built-in mass and
entropy detectors do), the layer runs the fused kernel and the map is never computed
(`lazy=True`, the default). The same batches also run through a control model, an untrained
twin (`headscope.loading.control`), whose score for the same head (`control`) and best score over heads
(`control_max`) join the table; labels follow `headscope.detectors.labels`. From the weights, the OV
copying of every head and of its control twin (`headscope.head_geometry.ov_circuit.ov_table`) becomes
`Analysis.ov`, which qualifies induction and duplicate-token labels (`headscope.detectors.labels.ov_qualifier`).

`analyze` reads as its steps: `_plan` (detectors chosen, control resolved, probes built),
`_run` (each probe's passes, each detector's `Finding`), `_score` (scores, labels and tables),
the explorer examples (`headscope.analysis.explorer`), `_meta` (an `AnalysisMeta`, `headscope.analysis.meta`), and the optional
validation; every step is timed by one `Timings`.

An encoder that reads audio (the adapter's `audio_encoder`: Whisper's) is analysed at its
decoder's sites only: the decoder reads each probe's tokens as elsewhere, the encoder (the
model's and the control twin's) the log-mel features of silence (`headscope.probes.audio`), and
`meta["sites"]["encoder_input"]` says so (`headscope.analysis.decoder_sites`).
"""
from __future__ import annotations

import datetime
import gc
import weakref
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional

import pandas as pd
import torch

from .. import __version__
from .meta import AnalysisMeta
from .result import Analysis, Example
from ..loading.control import resolve_control
from ..detectors.registry import defaults_for, get
from ..checks import MAX_SEED, check_count, check_seed
from ..errors import CannotScore, HeadscopeError
from ..hf.adapters import adapter_for, config_value
from ..hf.capture import capture
from ..detectors.labels import OV_COPIES_SHARE, label_heads, ov_qualified_labels
from ..head_geometry.ov_circuit import OV_TOKENS, ov_table
from ..probes.audio import SilentAudio
from ..probes.kinds import probe_settings
from .decoder_sites import as_copies, silence_note, silent_audio
from .explorer import shown_examples
from ..detectors.protocol import SCORE_COLUMNS
from ..detectors.protocol import Progress
from ..detectors.runner import MAP_BUDGET, Timings, collect_with_control
from ..loading.distributed import rank_and_size
from ..loading.heap import return_freed_heap
from ..loading.integrity import check_weights
from ..loading.loader import Loaded
from ..tables import with_sites
from ..causal import validate as run_validation
from ..causal.validate import NO_VALIDATE_AUDIO

__all__ = ["analyze", "Progress", "MAX_SEED"]


SINK_NOTE = ("{n} of {total} layers have a learned sink logit per head: each pattern row sums to less than 1 (the "
             "sink takes the rest), and every score reads the tokens' share only")


SITE_WORDS = {"causal": "the decoder's causal self-attention",
              "cross": "cross-attention: queries from the decoder's tokens, keys over the encoder's positions",
              "bidirectional": "bidirectional self-attention"}

# What a model must have for a detector that reads one kind of site (`Detector.applies_to`).
MODEL_WITH = {"causal": "a causal model", "bidirectional": "a bidirectional model",
              "cross": "an encoder-decoder model (cross-attention)"}


def _chosen(loaded, names, batch_size):
    check_count("batch_size", batch_size)
    kind = loaded.site_kind  # the analysed sites': a model's self-attention, or its decoder's or cross-attention
    chosen = defaults_for(kind) if names is None else list(dict.fromkeys(names))
    if not chosen:
        raise HeadscopeError("no detectors chosen")
    dets = [get(n) for n in chosen]
    for det in dets:
        if kind not in det.applies_to:
            needs = " or ".join(MODEL_WITH[k] for k in det.applies_to)
            where = f"{loaded.name}'s {loaded.sites} sites are" if loaded.sites else f"{loaded.name} is"
            raise HeadscopeError(f"detector {det.name!r} needs {needs}; {where} {kind}")
    return dets


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
    sites: Optional[str] = None,
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
        batch_size: examples per forward pass (a treebank example: `SENTENCES_PER_EXAMPLE` sentences,
            `headscope.probes.treebank`).
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
        sites: the group of attention sites to analyse (`headscope.hf.sites`): None, the
            default stack (an encoder-decoder's encoder); "decoder.self" or "decoder.cross" for
            an encoder-decoder's decoder, whose probes are read as teacher-forced copies (the
            encoder reads each example, the decoder the same tokens shifted right,
            `headscope.probes.copy.as_copy`) and whose detectors are those of the sites' kind
            (`Detector.applies_to`); `validate` ablates heads of that group and measures the
            decoder's loss of the copied tokens (`headscope.validate`); the explorer's examples
            have the decoder's tokens as queries and, at cross-attention, the encoder's as keys
            (`Example.key_tokens`); the OV table is the group's heads' (norms not folded,
            `meta["ov"]["fold_norms"]` False). Same as `analyze(loaded.at(sites))`. An
            encoder that reads audio (Whisper's) is fed the log-mel features of silence
            (`headscope.probes.audio`, `meta["sites"]["encoder_input"]`): only its decoder's
            groups run, without the copy probe's detectors (alignment) and without `validate`.
    Returns:
        An `Analysis`.
    """
    if not isinstance(loaded, Loaded):
        example = f"headscope.load({loaded!r})" if isinstance(loaded, str) else "headscope.load(...)"
        raise HeadscopeError(f"analyze takes a loaded model ({example}), not a {type(loaded).__name__}")
    check_seed(seed)
    check_count("explorer_examples", explorer_examples, least=0)
    if sites is not None:
        loaded = loaded.at(sites)
    if loaded.sites is not None and loaded.sites.split(".")[0] not in ("text", "decoder"):
        raise HeadscopeError(f"analyze reads token probes, which never reach {loaded.sites} sites (a vision tower runs "
                             f"only with images); capture, ablate and model_hooks address them with sites=")
    adapter = adapter_for(loaded.model.config)
    audio = silent_audio(loaded)
    if adapter is not None and adapter.no_analyze and audio is None:  # whisper's encoder: audio features, no tokens
        raise HeadscopeError(adapter.no_analyze)
    if validate and audio is not None:
        raise HeadscopeError(NO_VALIDATE_AUDIO.format(name=loaded.name))
    timings = Timings()
    check_weights(loaded.model, loaded.name)  # a NaN in the weights would score as n=0, silently
    plan = _plan(loaded, detectors, probes, batch_size, control, seed, timings, audio)
    shown = (explorer_examples, explorer_len) if explorer_examples else None
    run = _run(loaded, plan, batch_size, seed, progress, lazy, map_budget, timings, shown)
    scored = _score(loaded, plan, run, seed, ov, timings)
    with timings.step("explorer"):
        examples = (shown_examples(loaded, plan.built, explorer_examples, explorer_len, run.explorer)
                    if explorer_examples else [])
    if plan.control["kind"] == "random-init":  # the twin built here is freed now, its weights with the heap below
        twin = weakref.ref(plan.twin.model)
        plan.twin = None
        if twin() is not None:  # held by reference cycles only: a full collection (0.2 s in a large process)
            gc.collect()
    return_freed_heap()  # the statistics' and the explorer's temporaries: the caller keeps only the tables
    timings.total()
    meta = _meta(loaded, plan, run, scored, seed, batch_size, ov, timings)
    analysis = Analysis(scores=scored.scores, labels=scored.labels, meta=meta.to_json(), examples=examples,
                        tables=scored.tables)
    if not validate:
        return analysis
    with timings.step("validate"):
        n_examples = min([8] + [probe.meta()["n_examples"] for probe in run.used(plan).values()])
        frame = run_validation(loaded, analysis, seed=seed, n_examples=n_examples, probes=plan.given,
                               batch_size=batch_size, progress=progress)
    timings.total()
    meta.timings = timings.rounded()
    return replace(analysis, meta=meta.to_json(), validation=frame)


@dataclass
class _Plan:
    """What `analyze` will run: the chosen detectors grouped by probe, the built probes, the control."""

    detectors: list  # [Detector]
    groups: dict  # probe name -> [Detector]
    built: dict  # probe name -> built probe
    given: list  # the probe settings the caller passed
    asked: bool  # the caller named the detectors
    twin: Optional[object]  # the control `Loaded`, or None
    control: dict  # its description, meta["control"]
    skipped: dict = field(default_factory=dict)  # detector name -> why its probe cannot feed the sites
    audio: Optional[SilentAudio] = None  # what an audio encoder hears (None: the encoder reads the tokens)
    unheard: tuple = ()  # detectors left out because that encoder reads none of their probe's tokens


@dataclass
class _Run:
    """What the probes' passes left: each detector's `Finding`, and how each probe ran."""

    findings: dict = field(default_factory=dict)  # detector name -> Finding
    how: dict = field(default_factory=dict)  # probe name -> "lazy", "maps", ... (meta["probes"][name]["patterns"])
    sink_layers: set = field(default_factory=set)
    not_run: dict = field(default_factory=dict)  # probe name -> attention layers that never ran on it
    kernels: dict = field(default_factory=dict)  # probe name -> lse kernels of the lazy path (meta["probes"][name]["lse"])
    explorer: dict = field(default_factory=dict)  # probe name -> its explorer maps, kept by its pass
    skipped: dict = field(default_factory=dict)  # detector name -> why it could not score the model

    def used(self, plan: _Plan) -> dict:
        """The built probes some detector that scored read."""
        return {name: plan.built[name] for name, group in plan.groups.items()
                if any(d.name in self.findings for d in group)}


@dataclass
class _Scored:
    """The scores table, the labels, and the tables (the OV circuit's and the detectors')."""

    scores: object  # pandas.DataFrame with SCORE_COLUMNS
    labels: object  # pandas.DataFrame with LABEL_COLUMNS
    tables: dict  # name -> pandas.DataFrame
    ov_skipped: str  # why the OV table is missing ("" when computed)


def _plan(loaded, detectors, probes, batch_size, control, seed, timings, audio=None) -> _Plan:
    """Choose the detectors, resolve the control twin, build each probe they read (at a decoder's
    sites as copies, the encoder hearing `audio` where it reads audio)."""
    given = list(probes or ())
    settings = probe_settings(given)
    dets = _chosen(loaded, detectors, batch_size)
    with timings.step("control_init"):
        twin, control_meta = resolve_control(loaded, control, seed)
        if twin is not None and loaded.sites is not None:
            twin = twin.at(loaded.sites)  # the twin's same group of sites
    with timings.step("probes"):
        groups = {name: [d for d in dets if d.probe == name] for name in dict.fromkeys(d.probe for d in dets)}
        built = {name: settings[name].build(loaded, seed) for name in groups}
        skipped, unheard = {}, ()  # detector -> why its probe cannot feed the sites (a decoder's, below)
        if loaded.two_inputs:  # a decoder's sites: each probe as the encoder's input and the decoder's copy
            built, skipped, unheard = as_copies(loaded, built, groups, detectors is not None, given, audio)
            groups = {name: group for name, group in groups.items() if name in built}
            dets = [d for d in dets if d.probe in built]
        for name, probe in built.items():
            loaded.check_fits(f"the {name} probe", probe.seq_len)
    return _Plan(dets, groups, built, given, detectors is not None, twin, control_meta, skipped, audio, unheard)


def _probe_batch(built, batch_size: int) -> int:
    """Rows a forward pass of this probe takes: `batch_size` examples of `built.rows_per_example`
    rows each (1 where the probe does not say; a treebank example is
    `headscope.probes.treebank.SENTENCES_PER_EXAMPLE` sentences, as `validate` counts them). A
    sentence is a fifth of a text example's tokens, and at 8 sentences a pass spends more on
    per-layer calls than on tokens: SmolLM2's pass over the bundled treebank takes 0.78x the time
    at 32 a batch."""
    return batch_size * getattr(built, "rows_per_example", 1)


def _run(loaded, plan, batch_size, seed, progress, lazy, map_budget, timings, shown=None) -> _Run:
    """Each probe's batches through the model and the twin, then every detector's `Finding`;
    `shown` `(n, length)`: the explorer examples' maps kept where a pass holds them."""
    run = _Run(skipped=dict(plan.skipped))
    for name, probe_dets in plan.groups.items():
        patterned = [d for d in probe_dets if d.run is None]  # the others run their own passes
        model, twin_values = {}, {}
        if patterned:
            passes, twin_values = collect_with_control(
                loaded, plan.twin, plan.built[name], patterned, _probe_batch(plan.built[name], batch_size), timings,
                progress, lazy, map_budget=map_budget, explorer=shown)
            model, run.how[name] = passes.values, passes.how
            if passes.explorer is not None:
                run.explorer[name] = passes.explorer
            run.sink_layers.update(passes.sink_layers)
            if passes.not_run:
                run.not_run[name] = passes.not_run
            if passes.kernels:
                run.kernels[name] = passes.kernels
        for det in probe_dets:
            try:
                if det.run is None:
                    run.findings[det.name] = det.finalize(model[det.name], twin_values.get(det.name), plan.built[name],
                                                          seed)
                else:  # model and control twin, its own forward passes
                    with timings.step(f"probe_{name}"):
                        run.findings[det.name] = det.run(loaded, plan.twin, plan.built[name], seed, progress)
                    run.how[name] = "the detector's own passes"
            except CannotScore as err:
                if plan.asked or any(p.name == name for p in plan.given):  # asked for: say why it cannot run
                    raise
                run.skipped[det.name] = str(err)  # among the defaults (a short context, say) it is left out
    return run


def _score(loaded, plan, run, seed, ov, timings) -> _Scored:
    """Every finding's rows joined and labelled; the OV table; the detectors' tables by name."""
    dets = [d for d in plan.detectors if d.name in run.findings]
    with timings.step("statistics"):
        frames = [run.findings[d.name].rows[SCORE_COLUMNS] for d in dets]
        scores = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SCORE_COLUMNS)
        names = {key: label for d in dets for key, label in run.findings[d.name].names.items()}
        labels = label_heads(scores, {d.name: d for d in dets}, names)
    ov_frame, ov_skipped = None, "not asked for (ov=False)"
    if ov and plan.audio is not None and loaded.site_kind == "cross":
        ov_skipped = ("cross-attention's values here are an audio encoder's outputs, which no token embedding enters, "
                      "so a token's embedding through its value projection means nothing")
    elif ov:
        with timings.step("ov"):
            qualified = labels[labels.label.isin(ov_qualified_labels())]  # copy_top1 only where it qualifies a label: cost
            heads = {(int(l), int(h)) for l, h in zip(qualified.layer, qualified["head"])}
            ov_frame, ov_skipped = ov_table(loaded, plan.twin, heads, seed=seed)
    tables = {"ov": ov_frame} if ov_frame is not None else {}
    for det in dets:
        for name, table in run.findings[det.name].tables.items():
            if name in tables:
                raise HeadscopeError(f"detector {det.name!r} returns a table {name!r}, which the analysis already has")
            tables[name] = table
    # Every table of heads names each head's attention module (`site`, its module path).
    modules = loaded.site_names
    tables = {name: with_sites(table, modules) for name, table in tables.items()}
    return _Scored(with_sites(scores, modules), with_sites(labels, modules), tables, ov_skipped)


def _meta(loaded, plan, run, scored, seed, batch_size, ov, timings) -> AnalysisMeta:
    """What the run records (`AnalysisMeta`); `to_json()` is `Analysis.meta`."""
    import transformers  # heavy: imported when an analysis is made, not with headscope

    config = loaded.model.config
    used = run.used(plan)
    probes = {name: probe.meta() for name, probe in used.items()}
    for name in used:
        probes[name]["patterns"] = run.how[name]
        if name in run.kernels:
            probes[name]["lse"] = ", ".join(run.kernels[name])
    notes = [SINK_NOTE.format(n=len(run.sink_layers), total=loaded.n_layers)] if run.sink_layers else []
    for name, layers in run.not_run.items():
        notes.append(f"not run: the attention of layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} "
                     f"never ran on the {name} probe (cross-attention without its other input, such as an image); "
                     f"its heads have no scores from it")
    without = sorted(set(range(loaded.n_layers)) - set(loaded.attention_layers))
    if without:
        notes.append(f"layers {', '.join(map(str, without))} have no attention (the model is a hybrid): they have no "
                     f"scores, and the explorer shows them empty")
    if ov and scored.ov_skipped:
        notes.append(f"OV copying not computed: {scored.ov_skipped}")
    sites = {}
    if loaded.sites is not None:
        chosen = loaded.selection
        sites = {"group": chosen.group, "kind": loaded.site_kind,
                 "modules": {str(layer): site.name for layer, site in sorted(chosen.sites.items())}}
        read = ("(the encoder reads each example, the decoder the same tokens shifted right)" if plan.audio is None
                else "(the decoder reads each example shifted right; the encoder reads audio and hears silence)")
        notes.append(f"sites: {chosen.group} ({SITE_WORDS.get(loaded.site_kind, loaded.site_kind)}), layers numbered "
                     f"within the {next(iter(chosen.sites.values())).stack}; probes read as teacher-forced copies "
                     f"{read}")
        if plan.audio is not None:
            sites["encoder_input"] = plan.audio.description
            notes.append(silence_note(loaded, plan))
    return AnalysisMeta(
        model=loaded.name, family=loaded.family, causal=loaded.causal,
        n_layers=loaded.n_layers, n_heads=loaded.n_heads,
        n_kv_heads=config_value(config, "num_key_value_heads") or loaded.n_heads,  # gemma4: its first layer's
        parameters=sum(p.numel() for p in loaded.model.parameters()),
        device=str(loaded.device), dtype=str(loaded.model.dtype).replace("torch.", ""),
        probes=probes, batch_size=batch_size, seed=seed,
        versions={"headscope": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
        timings=timings.rounded(),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        detectors={d.name: d.describe() for d in plan.detectors if d.name in run.findings},
        control=plan.control,
        ov={"n_tokens": OV_TOKENS, "copy_top1_of": list(ov_qualified_labels()), "fold_norms": loaded.sites is None,
            "copies_share": OV_COPIES_SHARE, "skipped": scored.ov_skipped},
        skipped_detectors=run.skipped, notes=notes,
        probe_entries={key: value for probe in plan.built.values() for key, value in probe.extra_meta.items()},
        detector_entries={key: value for d in plan.detectors if d.name in run.findings
                          for key, value in run.findings[d.name].meta.items()},
        processes=rank_and_size()[1], sites=sites,
    )
