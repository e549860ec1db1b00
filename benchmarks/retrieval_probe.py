"""The retrieval probe at long context against a plain SDPA forward pass over the same tokens.

    PYTHONPATH=. python benchmarks/retrieval_probe.py [--length 8192] [--repeats 1] [--out benchmarks/results-retrieval-probe.json]

In one process, on one needle prompt of `--length` tokens (SmolLM2-135M, fp32):
- `sdpa_forward`: `model(input_ids, logits_to_keep=n_answer + 1)` with the model's own SDPA
  attention (the floor: the same tokens, the same logits);
- `retrieval_probe`: `headscope.detectors.retrieval.scoring.run_needle`, the same call routed through headscope's
  kernel with each layer's answer-query rows computed and reduced to their argmax.
Each runs once at 256 tokens to warm up, then `--repeats` rounds (round robin). Peak memory is
the process's peak resident set during the call (VmHWM after a reset through
`/proc/self/clear_refs`, large allocations forced to mmap so freed memory returns), weights
included. Also printed: what the eager-attentions route (`output_attentions=True`) would hold,
layers x heads x T^2 x 4 bytes of fp32 maps.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:  # must be set before the process starts
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch  # noqa: E402

import headscope  # noqa: E402
from headscope.probes.needle import needle_probe  # noqa: E402
from headscope.detectors.retrieval.scoring import _answer_logits, run_needle  # noqa: E402


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def measure(fn):
    """(seconds, peak resident bytes) of one call."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, _rss_kib("VmHWM:") * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results-retrieval-probe.json")
    args = parser.parse_args()
    loaded = headscope.load("smollm2-135m", device="cpu")
    model = loaded.model
    print("attention implementation:", model.config._attn_implementation, flush=True)

    def contenders(example):
        ids = example.input_ids[None]
        n = example.answer.stop - example.answer.start
        return {"sdpa_forward": lambda: _answer_logits(model, ids, n),
                "retrieval_probe": lambda: run_needle(loaded, example)}

    warm = needle_probe(loaded.tokenizer, [256], depths=(0.5,))[0]
    for fn in contenders(warm).values():
        with torch.no_grad():
            fn()
    example = needle_probe(loaded.tokenizer, [args.length], depths=(0.5,))[0]
    runs = {name: [] for name in contenders(example)}
    for round_ in range(args.repeats):
        for name, fn in contenders(example).items():
            with torch.no_grad():
                runs[name].append(measure(fn))
            print(f"round {round_ + 1} {name}: {runs[name][-1][0]:.1f} s, peak {runs[name][-1][1] / 2**30:.2f} GiB",
                  flush=True)
    seconds = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    peak = {name: max(r[1] for r in rs) for name, rs in runs.items()}
    eager_maps = loaded.n_layers * loaded.n_heads * args.length ** 2 * 4
    row = {
        "length": example.length, "repeats": args.repeats, "seconds": seconds,
        "peak_gib": {name: p / 2**30 for name, p in peak.items()},
        "time_ratio": seconds["retrieval_probe"] / seconds["sdpa_forward"],
        "memory_ratio": peak["retrieval_probe"] / peak["sdpa_forward"],
        "eager_maps_gib": eager_maps / 2**30, "eager_maps_one_layer_gib": eager_maps / loaded.n_layers / 2**30,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps(row, indent=1), flush=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
