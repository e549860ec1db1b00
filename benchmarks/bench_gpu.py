"""The lazy detectors' pass against a plain forward pass and eager maps, at long context.

    python benchmarks/bench_gpu.py --device cuda --dtype bfloat16 --sizes 1024x8,4096x4,16384x1,32768x1
    python benchmarks/bench_gpu.py --device cpu --dtype float32 --sizes 128x2,256x1   # the dry run

For each size (tokens x batch) on SmolLM2-135M (or a folder of its shape, `--model`), in one process, the same random token ids go
through three runs, each `--repeats` times after one warm-up (the median is kept):
- `forward`: the model's own forward pass (SDPA attention, transformers' default), no hooks;
- `lazy`: what `headscope analyze` runs per probe with its lazy detectors: the same forward
  pass inside `headscope.capture(reduce=...)` with every lazy built-in detector reducing each
  layer's `LazyPattern` (the fused log-sum-exp kernel, `meta`'s "lse");
- `eager`: transformers' eager attention with `output_attentions=True` (every layer's map).
Each row has seconds and, on CUDA, peak memory allocated during the run (bytes above what was
held before it); a run that does not fit says so ("out of memory") instead of a number. The
ratios lazy/forward are the figures of merit. Rows are appended as JSON lines to --out.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _measure(fn, device: str, repeats: int) -> dict:
    """Median seconds of `fn()` over `repeats` after a warm-up, and peak memory above the start."""
    import torch

    cuda = device.startswith("cuda")
    try:
        fn()  # warm-up: compilation, allocator growth
        _sync(device)
        times, peaks = [], []
        for _ in range(repeats):
            if cuda:
                torch.cuda.empty_cache()
                start_bytes = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - start)
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated() - start_bytes)
        return {"seconds": statistics.median(times), "peak_bytes": max(peaks) if peaks else None}
    except torch.OutOfMemoryError:
        return {"seconds": None, "peak_bytes": None, "error": "out of memory"}
    finally:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def run_size(loaded, n_tokens: int, batch: int, repeats: int, eager_model) -> dict:
    import torch

    import headscope
    from headscope.detectors import REGISTRY
    from headscope.probes.base import ProbeBatch

    device = str(loaded.device)
    generator = torch.Generator().manual_seed(n_tokens * 31 + batch)
    ids = torch.randint(0, loaded.model.config.vocab_size, (batch, n_tokens), generator=generator)
    mask = torch.ones_like(ids, dtype=torch.bool)
    probe_batch = ProbeBatch(ids, mask, True, 1).to(device)  # as analyze moves its batches
    detectors = [d for d in REGISTRY.values() if d.lazy and not d.bidirectional_only and d.probe != "needle"]
    ids_dev = ids.to(device)
    kernels = set()

    def reduce(layer, pattern, attention_mask):
        kernels.add(getattr(pattern, "kernel", "map"))
        return {d.name: d.score(pattern, probe_batch).cpu() for d in detectors}

    @torch.no_grad()
    def forward():
        loaded.body(input_ids=ids_dev)

    @torch.no_grad()
    def lazy():
        with headscope.capture(loaded.model, reduce=reduce, lazy=True):
            loaded.body(input_ids=ids_dev)

    @torch.no_grad()
    def eager():
        eager_model.model(input_ids=ids_dev, output_attentions=True)

    row = {"tokens": n_tokens, "batch": batch, "device": device, "dtype": str(next(loaded.model.parameters()).dtype),
           "detectors": [d.name for d in detectors]}
    for name, fn in (("forward", forward), ("lazy", lazy), ("eager", eager)):
        row[name] = _measure(fn, device, repeats)
        print(f"{n_tokens:>6} x {batch:<2} {name:<8} {row[name]}", flush=True)
    row["lse_kernels"] = sorted(kernels)
    f, l = row["forward"], row["lazy"]
    if f["seconds"] and l["seconds"]:
        row["lazy_over_forward_time"] = l["seconds"] / f["seconds"]
    if f.get("peak_bytes") and l.get("peak_bytes"):
        row["lazy_over_forward_memory"] = l["peak_bytes"] / f["peak_bytes"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="an alias or a model folder (benchmarks/gpu_model.py)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--sizes", default="1024x8,4096x4,16384x1,32768x1", help="TOKENSxBATCH,...")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results-gpu.jsonl"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    import transformers

    import headscope

    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    loaded = headscope.load(args.model, device=args.device, dtype=args.dtype)
    # The same weights with eager attention, for output_attentions (SDPA cannot return maps).
    eager_model = copy.deepcopy(loaded.model)
    eager_model.set_attn_implementation("eager")
    header = {"model": args.model, "random_weights": (Path(args.model) / "random-weights.txt").exists(),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    with open(args.out, "a") as out:
        for n_tokens, batch in sizes:
            row = {**header, **run_size(loaded, n_tokens, batch, args.repeats, eager_model)}
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
