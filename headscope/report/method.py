"""What the report says about how its numbers and labels came about, as plain values.

- `method_rows(meta, detectors)`: per detector its formula, quantity, threshold, label rule,
  source and probe.
- `label_rules(meta)`: the labelling rule in sentences (`MethodNote`s), generated from
  `meta["detectors"]`, `meta["control"]` and `headscope.detectors.labels` (MIXED_MARGIN).
- `report_warnings(meta)`: what the page must say prominently (no control, detector skipped).
- `header_fields(meta)`: the header's name/value pairs, control and the detectors' own lines
  (`ReportSection.header`) included.
- `ov_labels_text(meta)`: the detectors whose labels the OV qualifier reads, in words
  ("induction and duplicate-token").
- `detector_spec(meta, detector)`, `quantity(meta, detector)`: one detector's description
  ("syntactic:obj" stands for "syntactic").
- Types: `MethodRow`, `MethodNote`, `HeaderField`.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from ..detectors.labels import MIXED_MARGIN, ov_qualified_labels
from ..detectors.registry import detector_spec
from .detector_sections import section_header, section_warnings

__all__ = ["MethodRow", "MethodNote", "HeaderField", "method_rows", "label_rules", "report_warnings",
           "header_fields", "detector_spec", "quantity", "has_control", "control_text", "control_reason",
           "ov_labels_text"]


class MethodRow(NamedTuple):
    detector: str
    formula: str
    threshold: Optional[float]
    source: str
    probe: str
    quantity: str  # what the score is ("attention mass", "held-out margin over the baseline", ...)
    learned: bool  # the label claims learning and is checked against the control
    gate: str  # "score" or "ci_low": what must reach the threshold
    rule: str  # the label rule of this detector in words, thresholds from meta


class MethodNote(NamedTuple):
    """One sentence of the labelling rule; `topic` is "pass", "control", "clarity", "resting", "ov" or a
    detector's own (the first item of its `Detector.report_rule`)."""

    topic: str
    text: str


class HeaderField(NamedTuple):
    name: str
    value: str



def quantity(meta: dict, detector: str) -> str:
    """What the detector's score is, in words ("score" for detectors that do not say)."""
    return str(detector_spec(meta, detector).get("quantity") or "score")


def outranks_resting(meta: dict, detector: str) -> bool:
    """`Detector.outranks_resting` as the analysis (or else the registered detector) says."""
    return bool(detector_spec(meta, detector).get("outranks_resting", False))


def has_control(meta: dict) -> bool:
    """Whether the analysis was scored against a control model."""
    return meta.get("control", {}).get("kind", "none") != "none"


def method_rows(meta: dict, detectors: Optional[list] = None) -> tuple:
    """One `MethodRow` per detector in `meta["detectors"]`.

    Args:
        meta: the analysis metadata.
        detectors: preferred order (the scores' order; "syntactic:obj" stands for "syntactic");
            detectors not in it follow, sorted.
    """
    specs = meta.get("detectors", {})
    named = [name for d in (detectors or []) for name in (d, d.split(":")[0]) if name in specs]
    order = list(dict.fromkeys(named)) + sorted(set(specs) - set(named))
    rows = []
    for name in order:
        spec = specs[name]
        learned, gate = bool(spec.get("learned", True)), str(spec.get("gate", "score"))
        rows.append(MethodRow(name, str(spec.get("formula", "")), spec.get("threshold"), str(spec.get("source", "")),
                              str(spec.get("probe", "")), quantity(meta, name), learned, gate,
                              _rule(spec.get("threshold"), gate, learned, has_control(meta))))
    return tuple(rows)


def _rule(threshold, gate: str, learned: bool, control: bool) -> str:
    if threshold is None:
        return ""
    value = "95% CI lower bound" if gate == "ci_low" else "score"
    text = f"{value} ≥ {threshold:g}"
    if not learned:
        return text + "; descriptive (not checked against the control)"
    if control:
        return text + " and 95% CI lower bound > the control's best head"
    return text + " (no control: threshold only)"


