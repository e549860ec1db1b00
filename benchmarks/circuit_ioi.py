"""Edge-level circuits of SmolLM2-135M's indirect-object identification (IOI): EAP and EAP-IG.

    python benchmarks/circuit_ioi.py [--n 32] [--out benchmarks/results-circuit-ioi.json]

For `headscope.task("ioi", tokenizer, n=N)`:
1. `headscope.circuit(method="eap")` and `method="eap-ig"` (5 steps): every edge scored; the time
   and passes of each.
2. `Circuit.evaluate` at MIB's sizes (0.1 ... 100% of edges) with 5 random circuits per size:
   faithfulness curves, CPR and CMD of each method against the random circuits'.
3. Exact edge patching on a sample of edges (EAP-IG's top 25 and 35 drawn uniformly from the
   rest): the metric with that one edge corrupted, minus the clean metric, against each method's
   score (Spearman's rho over the sample).
4. Peak memory: each method's scoring and a plain forward + backward pass over the same prompts,
   each in a fresh process (peak resident set of the whole process), as a ratio.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import headscope
from headscope.circuits.eap import _metric_with
from headscope.circuits.edges import graph_of
from headscope.circuits.running import Target

HERE = Path(__file__).resolve().parent


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def peak(mode: str, n: int, batch: int) -> None:
    """One contender in this process; prints its peak resident set in MiB."""
    torch.set_grad_enabled(True)
    loaded = headscope.load("smollm2-135m")
    task = headscope.task("ioi", loaded.tokenizer, n=n, seed=0)
    if mode == "plain":
        for start in range(0, n, batch):
            rows = task.subset(slice(start, min(n, start + batch)))
            logits = loaded.model(**rows.inputs("clean"), use_cache=False).logits
            rows.score(logits).sum().backward()
    else:
        headscope.circuit(loaded, task, method=mode, batch_size=batch)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sample", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE / "results-circuit-ioi.json")
    parser.add_argument("--peak", choices=["plain", "eap", "eap-ig"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak:
        return peak(args.peak, args.n, args.batch)
    loaded = headscope.load("smollm2-135m")
    task = headscope.task("ioi", loaded.tokenizer, n=args.n, seed=0)
    result = {"model": "smollm2-135m", "task": "ioi", "n": task.n, "batch": args.batch, "methods": {}}
    found = {}
    for method in ("eap", "eap-ig"):
        start = time.perf_counter()
        found[method] = headscope.circuit(loaded, task, method=method, steps=5, batch_size=args.batch)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        table = found[method].evaluate(n_random=5, seed=0, batch_size=args.batch)
        result["methods"][method] = {
            "seconds": seconds, "evaluate_seconds": time.perf_counter() - start, "passes": found[method].meta["passes"],
            "n_edges": found[method].meta["n_edges"], "curve": table.to_dict(orient="records"),
            **{k: float(v) for k, v in table.attrs.items() if isinstance(v, (int, float))},
            "top10": [f"{r.src}->{r.dst} {r.score:+.4f}" for r in found[method].top(10).itertuples()]}
        print(method, json.dumps({k: v for k, v in result["methods"][method].items() if k != "curve"}), flush=True)
    # Exact edge patching on a sample: EAP-IG's top edges and uniform draws from the rest.
    target = Target(loaded, task)
    graph = graph_of(target, task)
    scores = found["eap-ig"].edges.score.to_numpy()
    order = np.argsort(-np.abs(scores), kind="stable")
    rng = np.random.default_rng(0)
    top = 25
    sample = list(order[:top]) + list(rng.choice(order[top:], size=args.sample - top, replace=False))
    everything = np.ones(len(scores), dtype=bool)
    clean = _metric_with(target, graph, task, everything, args.batch)
    start = time.perf_counter()
    exact = []
    for index in sample:
        kept = everything.copy()
        kept[index] = False
        exact.append(_metric_with(target, graph, task, kept, args.batch) - clean)
    result["exact_sample"] = {
        "seconds": time.perf_counter() - start, "edges": [f"{found['eap-ig'].edges.src[i]}->{found['eap-ig'].edges.dst[i]}"
                                                             for i in sample],
        "exact": exact, **{f"spearman_{m}": spearman(found[m].edges.score.to_numpy()[sample], exact)
                          for m in found},
        **{f"spearman_{m}_top": spearman(found[m].edges.score.to_numpy()[sample[:top]], exact[:top]) for m in found}}
    print(json.dumps({k: v for k, v in result["exact_sample"].items() if k.startswith("spearman")}), flush=True)
    # Peak memory, each contender in a fresh process.
    result["peak_mib"] = {}
    for mode in ("plain", "eap", "eap-ig"):
        out = subprocess.run([sys.executable, __file__, "--peak", mode, "--n", str(args.n), "--batch", str(args.batch)],
                             capture_output=True, text=True, check=True)
        result["peak_mib"][mode] = float(out.stdout.strip().splitlines()[-1])
    result["peak_ratio"] = {m: result["peak_mib"][m] / result["peak_mib"]["plain"] for m in ("eap", "eap-ig")}
    print(json.dumps(result["peak_mib"]), json.dumps(result["peak_ratio"]))
    args.out.write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
