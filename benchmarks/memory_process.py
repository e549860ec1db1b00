"""Whole-process memory of headscope against plain transformers: loading, and `analyze` against a
forward pass, each contender in a fresh process with the default allocator.

    python benchmarks/memory_process.py                           # every contender, 3 processes each
    python benchmarks/memory_process.py --only load --repeats 5
    python benchmarks/memory_process.py --headscope /path/to/other/checkout --label before

Every contender runs in its own `python` process (MALLOC_* variables removed, so glibc's default
allocator) and reads VmHWM (peak resident set) and VmRSS (resident set) from /proc/self/status.
Nothing is reset: the figures are the whole process's, interpreter and imports included, as a
user's process holds them.

Loading (`--only load`), the model and its tokenizer, then one forward pass of the whole model
(task head included) over 32 tokens:
- `transformers gguf`: `AutoModelForCausalLM` and `AutoTokenizer` `from_pretrained(..., gguf_file=)`
  of the bundled SmolLM2-135M file; `headscope gguf converting`: `headscope.load("smollm2-135m")`
  on an empty load cache (converts, writes the entry); `headscope gguf cached`: the same on a
  warm cache (reads the entry);
- `transformers bf16 folder` / `headscope bf16 folder`: SmolLM2 saved once with `save_pretrained`
  in bfloat16, loaded with dtype bfloat16;
- `transformers minilm` / `headscope minilm`: the bundled all-MiniLM-L6-v2 `model/` folder (fp32).
Fields: `loaded_peak_mib` (VmHWM once loaded: the peak while loading), `loaded_mib` (VmRSS once
loaded), `forward_mib` (VmRSS after the forward pass, which reads every weight: a model read from a
safetensors file keeps its weights in the file's mapping, resident only once they are read).

`analyze` (`--only analyze`), at each `--sizes` TxB (the pattern detectors' two probes, B examples
of T tokens each, built once by `memory_by_detector._probes` and saved for both contenders):
- `transformers forward`: transformers loads the load cache's SmolLM2 entry (the weights headscope
  reads) and its tokenizer and runs the model body's SDPA forward over both probes;
- `headscope forward`: `headscope.load("smollm2-135m")` and the same forward (the model as
  headscope loads it: its process and allocator state, the same weights);
- `transformers forward, heap held`: the transformers forward inside `headscope.loading.heap.heap_held()`,
  the allocator settings `analyze` runs under (glibc keeps freed heap for the next layer instead
  of faulting it in again): what of analyze's time against the plain forward is the allocator's;
- `headscope entropy pass`: `headscope.load` and only the fused kernel call per layer that
  `uniform`'s exact row entropy adds (`memory_by_detector.entropy_pass`), the time no plain
  forward spends and an exact analysis must;
- `headscope analyze`: `headscope.load("smollm2-135m")` and `analyze` with the default pattern
  detectors, `control=None`, `ov=False`, over the same tokens.
Fields: `peak_mib` (the process's VmHWM at the end), `end_mib` (VmRSS), `seconds` (the forward,
the entropy pass or the analysis alone: each contender's imports, and the entropy pass's random
q and k, come before the clock), `import_seconds` (analyze's first import of the analysis
modules, pandas among them, which a process pays once). The time floor of an analysis is a forward plus the
entropy pass: the ratios give analyze's time over it, with each forward.

With the control twin (`--only control`, with `--only analyze` for the ratios against the time
floor): `transformers forward x2` runs the forward twice (the twin's pass is a second forward, of
a second model); `headscope analyze+control` runs `analyze` with its default random-init twin,
whose weights the process then holds beside the model's.

The control twin (`--only twin`): `headscope.load`, one forward, then `random_twin`; `twin_peak_mib`
is VmHWM minus the resident set just before the twin (reset through /proc/self/clear_refs),
`twin_mib` the resident set it adds, `twin_weights_mib` its parameters' bytes.

Medians over `--repeats` processes per contender, run round robin; one JSON line per invocation is
added to --out (results-memory-process.jsonl), written atomically.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADS = ["transformers gguf", "headscope gguf converting", "headscope gguf cached", "transformers bf16 folder",
         "headscope bf16 folder", "transformers minilm", "headscope minilm"]
ANALYZE = ["transformers forward", "transformers forward, heap held", "headscope forward", "headscope entropy pass",
           "headscope analyze"]
CONTROL = ["transformers forward x2", "headscope analyze+control"]
PAIRS = [("headscope gguf converting", "transformers gguf"), ("headscope gguf cached", "transformers gguf"),
         ("headscope bf16 folder", "transformers bf16 folder"), ("headscope minilm", "transformers minilm")]


def _mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _load(name: str, paths: dict):
    """(model body to run, `headscope.Loaded` or the transformers model) as the contender loads it."""
    import torch

    kind = name.split()[1].rstrip(",")
    if name.startswith("headscope"):
        import headscope

        spec = {"bf16": paths["bf16"], "minilm": "minilm-l6"}.get(kind, "smollm2-135m")
        loaded = headscope.load(spec, device="cpu", dtype=torch.bfloat16 if kind == "bf16" else None)
        return loaded.body, loaded
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
    if kind == "gguf":
        gguf = Path(paths["gguf"])
        where, extra = gguf.parent, {"gguf_file": gguf.name}
    else:
        where, extra = {"bf16": paths["bf16"], "minilm": paths["minilm"], "forward": paths["entry"]}[kind], {}
    auto = AutoModel if kind == "minilm" else AutoModelForCausalLM
    dtype = {"dtype": torch.bfloat16} if kind == "bf16" else {}
    model = auto.from_pretrained(where, local_files_only=True, **extra, **dtype).eval()
    AutoTokenizer.from_pretrained(where, local_files_only=True, **extra)
    return (model if kind == "minilm" else model.model), model


def child(name: str, size: str, paths: dict) -> dict:
    """Run one contender in this process and return its figures."""
    import torch

    torch.set_grad_enabled(False)
    body, model = _load(name, paths)
    gc.collect()
    if name in LOADS:
        loaded = {"loaded_peak_mib": _mib("VmHWM"), "loaded_mib": _mib("VmRSS")}
        ids = torch.arange(1, 33)[None]
        full = model.model if name.startswith("headscope") else model  # the task head too
        full(input_ids=ids, attention_mask=torch.ones_like(ids))
        gc.collect()
        return {**loaded, "forward_mib": _mib("VmRSS"), "peak_mib": _mib("VmHWM")}
    if name == "headscope twin":
        from headscope.loading.control import CONTROL_SEED_OFFSET, random_twin

        ids = torch.arange(1, 33)[None]
        body(input_ids=ids, attention_mask=torch.ones_like(ids))
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _mib("VmRSS")
        twin = random_twin(model, CONTROL_SEED_OFFSET)
        gc.collect()
        weights = sum(p.numel() * p.element_size() for p in twin.model.parameters()) / 2**20
        return {"before_mib": before, "twin_peak_mib": _mib("VmHWM") - before, "twin_mib": _mib("VmRSS") - before,
                "twin_weights_mib": weights}
    probes = torch.load(paths["probes"][size], weights_only=False)
    imports = 0.0
    if name == "headscope entropy pass":
        sys.path.insert(0, str(HERE))
        from memory_by_detector import entropy_pass

        seq_len, batch = (int(x) for x in size.split("x"))
        run_entropy = entropy_pass(model, seq_len, batch)  # its random q and k made before the clock
    elif name.startswith("headscope analyze"):  # what analyze imports (pandas among them), before the clock as
        start = time.perf_counter()    # the forward's own imports are; its time is recorded apart
        import headscope.analysis.analyze  # noqa: F401

        imports = time.perf_counter() - start
    start = time.perf_counter()
    if name in ("transformers forward", "headscope forward", "transformers forward x2", "transformers forward, heap held"):
        from contextlib import nullcontext

        from headscope.loading.heap import heap_held

        with heap_held() if name.endswith("heap held") else nullcontext():
            for _ in range(2 if name.endswith("x2") else 1):
                for probe in probes["probes"]:
                    body(input_ids=probe.input_ids, attention_mask=torch.ones_like(probe.input_ids))
    elif name == "headscope entropy pass":
        run_entropy()
    else:
        import headscope

        control = "random-init" if name.endswith("+control") else None
        headscope.analyze(model, detectors=probes["detectors"], probes=probes["probes"],
                          batch_size=len(probes["probes"][0].input_ids), control=control, ov=False)
    seconds = time.perf_counter() - start
    gc.collect()
    return {"seconds": seconds, "peak_mib": _mib("VmHWM"), "end_mib": _mib("VmRSS"), "import_seconds": imports}


PREPARE = """
import json, sys, torch
sys.path.insert(0, {here!r})
import headscope
from headscope.detectors import get
from headscope.detectors.registry import defaults
from memory_by_detector import _probes
loaded = headscope.load("smollm2-135m", device="cpu")  # converts into the run's own load cache
loaded.model.to(torch.bfloat16).save_pretrained({bf16!r})
loaded.tokenizer.save_pretrained({bf16!r})
detectors = [name for name in defaults(loaded.causal) if get(name).probe in ("text", "repeated")]
files = {{}}
for size in {sizes!r}:
    seq_len, batch = (int(x) for x in size.split("x"))
    files[size] = f"{tmp}/probes-{{size}}.pt"
    torch.save({{"detectors": detectors, "probes": list(_probes(loaded, seq_len, batch).values())}}, files[size])
