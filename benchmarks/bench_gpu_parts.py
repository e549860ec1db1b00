"""Where one layer's lazy pass spends its time: each part against SDPA on the same q, k, v.

    python benchmarks/bench_gpu_parts.py --device cuda --dtype bfloat16 --sizes 1024x8,4096x4,16384x1,32768x1
    python benchmarks/bench_gpu_parts.py --device cpu --dtype float32 --sizes 128x2,256x1   # the dry run

One causal layer of SmolLM2-135M's attention shape (9 query heads, 3 key/value heads, 64 dims),
random q, k, v at each size (tokens x batch), each part timed `--repeats` times after a warm-up
(medians; compilation is in the warm-up):
- `sdpa`: `F.scaled_dot_product_attention` (what the model's forward runs), the baseline;
- `z_lse`: `lazy_attention`, z and each row's log-sum-exp (the fused kernel `lse_kernel` picks);
- `entropy`: the row entropy the uniform detector reads (on CUDA a second fused pass in fp32);
- `reads`: the other built-in detectors' reads: diagonals -1 and 0, the first column, and the
  mass on one target a query (an induction-like offset).
On CUDA two candidates for the entropy's pass are timed beside it, with their largest error
against it in nats (`entropy_error`): `entropy_tf32` (the same fp32 pass with TF32 products
allowed) and `entropy_half` (q and k in the model's dtype, statistics still fp32).
Each part's seconds and its ratio to `sdpa` go to --out as one JSON line per size. A ratio of the
whole lazy pass (bench_gpu.py) far above the sum of these points at per-layer overhead instead.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, DIMS = 9, 3, 64


def _timed(fn, device: str, repeats: int) -> float:
    import torch

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _entropy_tf32(lazy):
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        lazy._entropy = None
        return lazy.entropy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
        lazy._entropy = None


def _entropy_half(lazy):
    from headscope.attention.flex import flex_available, flex_stats

    mean_key, keys_lse = flex_stats(lazy.q, lazy.k, lazy.k, None, lazy.is_causal, lazy.scale,
                                    compiled=flex_available(lazy.q.device))
    return lazy._entropy_from(mean_key, keys_lse)


def parts_row(n_tokens: int, batch: int, device: str, dtype, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    from headscope.attention.lazy import lazy_attention
    from headscope.attention.targets import Targets

    generator = torch.Generator().manual_seed(n_tokens + batch)
    q = torch.randn(batch, HEADS, n_tokens, DIMS, generator=generator).to(device, dtype)
    k, v = (torch.randn(batch, KV_HEADS, n_tokens, DIMS, generator=generator).to(device, dtype) for _ in range(2))
    period = max(2, n_tokens // 4)
    b, i = torch.meshgrid(torch.arange(batch), torch.arange(period, n_tokens), indexing="ij")
    targets = Targets(b.flatten().to(device), i.flatten().to(device), (i - period + 1).flatten().to(device),
                      (batch, n_tokens, n_tokens))
    _, lazy = lazy_attention(q, k, v, is_causal=True)

    def entropy():
        lazy._entropy = None
        lazy.entropy()

    def reads():
        lazy.diagonal(-1), lazy.diagonal(0), lazy.column(0), lazy.mass(targets)

    with torch.no_grad():
        seconds = {
            "sdpa": _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                           device, repeats),
            "z_lse": _timed(lambda: lazy_attention(q, k, v, is_causal=True), device, repeats),
            "entropy": _timed(entropy, device, repeats),
            "reads": _timed(reads, device, repeats),
        }
        errors = {}
        if lazy.kernel == "flex":
            exact = lazy.entropy().clone()
            for name, variant in (("entropy_tf32", _entropy_tf32), ("entropy_half", _entropy_half)):
                seconds[name] = _timed(lambda: variant(lazy), device, repeats)
                errors[name] = float((variant(lazy) - exact).abs().max())
    row = {"tokens": n_tokens, "batch": batch, "device": device, "dtype": str(dtype), "kernel": lazy.kernel,
           "seconds": seconds, "entropy_error": errors}
    row["over_sdpa"] = {name: value / seconds["sdpa"] for name, value in seconds.items() if name != "sdpa"}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--sizes", default="1024x8,4096x4,16384x1,32768x1", help="TOKENSxBATCH,...")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results-gpu-parts.jsonl"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    dtype = getattr(torch, args.dtype)
    with open(args.out, "a") as out:
        for size in args.sizes.split(","):
            n_tokens, batch = (int(x) for x in size.split("x"))
            row = parts_row(n_tokens, batch, args.device, dtype, args.repeats)
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
