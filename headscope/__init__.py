"""headscope: find out what each attention head of a transformer does.

Top-level API (imported lazily, so `import headscope` stays fast):
- `load(spec)`, `models()`: load a model by alias, path, GGUF file or hub id.
- `capture(model, ...)`, `ablate(model, heads, ...)`: attention maps and head ablation inside
  Hugging Face models, through headscope's kernel.
- `model_hooks(model, {"layers.3.attn.hook_pattern": fn, ...})`: read or replace q, k, v, scores,
  pattern, z and per-head results inside Hugging Face models (names as on `MultiHeadAttention`).
- `cache_activations(model, names, to="cpu")`: keep only the named activations of forward passes.
- `patch(loaded, clean, corrupted, metric, hook="z")`: activation patching per head (clean into
  corrupted), and `plot_patching(table)`.
- `sites(model)` -> `[Site]`: every attention module, by module path, kind (self, cross), stack
  (text, encoder, decoder) and layer; `capture`, `ablate`, `model_hooks`, `cache_activations`
  and `patch` take `sites="decoder.cross"` to address a group other than the analysed stack.
- `verify(model, inputs)`: headscope's attention against the model's own, layer by layer.
- `ov_copying(loaded)`: each head's OV circuit scored for copying (top-1, eigenvalue share).
- `retrieval_scores(loaded, lengths=(2048, 4096, 8192))`: retrieval heads on needle prompts
  (Wu et al. 2024), answer rows only, with intervals and a control.
- `run_syntax(loaded, sentences=None, ...)` -> `SyntaxResult`: the syntactic detector alone, with
  its full per-relation tables (docs/syntax.md).
- `validate(loaded, analysis)`: ablate each label's top heads against random heads.
- `analyze(loaded, ...)` -> `Analysis`: every head scored by the detectors, with intervals;
  probe settings `TextProbe`, `RepeatedProbe`, `TreebankProbe`, `NeedleProbe` (the opt-in
  `retrieval` detector's needle prompts).
- `detector(name, template=fn, probe=..., threshold=...)`: register a custom detector from the
  attention pattern a head should have (`headscope.detectors.templates`).
- `check_detector(detector)`: the contract every detector keeps (usable fields, its registry
  entry, `[batch, head]` scores from a pattern it leaves untouched), as the built-ins' tests run it.
- `MultiHeadAttention`: headscope's own attention module with hook points.
- `geometry(loaded)` -> `GeometryResult`: heads as subspaces (overlaps, QK/OV ranks), pattern
  similarity (JS, MDS, clusters), redundant pairs, importance and pruning curve; `plot_geometry`.
- `add_geometry(analysis, loaded)` -> `Analysis`: the same attached to an analysis (saved with it,
  drawn in its report).
- `kv_policy(analysis, keep=0.25, rank_by="retrieval")` -> `KVPolicy`: which key/value heads keep
  the full KV cache (the rest a sink and a recent window), written as DuoAttention's or HeadKV's
  files (`headscope.kv`); `kv_evaluate(loaded, policy)`: needle accuracy, loss and KV bytes against
  random heads, the reverse ranking, all streaming and full attention (docs/kv_cache.md).
- `plot_pattern(pattern, tokens)`: a plotly figure of any captured attention map.
- `Timeline()`, `.record(model, step)`: heads over training in a plain PyTorch loop;
  `HeadscopeCallback(every=..., out=DIR)`: the same as a `transformers.TrainerCallback`
  (docs/training.md).
- `logit_attribution(loaded, task)`: each component's direct effect on the task's logit difference;
  `attribute(loaded, task, method="atp" | "atp*" | "exact", point="z")`: each head's effect when
  patched, estimated by attribution patching or measured (docs/attribution.md).
- `task(name_or_path, tokenizer, n=64, seed=0)` -> `Task`: clean and corrupted prompts with their
  answers and a metric ("ioi", "induction", "induction-keys", "greater-than" or a JSONL file);
  `Task(clean=, corrupted=, answer=, wrong=)` straight from token ids (docs/tasks.md).
- `composition(loaded, kind="q" | "k" | "v")`: how strongly each later head reads what each earlier
  head writes, from the weights (Elhage et al. 2021), with a random baseline and z;
  `add_composition(analysis_or_folder, loaded)`: the same attached to an analysis, drawn in its
  report (docs/composition.md).
- `HeadscopeError`: raised for bad input (`UsageError`, its kind for a bad argument value);
  `HeadscopeWarning`: what headscope accepted but says (docs/reliability.md).
"""
from ._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "load": "loading.loader",
    "models": "loading.loader",
    "Loaded": "loading.loader",
    "capture": "hf.capture",
    "ablate": "hf.capture",
    "verify": "hf.verify",
    "sites": "hf.sites",
    "Site": "hf.sites",
    "patch": "causal.patching",
    "plot_patching": "causal.patching",
    "model_hooks": "hf.hooks",
    "cache_activations": "hf.activation_cache",
    "validate": "causal",
    "ov_copying": "head_geometry.ov_circuit",
    "retrieval_scores": "detectors.retrieval.scoring",
    "run_syntax": "detectors.syntax.standalone",
    "analyze": "analysis.analyze",
    "detector": "detectors.templates",
    "check_detector": "detectors.contract",
    "TextProbe": "probes.kinds",
    "RepeatedProbe": "probes.kinds",
    "TreebankProbe": "probes.kinds",
    "NeedleProbe": "probes.kinds",
    "Analysis": "analysis",
    "MultiHeadAttention": "attention",
    "plot_pattern": "report.plotting",
    "geometry": "head_geometry.run",
    "plot_geometry": "head_geometry.run",
    "add_geometry": "analysis.attach_geometry",
    "kv_policy": "kv.policy",
    "KVPolicy": "kv.policy",
    "kv_evaluate": "kv.evaluate",
    "Task": "circuits.tasks",
    "logit_attribution": "circuits.dla",
    "attribute": "circuits.attribution",
    "circuit": "circuits.edge_circuit",
    "Circuit": "circuits.edge_circuit",
    "task": "circuits.task_builders",
    "composition": "circuits.composition_scores",
    "add_composition": "analysis.attach_composition",
    "HeadscopeError": "errors",
    "UsageError": "errors",
    "HeadscopeWarning": "errors",
    "Timeline": "training.timeline",
    "HeadscopeCallback": "training.callback",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