from headscope.loading import load_cache
from headscope.loading.loader import ALIASES
entry = load_cache.lookup(load_cache.source_key(ALIASES["smollm2-135m"].location(), None))
print(json.dumps({{"entry": str(entry), "probes": files}}))
"""


def _environment(checkout: Path, cache: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    return {**env, "PYTHONPATH": str(checkout), "HEADSCOPE_CACHE": str(cache)}


def prepare(checkout: Path, tmp: Path, sizes: list[str]) -> dict:
    """The paths every contender reads: the GGUF file, a warm load cache and its entry, the bf16
    folder, MiniLM's folder, the probes of each size."""
    sys.path.insert(0, str(checkout))
    from headscope.loading.loader import ALIASES

    paths = {"gguf": str(ALIASES["smollm2-135m"].location()), "minilm": str(ALIASES["minilm-l6"].location()),
             "bf16": str(tmp / "smollm2-bf16"), "cache": str(tmp / "cache")}
    script = PREPARE.format(here=str(HERE), bf16=paths["bf16"], sizes=sizes, tmp=str(tmp))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=checkout,
                         env=_environment(checkout, Path(paths["cache"])))  # (`-c`: the working folder comes first)
    if out.returncode:
        raise SystemExit(f"preparing failed:\n{out.stderr[-3000:]}")
    return {**paths, **json.loads(out.stdout.strip().splitlines()[-1])}


