"""Does EAP-IG's default of 5 steps converge? SmolLM2-135M on IOI, and the planted model.

    python benchmarks/circuit_steps.py [--n 8] [--steps 5 10 20] [--out benchmarks/results-circuit-steps.json]

EAP-IG (Hanna et al. 2024) approximates an integral along the path from the corrupted to the
clean embeddings by a right Riemann sum of `steps` points (docs/circuits.md). For each number of
steps this scores every edge of SmolLM2-135M on `headscope.task("ioi", n=N, seed=0)` and, for the
planted model of the tests, `induction-keys` (n=6), then compares each run with the run at the
most steps: Spearman's rho over all edges, the overlap of the top 100 edges (top 5 on the
planted model), and the median relative change of the top 100 edges' scores.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import headscope
from headscope.atomic import write_text_atomic

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from circuit_ioi import spearman  # noqa: E402


def compare(runs: dict, top: int) -> dict:
    """Each run against the one at the most steps."""
    last = max(runs)
    reference = runs[last]
    best = set(reference.abs().sort_values(ascending=False).index[:top])
    out = {}
    for steps, scores in runs.items():
        scores = scores.reindex(reference.index)
        mine = set(scores.abs().sort_values(ascending=False).index[:top])
        ref_top = reference.loc[list(best)]
        change = ((scores.loc[list(best)] - ref_top).abs() / ref_top.abs()).median()
        out[str(steps)] = {"spearman_vs_" + str(last): round(spearman(scores.values, reference.values), 4),
                           f"top{top}_overlap": len(mine & best) / top,
                           f"median_relative_change_top{top}": round(float(change), 4)}
    return out


def scored(loaded, task, steps_list, batch) -> tuple[dict, dict]:
    runs, seconds = {}, {}
    for steps in steps_list:
        start = time.perf_counter()
        found = headscope.circuit(loaded, task, method="eap-ig", steps=steps, batch_size=batch)
        seconds[str(steps)] = round(time.perf_counter() - start, 1)
        runs[steps] = found.edges.assign(edge=found.edges.src + "->" + found.edges.dst).set_index("edge").score
        print(task.name, steps, seconds[str(steps)], "s", flush=True)
    return runs, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--out", type=Path, default=HERE / "results-circuit-steps.json")
    args = parser.parse_args()
    result = {"load_average_start": os.getloadavg(), "steps": args.steps}
    from tests.support.planted import save_planted

    with tempfile.TemporaryDirectory() as work:
        planted = headscope.load(str(save_planted(Path(work) / "planted")), device="cpu")
        runs, seconds = scored(planted, headscope.task("induction-keys", planted.tokenizer, n=6, seed=0),
                               sorted(set(args.steps) | {1, 3, 40}), 6)
        result["planted induction-keys"] = {"seconds": seconds, "compare": compare(runs, 5),
                                            "key_edge": {str(s): round(float(r["a0.h0->a1.h0.k"]), 3)
                                                         for s, r in runs.items()}}
    print(json.dumps(result["planted induction-keys"]), flush=True)
    loaded = headscope.load("smollm2-135m", device="cpu")
    runs, seconds = scored(loaded, headscope.task("ioi", loaded.tokenizer, n=args.n, seed=0), args.steps, args.n)
    result["smollm2 ioi"] = {"n": args.n, "n_edges": int(len(next(iter(runs.values())))), "seconds": seconds,
                             "compare": compare(runs, 100)}
    print(json.dumps(result["smollm2 ioi"]), flush=True)
    result["load_average_end"] = os.getloadavg()
    write_text_atomic(args.out, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
