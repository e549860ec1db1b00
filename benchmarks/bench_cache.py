"""Selective activation cache: `headscope.cache_activations` of one hook name per layer against
TransformerLens's `run_with_cache` with a `names_filter`, same model, same prompts, one process.

    python benchmarks/bench_cache.py                          # T 128 and 512, B 4
    python benchmarks/bench_cache.py --seq-lens 256 --batches 8 --repeats 5 --point hook_pattern

Contenders (all compute the LM head's logits, as `run_with_cache` does):
- a_forward: the Hugging Face model's plain forward pass (the baseline);
- h_cache: `with headscope.cache_activations(model, ["layers.*.attn.<point>"], to="cpu")`, forward;
- c_forward: TransformerLens 4.3's `TransformerBridge` (booted with hf_model= on its own copy of
  the weights), plain forward pass: TransformerLens's own floor;
- c_cache: the bridge's `run_with_cache(tokens, names_filter=lambda n: n == "blocks.L.attn.<point>")`
  for the same layers.
Every contender runs once to warm up, then `--repeats` rounds each run every contender once
(round robin); times are medians, ratios are medians over rounds of each round's ratio. Memory
as in bench_heads.py: the process's peak resident set during the call ("peak", weights included:
the bridge's copy is resident during every call, so compare "extra", the peak minus the resident
set before the call). The script also checks that both caches hold the same values.
"""
from __future__ import annotations

import os
import sys

if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:  # must be set before the process starts
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import headscope  # noqa: E402
from bench_heads import measure  # noqa: E402

TL_NAMES = {"hook_z": "hook_z", "hook_pattern": "hook_pattern", "hook_q": "hook_q", "hook_v": "hook_v",
            "hook_k": "hook_k", "hook_scores": "hook_attn_scores", "hook_result": "hook_result"}
# headscope's layout -> TransformerLens's, for the agreement check
TO_TL = {"hook_q": lambda x: x.transpose(1, 2), "hook_k": lambda x: x.transpose(1, 2),
         "hook_v": lambda x: x.transpose(1, 2)}


def contenders(loaded, bridge, point: str, layers: int):
    model = loaded.model
    tl_names = {f"blocks.{l}.attn.{TL_NAMES[point]}" for l in range(layers)}

    @torch.no_grad()
    def a_forward(ids):
        model(input_ids=ids)
        return None

    @torch.no_grad()
    def h_cache(ids):
        with headscope.cache_activations(model, [f"layers.*.attn.{point}"], to="cpu") as cache:
            model(input_ids=ids)
        return {l: cache[f"layers.{l}.attn.{point}"] for l in range(layers)}

    @torch.no_grad()
    def c_forward(ids):
        bridge(ids)
        return None

    @torch.no_grad()
    def c_cache(ids):
        _, cache = bridge.run_with_cache(ids, names_filter=lambda name: name in tl_names)
        return {l: cache[f"blocks.{l}.attn.{TL_NAMES[point]}"] for l in range(layers)}

    return {"a_forward": a_forward, "h_cache": h_cache, "c_forward": c_forward, "c_cache": c_cache}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batches", type=int, nargs="+", default=[4])
    parser.add_argument("--point", default="hook_z", choices=sorted(TL_NAMES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results-cache.jsonl"))
    args = parser.parse_args()

    from importlib.metadata import version

    from transformer_lens.model_bridge import TransformerBridge

    loaded = headscope.load(args.model, device="cpu")
    layers = loaded.model.config.num_hidden_layers
    # The bridge rewires the model it is given, so it gets its own copy of the weights.
    bridge = TransformerBridge.boot_transformers(loaded.name, hf_model=copy.deepcopy(loaded.model),
                                                 tokenizer=loaded.tokenizer)
    fns = contenders(loaded, bridge, args.point, layers)
    g = torch.Generator().manual_seed(0)
    for seq_len in args.seq_lens:
        for batch in args.batches:
            ids = torch.randint(1000, loaded.model.config.vocab_size - 1000, (batch, seq_len), generator=g)
            runs = {name: [] for name in fns}
            for name, fn in fns.items():
                measure(lambda: fn(ids), "cpu")  # warm-up
            for _ in range(args.repeats):
                for name, fn in fns.items():
                    runs[name].append(measure(lambda: fn(ids), "cpu"))
            ours, theirs = runs["h_cache"][-1][3], runs["c_cache"][-1][3]
            fix = TO_TL.get(args.point, lambda x: x)
            worst = max((fix(ours[l]) - theirs[l].cpu()).abs().max().item() for l in range(layers))
            row = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "device": "cpu",
                   "transformer_lens": version("transformer_lens"), "point": args.point, "seq_len": seq_len,
                   "batch": batch, "repeats": args.repeats, "max_abs_diff_h_vs_c": worst,
                   "cached_mib": sum(v.numel() * v.element_size() for v in ours.values()) / 2**20, "contenders": {}}
            for name in fns:
                row["contenders"][name] = {"seconds": statistics.median(r[0] for r in runs[name]),
                                           "peak_gib": max(r[1] for r in runs[name]) / 2**30,
                                           "extra_gib": max(r[2] for r in runs[name]) / 2**30,
                                           "all_seconds": [round(r[0], 3) for r in runs[name]]}
            ratio = lambda x, y: round(statistics.median(p[0] / q[0] for p, q in zip(runs[x], runs[y])), 3)
            extra = lambda x, y: round(row["contenders"][x]["extra_gib"] / row["contenders"][y]["extra_gib"], 3)
            row.update({"time h/a": ratio("h_cache", "a_forward"), "time c_cache/c_forward": ratio("c_cache", "c_forward"),
                        "time c_cache/a": ratio("c_cache", "a_forward"), "time h/c_cache": ratio("h_cache", "c_cache"),
                        "extra h/a": extra("h_cache", "a_forward"), "extra c_cache/a": extra("c_cache", "a_forward"),
                        "extra h/c_cache": extra("h_cache", "c_cache")})
            print(json.dumps({k: v for k, v in row.items() if k != "contenders"}), flush=True)
            for name, c in row["contenders"].items():
                print(f"  {name:<10} {c['seconds']:7.2f} s  peak {c['peak_gib']:.2f} GiB (+{c['extra_gib']:.2f})", flush=True)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