def spawn(name: str, size: str, paths: dict, checkout: Path) -> dict:
    cache = Path(paths["cache"])
    if name == "headscope gguf converting":
        cache = Path(tempfile.mkdtemp(prefix="cold-cache-", dir=Path(paths["bf16"]).parent))
    out = subprocess.run([sys.executable, __file__, "--child", name, "--sizes", size, "--paths", json.dumps(paths)],
                         capture_output=True, text=True, env=_environment(checkout, cache))
    if out.returncode:
        raise SystemExit(f"{name} {size} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict]) -> dict:
    row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    row["runs"] = [{key: round(value, 2) for key, value in run.items()} for run in runs]
    return row


def _ratios(results: dict) -> dict:
    ratios = {}
    for ours, theirs in PAIRS:
        if ours in results and theirs in results:
            ratios[f"{ours} / {theirs}"] = {key: results[ours][key] / results[theirs][key]
                                            for key in ("loaded_peak_mib", "loaded_mib", "forward_mib")}
    for size in {key.split("@")[1] for key in results if "@" in key}:
        ours, theirs = results.get(f"headscope analyze@{size}"), results.get(f"transformers forward@{size}")
        if ours and theirs:
            ratios[f"analyze / forward @{size}"] = {key: ours[key] / theirs[key]
                                                    for key in ("peak_mib", "end_mib", "seconds")}
        entropy = results.get(f"headscope entropy pass@{size}")
        for who in ("transformers forward", "transformers forward, heap held", "headscope forward"):
            forward = results.get(f"{who}@{size}")
            if ours and forward and entropy:  # the time floor: a plain forward plus the entropy pass
                floor = forward["seconds"] + entropy["seconds"]
                ratios[f"analyze / ({who} + entropy pass) @{size}"] = {"seconds": ours["seconds"] / floor}
        with_twin, twice = results.get(f"headscope analyze+control@{size}"), results.get(f"transformers forward x2@{size}")
        if with_twin and twice:
            ratios[f"analyze+control / forward x2 @{size}"] = {key: with_twin[key] / twice[key]
                                                               for key in ("peak_mib", "end_mib", "seconds")}
            if entropy:  # the twin's pass needs its entropy pass too
                ratios[f"analyze+control / (forward x2 + 2 entropy passes) @{size}"] = {
                    "seconds": with_twin["seconds"] / (twice["seconds"] + 2 * entropy["seconds"])}
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["load", "analyze", "control", "twin"],
                        default=["load", "analyze", "twin"])
    parser.add_argument("--sizes", nargs="+", default=["1024x4", "4096x1"], help="SEQ_LENxBATCH for analyze")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--headscope", type=Path, default=HERE.parent, help="the checkout whose headscope runs")
    parser.add_argument("--label", default="", help="what the run is called in --out (e.g. before, after)")
    parser.add_argument("--out", type=Path, default=HERE / "results-memory-process.jsonl")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.sizes[0], json.loads(args.paths))))
        return
    from headscope.atomic import write_text_atomic

    jobs = ([(name, "") for name in LOADS] if "load" in args.only else []) + \
        ([(name, size) for size in args.sizes for name in ANALYZE] if "analyze" in args.only else []) + \
        ([(name, size) for size in args.sizes for name in CONTROL] if "control" in args.only else []) + \
        ([("headscope twin", "")] if "twin" in args.only else [])
    checkout = args.headscope.resolve()
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load_average = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="memory-process-") as tmp:
        paths = prepare(checkout, Path(tmp), args.sizes)
        runs = {job: [] for job in jobs}
        for _ in range(args.repeats):  # round robin: a slow spell does not land on one contender
            for name, size in jobs:
                runs[(name, size)].append(spawn(name, size or args.sizes[0], paths, checkout))
                load_average.append(os.getloadavg()[0])
    results = {(f"{name}@{size}" if size else name): _median(found) for (name, size), found in runs.items()}
    row = {"date": time.strftime("%Y-%m-%d %H:%M"), "label": args.label, "headscope": str(checkout), "commit": commit,
           "repeats": args.repeats, "load_average": [round(min(load_average), 2), round(max(load_average), 2)],
           "contenders": results, "ratios": _ratios(results)}
    for name, result in results.items():
        print(f"{name:>32}: " + ", ".join(f"{k} {v:.1f}" for k, v in result.items() if k != "runs"), flush=True)
    for name, ratio in row["ratios"].items():
        print(f"{name:>58}: " + ", ".join(f"{k} x{v:.3f}" for k, v in ratio.items()), flush=True)
    previous = args.out.read_text() if args.out.exists() else ""
    write_text_atomic(args.out, previous + json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