def label_rules(meta: dict) -> tuple:
    """The labelling rule as `MethodNote`s, numbers taken from the analysis and `headscope.detectors.labels`."""
    specs = meta.get("detectors", {})
    rows = method_rows(meta, list(specs))
    notes = []
    gated = [r.detector for r in rows if r.gate == "ci_low"]
    notes.append(MethodNote("pass", "A head passes a detector when its score reaches the detector's threshold"
                            + (f" ({', '.join(gated)}: the score's 95% CI lower bound must reach it)" if gated else "")
                            + "; the thresholds are in the table below."))
    learned = [r.detector for r in rows if r.learned]
    resting = [r.detector for r in rows if not r.learned]
    described = f" {', '.join(resting)} describe where attention rests: they are not checked against a control." if resting else ""
    if has_control(meta):
        notes.append(MethodNote("control", (
            f"Learned behaviours ({', '.join(learned) or 'none here'}) also need the score's 95% CI lower bound "
            f"above the control's best head: the highest score any head of the control model ({control_text(meta)}) "
            "reaches for that detector on the same probes, so a head of an untrained network passes only by beating "
            "every head of another one." + described)))
    else:
        notes.append(MethodNote("control", f"No control model ({control_reason(meta)}): learned-behaviour labels "
                                f"({', '.join(learned) or 'none here'}) rest on their thresholds alone." + described))
    notes.append(MethodNote("clarity", (
        "Among the detectors a head passes, its label is the one passed most clearly, clarity = (value − threshold) "
        f"/ (1 − threshold), the value being what the threshold applies to. When the two clearest differ in clarity "
        f"by less than {MIXED_MARGIN:g} the label is \"mixed\"; a head that passes nothing is \"none\". A label's "
        "score is its detector's score, in that detector's quantity.")))
    outranking = [name for name in specs if outranks_resting(meta, name)]
    rests = [name for name, spec in specs.items() if not spec.get("learned", True)]
    if rests and outranking:
        notes.append(MethodNote("resting", (
            f"{' and '.join(rests)} are resting behaviours: a head that passes one of them and also a detector "
            f"measured on a probe built for its behaviour ({', '.join(outranking)}) gets that detector's label (LLM "
            "induction heads rest on the first token of text without repeats).")))
    notes += _ov_notes(meta)
    control = " and above the control's best head on the same margin." if has_control(meta) else "."
    for name in specs:  # a detector's own rule, in its words (e.g. the syntactic cross-fitting)
        rule = detector_spec(meta, name).get("report_rule") or ()
        if len(rule) == 2 and detector_spec(meta, name).get("threshold") is not None:
            notes.append(MethodNote(rule[0], rule[1].format(threshold=detector_spec(meta, name)["threshold"],
                                                            control=control)))
    return tuple(notes)


def _ov_notes(meta: dict) -> list:
    """The OV qualifier's rule (`headscope.detectors.labels.ov_qualifier`), numbers from `meta["ov"]`."""
    ov = meta.get("ov")
    if not ov:
        return []
    if ov.get("skipped"):
        return [MethodNote("ov", f"OV copying was not computed ({ov['skipped']}), so {ov_labels_text(meta)} "
                                 "labels carry no copying qualifier.")]
    folded = "with the norm gains folded in" if ov.get("fold_norms") else "without the norms"
    named = ov_labels_text(meta)
    return [MethodNote("ov", (
        f"{named[:1].upper() + named[1:]} labels are qualified by what the head writes (Elhage et al. 2021): \"copies\" "
        f"when the positive eigenvalue share of its OV circuit W_E W_V W_O W_U ({folded}) is at least "
        f"{ov.get('copies_share', 0.9):g}" + (" and above the control's best head" if has_control(meta) else "")
        + f", else \"no OV copying\" (random circuits score 0.3–0.5). Copy top-1 is the share of "
        f"{ov.get('n_tokens')} seeded source tokens whose own logit tops the circuit's row (chance 1/vocab). The "
        "qualifier never changes a label; it reads the direct path only, which misses copying that later layers do."))]


def report_warnings(meta: dict) -> tuple:
    """Sentences the page shows prominently: no control model, a default detector skipped."""
    warnings = []
    if not has_control(meta):
        warnings.append(f"No control model ({control_reason(meta)}): learned-behaviour labels were not checked "
                        "against an untrained twin, so an untrained network of the same shape may earn them too.")
    warnings += [f"{name} detector skipped: {reason}" for name, reason in meta.get("skipped_detectors", {}).items()]
    warnings += section_warnings(meta)  # a detector's own (e.g. a skip noted by an older analysis)
    return tuple(warnings)


