"""Head-analysis benchmark on SmolLM2-135M: time and peak memory of headscope against the floors,
the common practice (eager maps) and TransformerLens, on the same tokens, in one process.

    python benchmarks/bench_heads.py                       # the issue's grid: T 128-2048, B 1 and 8
    python benchmarks/bench_heads.py --seq-lens 1024 --batches 4 --repeats 3
    python benchmarks/bench_heads.py --device cuda --dtype bfloat16

For each (seq_len, batch) every contender (see contenders.py) runs once to warm up, then
`--repeats` rounds run every contender once each (round robin, so a slow spell of a shared
machine does not land on one contender; TransformerLens runs after the others because its copy
of the weights stays resident); the table gives median seconds and peak memory, and the time
ratios d/a, d/a', d/b, d/c as medians over rounds of each round's ratio. Peak memory on the CPU
is the process's peak resident set during the run (VmHWM after resetting it through
/proc/self/clear_refs), with large allocations forced to mmap
(MALLOC_MMAP_THRESHOLD_) so that freed maps go back to the system between contenders; "extra"
is that peak minus the resident set before the run. On CUDA it is torch's peak allocation.
A contender whose maps cannot fit (b at long sequences) is skipped and reported as such.
Results are appended as JSON lines to --out.
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

import torch

sys.path.insert(0, str(Path(__file__).parent))
import headscope  # noqa: E402
from contenders import CONTENDERS, release  # noqa: E402
from headscope.probes.base import repeated_probe, text_probe  # noqa: E402


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def measure(fn, device: str):
    """(seconds, peak bytes, extra bytes over the start) of one call."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident set
        start = _rss_kib("VmRSS:") * 1024
    t = time.perf_counter()
    result = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else _rss_kib("VmHWM:") * 1024
    return seconds, peak, peak - start, result


def _available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return free
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    return int(next(l for l in meminfo if l.startswith("MemAvailable")).split()[1]) * 1024


def _text_ids(tokenizer, batch: int, seq_len: int) -> torch.Tensor:
    """`batch` windows of natural text; at long lengths the corpus has fewer, so rows repeat."""
    from headscope.errors import HeadscopeError

    n = batch
    while True:
        try:
            ids = text_probe(tokenizer, n, seq_len, seed=0).input_ids
            break
        except HeadscopeError:
            n -= 1
    return ids.repeat((batch + n - 1) // n, 1)[:batch]


def _call(name, loaded, text, repeated, start):
    return lambda: CONTENDERS[name](loaded, text, repeated, start)


def agreement(scores: dict, k: int = 5) -> dict:
    """Top-k overlap and rank correlation of each contender's head scores with headscope's."""
    out = {}
    ours = scores.get("d_headscope")
    if ours is None:
        return out
    for name, theirs in scores.items():
        if name == "d_headscope" or theirs is None:
            continue
        for det in ours:
            a, b = ours[det].flatten(), theirs[det].flatten()
            top_a, top_b = set(a.topk(k).indices.tolist()), set(b.topk(k).indices.tolist())
            rank = lambda x: x.argsort().argsort().double()
            rho = torch.corrcoef(torch.stack([rank(a), rank(b)]))[0, 1].item()
            best = a.argmax().item()
            out[f"{name}/{det}"] = {"top{}_overlap".format(k): len(top_a & top_b), "spearman": round(rho, 4),
                                    "ratio_at_our_best_head": round((b[best] / a[best]).item(), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results.jsonl"))
    args = parser.parse_args()

    loaded = headscope.load(args.model, device=args.device, dtype=args.dtype)
    cfg = loaded.model.config
    elem = 4 if loaded.model.dtype == torch.float32 else 2
    for seq_len in args.seq_lens:
        for batch in args.batches:
            text = _text_ids(loaded.tokenizer, batch, seq_len).to(loaded.device)
            rep = repeated_probe(loaded.tokenizer, batch, repeat_len=(seq_len - 1) // 2, repeats=2, seed=0,
                                 vocab_size=cfg.vocab_size)
            repeated, start = rep.input_ids.to(loaded.device), rep.content_start
            maps_bytes = cfg.num_hidden_layers * batch * cfg.num_attention_heads * seq_len ** 2 * max(elem, 4)
            row = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "device": args.device, "dtype": str(loaded.model.dtype), "seq_len": seq_len,
                   "batch": batch, "repeats": args.repeats, "contenders": {}}
            scores, runs = {}, {}
            chosen = []
            for name in args.contenders:
                if name == "b_eager_maps" and maps_bytes * 1.5 > _available_bytes(args.device):
                    row["contenders"][name] = {"skipped": f"its maps need {maps_bytes / 2**30:.1f} GiB"}
                    continue
                chosen.append(name)
            # Round robin: each round runs every contender once, so a slow spell of a shared machine
            # touches all of them rather than every run of one. TransformerLens goes last and on its
            # own: its copy of the weights stays resident and would count in the others' peaks.
            for group in ([n for n in chosen if n != "c_transformer_lens"], [n for n in chosen if n == "c_transformer_lens"]):
                for name in group:
                    measure(_call(name, loaded, text, repeated, start), args.device)  # warm-up
                    runs[name] = []
                for _ in range(args.repeats):
                    for name in group:
                        runs[name].append(measure(_call(name, loaded, text, repeated, start), args.device))
            release()  # the next configuration's peaks start without TransformerLens's weights
            for name in chosen:
                row["contenders"][name] = {
                    "seconds": statistics.median(r[0] for r in runs[name]),
                    "peak_gib": max(r[1] for r in runs[name]) / 2**30, "extra_gib": max(r[2] for r in runs[name]) / 2**30,
                    "all_seconds": [round(r[0], 3) for r in runs[name]],
                }
                scores[name] = runs[name][-1][3]
                print(f"seq {seq_len:>5} batch {batch}  {name:<20} {row['contenders'][name]['seconds']:8.2f} s  "
                      f"peak {row['contenders'][name]['peak_gib']:.2f} GiB (+{row['contenders'][name]['extra_gib']:.2f})",
                      flush=True)
            d = row["contenders"].get("d_headscope", {})
            for other in ("a_sdpa", "a_eager", "b_eager_maps", "c_transformer_lens"):
                o = row["contenders"].get(other, {})
                if "seconds" in d and "seconds" in o:
                    # median over rounds of the ratio of the two contenders' runs in that round
                    ratio = statistics.median(x[0] / y[0] for x, y in zip(runs["d_headscope"], runs[other]))
                    row[f"time d/{other[:1] if other != 'a_eager' else 'a_prime'}"] = round(ratio, 3)
                    row[f"peak d/{other[:1] if other != 'a_eager' else 'a_prime'}"] = round(d["peak_gib"] / o["peak_gib"], 3)
            row["agreement"] = agreement(scores)
            print(json.dumps({k: v for k, v in row.items() if k not in ("contenders",)}), flush=True)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
