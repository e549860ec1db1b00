"""Edge-level circuits of SmolLM2-135M's indirect-object identification (IOI): EAP and EAP-IG.

    python benchmarks/circuit_ioi.py [--n 32] [--random 5] [--no-memory] [--out benchmarks/results-circuit-ioi.json]

For `headscope.task("ioi", tokenizer, n=N)`:
1. `headscope.circuit(method="eap")` and `method="eap-ig"` (5 steps, the default left rule, k =
   0..S-1 as the EAP-IG code computes it), and EAP-IG on the right rule (k = 1..S) for the
   comparison with exact patching: every edge scored; the time and passes of each, checked
   against the budget (eap: 3 forward passes, 1 backward; eap-ig: steps + 2 forward, steps
   backward); the bootstrap stability of the top 1% and 5% of edges (`Circuit.stability`).
2. `Circuit.evaluate` (eap, eap-ig) at MIB's sizes (0.1 ... 100% of edges) with `--random`
   random circuits per size: faithfulness curves, CPR (top edges by signed score) and CMD (top
   edges by |score|) as MIB defines them, the area under f of the |score| circuits beside them
   (`cpr_abs`), against the random circuits', and the seconds per patched run.
3. Exact edge patching on a sample of edges (EAP-IG's top 25 and 35 drawn uniformly from the
   rest): the metric with that one edge corrupted, minus the clean metric, against each method's
   score, both Riemann rules of EAP-IG included (Spearman's rho over the sample).
4. Peak memory: each method's scoring and a plain forward + backward pass over the same prompts
   ("plain": the metric's gradient with respect to the input embeddings; "plain-weights": the
   weights' gradients too, as in training), each in a fresh process: the peak resident set of the whole process (model included) as a
   ratio to the plain pass's, and its growth above the resident set once the model is loaded.
The machine's load average is recorded at the start and the end: timings taken under load are
marked so in docs/circuits.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import headscope
from headscope.atomic import write_text_atomic
from headscope.circuits.faithfulness import area
from headscope.circuits.edges import graph_of
from headscope.circuits.edge_patching import Patched
from headscope.circuits.target import Target

HERE = Path(__file__).resolve().parent
STEPS, N_RANDOM = 5, 5  # EAP-IG's points; random circuits per size


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def resident_mib(field: str = "VmRSS") -> float:
    """The process's resident set now (VmRSS) or its peak (VmHWM), in MiB (Linux). Not getrusage's
    ru_maxrss: Linux carries that across execve, so a child started by a large process reports the
    parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak(mode: str, n: int, batch: int) -> None:
    """One contender in this process; prints its peak resident set and the resident set once the
    model and task are loaded (before the contender runs), in MiB, as JSON."""
    torch.set_grad_enabled(True)
    loaded = headscope.load("smollm2-135m")
    task = headscope.task("ioi", loaded.tokenizer, n=n, seed=0)
    before = resident_mib()
    if mode.startswith("plain"):
        model = loaded.model
        for start in range(0, n, batch):
            rows = task.subset(slice(start, min(n, start + batch)))
            inputs = rows.inputs("clean")
            embedded = model.get_input_embeddings()(inputs.pop("input_ids")).detach().requires_grad_()
            metric = rows.score(model(inputs_embeds=embedded, **inputs, use_cache=False).logits).sum()
            if mode == "plain":  # the gradient of the metric with respect to the input embeddings
                torch.autograd.grad(metric, embedded)
            else:  # the weights' gradients too, as a training step computes them
                metric.backward()
    else:
        headscope.circuit(loaded, task, method=mode, batch_size=batch)
    print(json.dumps({"peak": resident_mib("VmHWM"), "loaded": before}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--random", type=int, default=N_RANDOM, help="random circuits per size")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory stage")
    parser.add_argument("--methods", default="eap,eap-ig,eap-ig-right",
                        help="the methods scored (eap, eap-ig, eap-ig-right: EAP-IG on the right rule, not evaluated)")
    parser.add_argument("--evaluate", default="eap,eap-ig", help="the methods whose circuits are evaluated")
    parser.add_argument("--add", action="store_true",
                        help="add to the results already in --out (methods run before are kept, the exact sample "
                             "scores every method of the file whose scores were saved)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sample", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE / "results-circuit-ioi.json")
    parser.add_argument("--memory-only", action="store_true", help="rerun the peak-memory stage only")
    parser.add_argument("--peak", choices=["plain", "plain-weights", "eap", "eap-ig"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak:
        return peak(args.peak, args.n, args.batch)
    if args.memory_only:  # the memory stage again, into the results already there
        return memory(args, json.loads(args.out.read_text()))
    loaded = headscope.load("smollm2-135m")
    task = headscope.task("ioi", loaded.tokenizer, n=args.n, seed=0)
    result = {"model": "smollm2-135m", "task": "ioi", "n": task.n, "batch": args.batch, "steps": STEPS,
              "torch_threads": torch.get_num_threads(), "load_average_start": os.getloadavg(), "methods": {}}
    if args.add and args.out.is_file():
        result = json.loads(args.out.read_text())
        result.setdefault("load_average_more", []).append(os.getloadavg())
    found = {}
    for method in args.methods.split(","):
        start = time.perf_counter()
        found[method] = headscope.circuit(loaded, task, method=method.removesuffix("-right"), steps=STEPS,
                                          batch_size=args.batch, riemann="right" if method.endswith("right") else "left")
        seconds = time.perf_counter() - start
        passes = found[method].meta["passes"]
        steps = 1 if method == "eap" else STEPS
        entry = result["methods"][method] = {
            "seconds": seconds, "passes": passes, "riemann": found[method].meta["riemann"],
            "passes_within_budget": passes["forward"] <= steps + 2 and passes["backward"] <= steps,
            "n_edges": found[method].meta["n_edges"],
            "stability": found[method].stability(n_boot=100).to_dict(orient="records"),
            "top10": [f"{r.src}->{r.dst} {r.score:+.4f}" for r in found[method].top(10).itertuples()]}
        if method in args.evaluate.split(","):
            start = time.perf_counter()
            table = found[method].evaluate(n_random=args.random, seed=0, batch_size=args.batch)
            evaluate_seconds = time.perf_counter() - start
            runs = 2 + len(table) * (2 + args.random)  # at most: everything, nothing, two circuits and the draws a size
            entry.update({
                "evaluate_seconds": evaluate_seconds, "patched_runs_at_most": runs, "n_random": args.random,
                "seconds_per_patched_run_at_least": evaluate_seconds / runs, "curve": table.to_dict(orient="records"),
                **{k: float(v) for k, v in table.attrs.items() if isinstance(v, (int, float))},
                "cpr_abs": area(table["size"], table.faithfulness_abs)})
        print(method, json.dumps({k: v for k, v in result["methods"][method].items() if k != "curve"}), flush=True)
        save(args.out, result)  # each stage as it ends: a long run that stops keeps what it measured
    # Exact edge patching on a sample: EAP-IG's top edges and uniform draws from the rest.
    target = Target(loaded, task)
    graph = graph_of(target, task)
    scores = found["eap-ig"].edges.score.to_numpy()
    order = np.argsort(-np.abs(scores), kind="stable")
    rng = np.random.default_rng(0)
    top = 25
    sample = list(order[:top]) + list(rng.choice(order[top:], size=args.sample - top, replace=False))
    everything = np.ones(len(scores), dtype=bool)
    patched = Patched(target, graph, task, args.batch)
    clean = patched.metric(everything)
    start = time.perf_counter()
    exact = []
    for index in sample:
        kept = everything.copy()
        kept[index] = False
        exact.append(patched.metric(kept) - clean)
    result["exact_sample"] = {
        "seconds": time.perf_counter() - start, "edges": [f"{found['eap-ig'].edges.src[i]}->{found['eap-ig'].edges.dst[i]}"
                                                             for i in sample],
        "exact": exact, **{f"spearman_{m}": spearman(found[m].edges.score.to_numpy()[sample], exact)
                          for m in found},
        **{f"spearman_{m}_top": spearman(found[m].edges.score.to_numpy()[sample[:top]], exact[:top]) for m in found}}
    print(json.dumps({k: v for k, v in result["exact_sample"].items() if k.startswith("spearman")}), flush=True)
    save(args.out, result)
    if not args.no_memory:
        memory(args, result)


def memory(args, result: dict) -> None:
    """Peak memory, each contender in a fresh process; saved into `result` and `args.out`."""
    result["peak_mib"], result["loaded_mib"] = {}, {}
    for mode in ("plain", "plain-weights", "eap", "eap-ig"):
        out = subprocess.run([sys.executable, __file__, "--peak", mode, "--n", str(args.n), "--batch", str(args.batch)],
                             capture_output=True, text=True, check=True)
        measured = json.loads(out.stdout.strip().splitlines()[-1])
        result["peak_mib"][mode], result["loaded_mib"][mode] = measured["peak"], measured["loaded"]
    growth = {m: result["peak_mib"][m] - result["loaded_mib"][m] for m in result["peak_mib"]}
    result["peak_ratio"] = {f"{m}/{p}": result["peak_mib"][m] / result["peak_mib"][p]
                            for m in ("eap", "eap-ig") for p in ("plain", "plain-weights")}
    result["growth_ratio"] = {f"{m}/{p}": growth[m] / growth[p]  # above the loaded model
                              for m in ("eap", "eap-ig") for p in ("plain", "plain-weights")}
    print(json.dumps(result["peak_mib"]), json.dumps(result["peak_ratio"]), json.dumps(result["growth_ratio"]))
    result["load_average_end"] = os.getloadavg()
    save(args.out, result)


def save(path: Path, result: dict) -> None:
    write_text_atomic(path, json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
