"""One patched run (the runs behind `Circuit.evaluate`) against a plain forward of the same batch.

    python benchmarks/patched_runs.py [--n 8] [--threads 1] [--repeat 3] [--out benchmarks/results-patched-runs.json]
    python benchmarks/patched_runs.py --model benchmarks/gpu-model --device cuda --dtype bfloat16   # on a GPU

SmolLM2-135M on `headscope.task("ioi", n=N)` in one batch: two `Patched` objects in one process,
one taking heads' q, k and v by projection columns (the default) and one forced to run every head
block on its copies; each measures random circuits keeping 0.1%, 10% and 99% of the edges, in
turn with a plain forward of the batch (`--repeat` times, the fastest of each kept), so that load
moves all three alike. Both must give the same metric. One thread by default (a second process on the machine makes two threads noise).
On CUDA each timing waits for the device (`torch.cuda.synchronize`); `--model` takes a folder of
SmolLM2's shape (`benchmarks/gpu_model.py`), `--shares` the kept fractions, `--no-copies` skips
the second contender. `--together K` (default 2) adds a third: K circuits of the same share
(the first and K - 1 more random draws) measured in one pass (`Patched.metrics`, as `evaluate`
runs them where its batch size holds K copies of the prompts), its time per circuit against the
plain forward of the N prompts; its first circuit's metric must be the default's.
`--module-norm` adds a contender whose head blocks run their norm as a module on every copy
(`Patched.norms = None`) instead of inside the projection columns.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

import headscope
from headscope.circuits.edge_patching import Patched
from headscope.circuits.edges import graph_of
from headscope.circuits.target import Target

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, in turn; the fastest kept")
    parser.add_argument("--out", type=Path, default=HERE / "results-patched-runs.json")
    parser.add_argument("--model", default="smollm2-135m", help="an alias or a model folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: the model's)")
    parser.add_argument("--shares", default="0.001,0.1,0.99", help="kept fractions of the edges, comma-separated")
    parser.add_argument("--no-copies", action="store_true", help="time the default (projection columns) only")
    parser.add_argument("--module-norm", action="store_true", help="also time the norm run as a module on each copy")
    parser.add_argument("--together", type=int, default=2, help="circuits a pass for the side-by-side contender "
                                                                "(1: not timed)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = headscope.load(args.model, device=args.device, dtype=args.dtype)

    def now() -> float:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    task = headscope.task("ioi", loaded.tokenizer, n=args.n, seed=0)
    target = Target(loaded, task)
    graph = graph_of(target, task)
    columns = Patched(target, graph, task, args.n)
    copies = None if args.no_copies else Patched(target, graph, task, args.n)
    module_norm = None
    if args.module_norm:
        module_norm = Patched(target, graph, task, args.n)
        module_norm.norms = None
    empty = np.zeros(columns.n_edges, dtype=bool)
    columns.metric(empty)  # the corrupted senders cached, the columns found
    if module_norm is not None:
        module_norm.metric(empty)
    if copies is not None:
        copies.head_plans = {}
        copies.metric(empty)
    inputs, _ = target.inputs(task, "clean")
    rng = np.random.default_rng(0)
    result = {"n": args.n, "threads": args.threads, "repeat": args.repeat, "model": args.model, "device": args.device,
              "dtype": str(next(loaded.model.parameters()).dtype), "load_average_start": os.getloadavg(), "runs": []}
    for share in (float(x) for x in args.shares.split(",")):
        kept = np.zeros(columns.n_edges, dtype=bool)
        kept[rng.choice(columns.n_edges, int(columns.n_edges * share), replace=False)] = True
        others = []
        for _ in range(args.together - 1):
            more = np.zeros(columns.n_edges, dtype=bool)
            more[rng.choice(columns.n_edges, int(columns.n_edges * share), replace=False)] = True
            others.append(more)
        plain = seconds_columns = seconds_copies = seconds_side = seconds_module = float("inf")
        side = by_module = None
        by_copies = None
        for _ in range(args.repeat):  # in turn, the fastest of each kept
            with torch.no_grad():
                started = now()
                loaded.model(**inputs, use_cache=False)
                plain = min(plain, now() - started)
            started = now()
            by_columns = columns.metric(kept)
            seconds_columns = min(seconds_columns, now() - started)
            if copies is not None:
                started = now()
                by_copies = copies.metric(kept)
                seconds_copies = min(seconds_copies, now() - started)
            if module_norm is not None:
                started = now()
                by_module = module_norm.metric(kept)
                seconds_module = min(seconds_module, now() - started)
            if others:
                started = now()
                side = columns.metrics([kept, *others])
                seconds_side = min(seconds_side, now() - started)
        run = {"kept": share, "plain": plain, "columns": seconds_columns, "columns_ratio": seconds_columns / plain,
               "metric_columns": by_columns}
        if copies is not None:
            run.update(copies=seconds_copies, copies_ratio=seconds_copies / plain, metric_copies=by_copies)
        if by_module is not None:
            run.update(module_norm=seconds_module, module_norm_ratio=seconds_module / plain, metric_module_norm=by_module)
        if side is not None:
            each = seconds_side / args.together
            run.update(together=args.together, side_by_side_per_circuit=each, side_by_side_ratio=each / plain,
                       metric_side_by_side=side[0])
        result["runs"].append(run)
        print(json.dumps(run), flush=True)
    result["load_average_end"] = os.getloadavg()
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
