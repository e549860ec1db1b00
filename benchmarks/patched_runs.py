"""One patched run (the runs behind `Circuit.evaluate`) against a plain forward of the same batch.

    python benchmarks/patched_runs.py [--n 8] [--threads 1] [--repeat 3] [--out benchmarks/results-patched-runs.json]

SmolLM2-135M on `headscope.task("ioi", n=N)` in one batch: two `Patched` objects in one process,
one taking heads' q, k and v by projection columns (the default) and one forced to run every head
block on its copies; each measures random circuits keeping 0.1%, 10% and 99% of the edges, in
turn with a plain forward of the batch (`--repeat` times, the fastest of each kept), so that load
moves all three alike. Both must give the same metric. One thread by default (a second process on the machine makes two threads noise).
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = headscope.load("smollm2-135m")
    task = headscope.task("ioi", loaded.tokenizer, n=args.n, seed=0)
    target = Target(loaded, task)
    graph = graph_of(target, task)
    columns, copies = Patched(target, graph, task, args.n), Patched(target, graph, task, args.n)
    copies.head_plans = {}
    empty = np.zeros(columns.n_edges, dtype=bool)
    columns.metric(empty), copies.metric(empty)  # the corrupted senders cached, the columns found
    inputs, _ = target.inputs(task, "clean")
    rng = np.random.default_rng(0)
    result = {"n": args.n, "threads": args.threads, "repeat": args.repeat, "load_average_start": os.getloadavg(), "runs": []}
    for share in (0.001, 0.1, 0.99):
        kept = np.zeros(columns.n_edges, dtype=bool)
        kept[rng.choice(columns.n_edges, int(columns.n_edges * share), replace=False)] = True
        plain = seconds_columns = seconds_copies = float("inf")
        for _ in range(args.repeat):  # in turn, the fastest of each kept
            with torch.no_grad():
                started = time.perf_counter()
                loaded.model(**inputs, use_cache=False)
                plain = min(plain, time.perf_counter() - started)
            started = time.perf_counter()
            by_columns = columns.metric(kept)
            seconds_columns = min(seconds_columns, time.perf_counter() - started)
            started = time.perf_counter()
            by_copies = copies.metric(kept)
            seconds_copies = min(seconds_copies, time.perf_counter() - started)
        run = {"kept": share, "plain": plain, "columns": seconds_columns, "copies": seconds_copies,
               "columns_ratio": seconds_columns / plain, "copies_ratio": seconds_copies / plain,
               "metric_columns": by_columns, "metric_copies": by_copies}
        result["runs"].append(run)
        print(json.dumps(run), flush=True)
    result["load_average_end"] = os.getloadavg()
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
