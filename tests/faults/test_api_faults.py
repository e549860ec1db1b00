"""The fault-injection table for the Python API: each case is a bad argument or a fault given to
a public function, and the one-line `HeadscopeError` fragment it must raise (never a raw
ValueError, TypeError, IndexError or RuntimeError from torch or pandas), with the invariant that
the files it was pointed at are byte-identical afterwards and the shared model is unchanged
(tests/conftest.py checks its weights, routing and hooks at the end of the session)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import headscope
from headscope.analysis import Analysis
from headscope.atomic import MANIFEST, MARKER
from headscope.errors import HeadscopeError
from tests.support.fake_analysis import fake_analysis
from tests.support.file_tree import snapshot

IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


def forward(model, **kwargs):
    model(IDS, **kwargs)


def in_capture(**kwargs):
    def call(planted, work):
        with headscope.capture(planted.model, **kwargs):
            forward(planted.model)
    return call


def in_ablate(heads, **kwargs):
    def call(planted, work):
        with headscope.ablate(planted.model, heads=heads, **kwargs):
            forward(planted.model)
    return call


def with_hook(name, fn):
    def call(planted, work):
        with headscope.model_hooks(planted.model, {name: fn}):
            forward(planted.model)
    return call


def caching(names, **kwargs):
    def call(planted, work):
        with headscope.cache_activations(planted.model, names, **kwargs):
            forward(planted.model)
    return call


def saved(edit=None, drop_manifest=True):
    """`Analysis.load` on a saved fake analysis after `edit(folder)`."""
    def call(planted, work):
        folder = work / "run"
        if not folder.exists():
            raise AssertionError("prepare() was not run")
        return Analysis.load(folder)
    def prepare(work):
        folder = work / "run"
        fake_analysis(n_layers=2, n_heads=3).save(folder)
        if edit is not None:
            edit(folder)
        if drop_manifest:  # as a folder written before manifests and markers existed, edited by hand
            (folder / MANIFEST).unlink()
            (folder / MARKER).unlink()
    call.prepare = prepare
    return call


def write_meta(meta):
    return lambda folder: (folder / "meta.json").write_text(json.dumps(meta))


def edit_meta(**changes):
    def edit(folder):
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, **changes}))
    return edit


def drop_column(name, column):
    def edit(folder):
        import pandas as pd

        frame = pd.read_csv(folder / name)
        frame.drop(columns=[column]).to_csv(folder / name, index=False)
    return edit


@dataclass(frozen=True)
class ApiFault:
    id: str
    call: Callable  # (planted, work) -> anything
    message: str


def _verify(inputs):
    return lambda planted, work: headscope.verify(planted.model, inputs)


API_FAULTS = [
    ApiFault("capture-layers-strings", in_capture(layers=["a"]), "layers must hold integers, got 'a'"),
    ApiFault("capture-layers-one-int", in_capture(layers=1), "layers must be a list of integers such as [0, 2], got 1"),
    ApiFault("capture-layer-out-of-range", in_capture(layers=[7]), "layer 7 is out of range: the model's attention layers are 0-1"),
    ApiFault("capture-heads-float", in_capture(heads=[0.5]), "heads must hold integers, got 0.5"),
    ApiFault("capture-to-bogus", in_capture(to="bogus"), "to='bogus' is not a device"),
    ApiFault("capture-reduce-not-callable", in_capture(reduce=5), "reduce must be a function"),
    ApiFault("capture-a-loaded", lambda planted, work: headscope.capture(planted).__enter__(),
             "expected a transformers model, got Loaded (a Loaded: pass loaded.model)"),
    ApiFault("ablate-heads-string", in_ablate("0,1"), "ablate needs heads=[(0, 1), (2, 0)] (layer, head pairs), got '0,1'"),
    ApiFault("ablate-flat-list", in_ablate([0, 1]), "ablate needs heads=[(0, 1), (2, 0)] (layer, head pairs), got 0"),
    ApiFault("ablate-triple", in_ablate([(0, 1, 2)]), "got (0, 1, 2)"),
    ApiFault("ablate-head-out-of-range", in_ablate([(0, 9)]), "head 9 is out of range"),
    ApiFault("ablate-mode", in_ablate([(0, 1)], mode="half"), "unknown ablation mode 'half'"),
    ApiFault("hook-wrong-shape", with_hook("layers.0.attn.hook_z", lambda z, hook: z[..., :1]),
             "the hook on layers.0.attn.hook_z returned (1, 6, 4, 1), not a tensor of the value's shape (1, 6, 4, 150)"),
    ApiFault("hook-returns-a-number", with_hook("layers.0.attn.hook_pattern", lambda p, hook: 0.0),
             "the hook on layers.0.attn.hook_pattern returned float"),
    ApiFault("hook-not-callable", with_hook("layers.0.attn.hook_z", 5), "must be a function fn(value, hook), got 5"),
    ApiFault("hook-unknown-name", with_hook("layers.0.attn.hook_zz", lambda z, hook: None),
             "no hook point matches 'layers.0.attn.hook_zz'"),
    ApiFault("cache-to-bogus", caching(["layers.0.attn.hook_z"], to="bogus"), "to='bogus' is not a device"),
    ApiFault("cache-dtype-string", caching(["layers.0.attn.hook_z"], dtype="half"), "dtype must be a torch dtype"),
    ApiFault("load-none", lambda planted, work: headscope.load(None), "load needs a model alias, folder, .gguf file or hub id"),
    ApiFault("load-number", lambda planted, work: headscope.load(5), "as a string, got 5"),
    ApiFault("load-empty", lambda planted, work: headscope.load(""), "as a string, got ''"),
    ApiFault("load-device-number", lambda planted, work: headscope.load(str(work), device=0), "device must be a string"),
    ApiFault("analyze-a-name", lambda planted, work: headscope.analyze("minilm-l6"),
             "analyze takes a loaded model (headscope.load('minilm-l6')), not a str"),
    ApiFault("analyze-seed-huge", lambda planted, work: headscope.analyze(planted, seed=2**70),
             "seed must be an integer from 0 to 2**63-1"),
    ApiFault("analyze-seed-negative", lambda planted, work: headscope.analyze(planted, seed=-1),
             "seed must be an integer from 0 to 2**63-1"),
    ApiFault("verify-no-input-ids", _verify({}), "verify needs inputs={'input_ids': tensor"),
    ApiFault("verify-ids-beyond-vocab", _verify({"input_ids": torch.tensor([[1, 500]])}),
             "input_ids reach 500 but the model's embedding has 99 rows"),
    ApiFault("detector-bad-probe", lambda planted, work: headscope.detector("api_fault", template=lambda t: None,
                                                                              probe="nope"), "got probe='nope'"),
    ApiFault("detector-template-number", lambda planted, work: headscope.detector("api_fault", template=5),
             "template must be a function"),
    ApiFault("detector-builtin-name", lambda planted, work: headscope.detector("induction", template=lambda t: None),
             "'induction' is a built-in detector"),
    ApiFault("analysis-meta-empty", saved(write_meta({})), "meta.json is damaged: it lacks n_layers, n_heads, causal"),
    ApiFault("analysis-meta-a-list", saved(write_meta([1, 2])), "meta.json is damaged: it holds a list, not an object"),
    ApiFault("analysis-meta-heads-string", saved(edit_meta(n_heads="3")), "n_heads is '3', expected a positive integer"),
    ApiFault("analysis-meta-causal-string", saved(edit_meta(causal="yes")), "causal is 'yes', expected a bool"),
    ApiFault("analysis-scores-without-head", saved(drop_column("scores.csv", "head")),
             "scores.csv is damaged: it lacks the column(s) head"),
    ApiFault("analysis-labels-without-label", saved(drop_column("labels.csv", "label")),
             "labels.csv is damaged: it lacks the column(s) label"),
    ApiFault("analysis-meta-cut-with-manifest", saved(lambda folder: (folder / "meta.json").write_text("{}"),
                                                      drop_manifest=False), "meta.json has 2 of the"),
    ApiFault("analysis-load-none", lambda planted, work: Analysis.load(None),
             "Analysis.load needs the folder an analysis was saved in, got None"),
    # every function that takes a loaded model or an analysis says so when given something else
    ApiFault("patch-a-name", lambda planted, work: headscope.patch("m", "a b", "c d", lambda logits: logits),
             "patch takes a loaded model (headscope.load('m')), not a str"),
    ApiFault("patch-no-metric", lambda planted, work: headscope.patch(planted, "a b", "c d", None),
             "patch needs metric=fn(logits)"),
    ApiFault("validate-a-folder-name", lambda planted, work: headscope.validate(planted, "run"),
             "validate takes an analysis (headscope.Analysis.load('run')), not a str"),
    ApiFault("ov-copying-a-name", lambda planted, work: headscope.ov_copying("m"), "ov_copying takes a loaded model"),
    ApiFault("run-syntax-a-name", lambda planted, work: headscope.run_syntax("m"), "run_syntax takes a loaded model"),
    ApiFault("retrieval-a-name", lambda planted, work: headscope.retrieval_scores("m"), "retrieval_scores takes a loaded model"),
    ApiFault("geometry-a-name", lambda planted, work: headscope.geometry("m"), "geometry takes a loaded model"),
    ApiFault("geometry-no-examples", lambda planted, work: headscope.geometry(planted, n_examples=0),
             "n_examples must be an integer of at least 1, got 0"),
    ApiFault("geometry-seq-len-one", lambda planted, work: headscope.geometry(planted, seq_len=1),
             "seq_len must be an integer of at least 2, got 1"),
    ApiFault("add-geometry-a-name", lambda planted, work: headscope.add_geometry("run", planted),
             "add_geometry takes an analysis"),
    ApiFault("kv-policy-a-name", lambda planted, work: headscope.kv_policy("run"), "kv_policy takes an analysis"),
    ApiFault("kv-evaluate-a-name", lambda planted, work: headscope.kv_evaluate("m", None), "kv_evaluate takes a loaded model"),
    ApiFault("timeline-a-name", lambda planted, work: headscope.Timeline().record("m", 0),
             "Timeline.record needs the transformers model being trained, got str"),
    ApiFault("timeline-negative-step", lambda planted, work: headscope.Timeline().record(planted.model, -1),
             "the training step as an integer of at least 0, got -1"),
    ApiFault("callback-every-zero", lambda planted, work: headscope.HeadscopeCallback(every=0, out=str(work / "t")),
             "every must be an integer of at least 1, got 0"),
    ApiFault("patch-strings", lambda planted, work: headscope.patch(planted, "a b", "c d", lambda logits: logits[:, -1, 0]),
             "patch takes token ids (a tensor) or tokenizer output (a dict of tensors) for clean and corrupted, got str"),
    ApiFault("patch-heads-string", lambda planted, work: headscope.patch(planted, IDS, IDS + 1, lambda x: x[:, -1, 0],
                                                                         heads="0,1"),
             "patch needs heads=[(0, 1), (2, 0)] (layer, head pairs), got '0,1'"),
    ApiFault("patch-heads-per-pass-zero", lambda planted, work: headscope.patch(planted, IDS, IDS + 1,
                                                                                lambda x: x[:, -1, 0], heads_per_pass=0),
             "heads_per_pass must be an integer of at least 1, got 0"),
    ApiFault("plot-patching-a-string", lambda planted, work: headscope.plot_patching("table"),
             "plot_patching takes the table headscope.patch returns (layer, head, effect), got str"),
    ApiFault("plot-geometry-a-string", lambda planted, work: headscope.plot_geometry("result"),
             "plot_geometry takes what headscope.geometry returns, got str"),
    ApiFault("ov-copying-block-zero", lambda planted, work: headscope.ov_copying(planted, block_size=0),
             "block_size must be an integer of at least 1, got 0"),
    ApiFault("text-probe-count-string", lambda planted, work: headscope.analyze(
        planted, detectors=["previous_token"], probes=[headscope.TextProbe(n_examples="4", seq_len=24)]),
        "n_examples must be an integer of at least 1, got '4'"),
    ApiFault("analyze-batch-size-string", lambda planted, work: headscope.analyze(planted, batch_size="8"),
             "batch_size must be an integer of at least 1, got '8'"),
    ApiFault("analyze-explorer-negative", lambda planted, work: headscope.analyze(planted, explorer_examples=-1),
             "explorer_examples must be an integer of at least 0, got -1"),
    ApiFault("analysis-save-none", lambda planted, work: fake_analysis(n_layers=2, n_heads=3).save(None),
             "Analysis.save needs a folder to write, got None"),
    ApiFault("analysis-not-a-folder", lambda planted, work: Analysis.load(work / "nowhere"),
             "is not a headscope analysis (missing scores.csv, labels.csv, meta.json)"),
]


@pytest.mark.parametrize("fault", API_FAULTS, ids=[f.id for f in API_FAULTS])
def test_a_bad_argument_is_one_headscope_error(fault, planted, tmp_path):
    prepare = getattr(fault.call, "prepare", None)
    if prepare is not None:
        prepare(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(HeadscopeError) as err:
        fault.call(planted, tmp_path)
    message = str(err.value)
    assert fault.message in message and "\n" not in message, message
    assert snapshot(tmp_path) == before
    assert "api_fault" not in headscope.detectors.REGISTRY.so_far()
    assert headscope.detectors.REGISTRY["induction"].source.startswith("Olsson")  # the built-in is still there