def ov_labels_text(meta: dict) -> str:
    """The detectors whose labels the OV qualifier reads (`Detector.ov_qualified`), in words:
    "induction and duplicate-token"."""
    names = [name.replace("_", "-") for name in ov_qualified_labels(meta)]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def control_reason(meta: dict) -> str:
    """Why there was no control, from `meta["control"]["note"]` without its stock words
    ("no control model: ...; labels are not checked ...")."""
    control = meta.get("control")
    if not control:
        return "this analysis records none"
    note = str(control.get("note") or "")
    reason = note.removeprefix("no control model: ").removeprefix("no control model").split("; labels are not checked")[0]
    if not reason or reason.startswith("labels are not checked"):
        return "none was asked for"  # resolve_control gives a bare note only for control=None
    return reason


def control_text(meta: dict) -> str:
    """The control model in a few words ("random-init twin, seed 1000003", "none: ...")."""
    control = meta.get("control")
    if not control:
        return "not recorded"
    kind = control.get("kind", "none")
    if kind == "random-init":
        return f"random-init twin (same config and tokenizer), seed {control.get('seed')}"
    if kind == "given":
        return f"given: {control.get('name')}"
    return f"none ({control_reason(meta)})"


def header_fields(meta: dict) -> tuple:
    """The header's name/value pairs (all but "created", which the page prints on its own line)."""
    versions = meta.get("versions", {})
    timings = meta.get("timings", {})
    probes = meta.get("probes", {})
    heads = f"{meta.get('n_layers', '?')} layers × {meta.get('n_heads', '?')} heads"
    if meta.get("n_kv_heads") not in (None, meta.get("n_heads")):
        heads += f" ({meta['n_kv_heads']} KV heads)"
    if "causal" in meta:
        heads += ", causal" if meta["causal"] else ", bidirectional"
    stages = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in timings.items() if stage != "total")
    run_time = f"{timings['total']:.1f} s" if "total" in timings else "?"
    fields = [
        HeaderField("Model", str(meta.get("model", "?"))),
        HeaderField("Family", str(meta.get("family", "?"))),
        HeaderField("Parameters", _count(meta.get("parameters"))),
        HeaderField("Heads", heads),
    ]
    sites = meta.get("sites")
    if isinstance(sites, dict) and sites.get("group"):  # outside the default stack: which modules
        modules = sites.get("modules") or {}
        fields.append(HeaderField("Sites", f"{sites['group']} ({sites.get('kind', '?')}): "
                                           + ", ".join(str(name) for name in modules.values())))
    fields += [
        HeaderField("Probes", "; ".join(f"{name}: {_probe_size(p)} ({p.get('description', '')})"
                                        for name, p in probes.items()) or "?"),
        HeaderField("Control", control_text(meta)),
    ]
    fields += [HeaderField(str(name), str(value)) for name, value in section_header(meta)]  # e.g. the treebank
    fields += [
        HeaderField("Seed", str(meta.get("seed", "?"))),
        HeaderField("Versions", ", ".join(f"{name} {version}" for name, version in versions.items()) or "?"),
        HeaderField("Run time", run_time + (f" ({stages})" if stages else "")),
    ]
    fields += [HeaderField("Note", str(note)) for note in meta.get("notes", ())]  # e.g. learned sinks
    return tuple(fields)


def _probe_size(probe: dict) -> str:
    """"16 examples × 128 tokens"; a probe of examples of several lengths (the treebank's
    sentences, whose meta has no single `seq_len`) says "of up to N tokens", or nothing."""
    n, length = probe.get("n_examples", "?"), probe.get("seq_len")
    if length is not None:
        return f"{n} examples × {length} tokens"
    longest = probe.get("max_tokens")
    return f"{n} examples of up to {longest} tokens" if longest is not None else f"{n} examples"


def _count(value) -> str:
    if value is None:
        return "?"
    value = int(value)
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit} ({value:,})"
    return str(value)
