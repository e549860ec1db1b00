"""Circuits of SmolLM2-135M's IOI in bfloat16 and float16 against float32.

    python benchmarks/circuit_dtypes.py [--n 32] [--methods eap,eap-ig] [--out benchmarks/results-circuit-dtypes.json]

For `headscope.task("ioi", tokenizer, n=N, seed=0)` and the model loaded in each dtype
(`headscope.load("smollm2-135m", dtype=...)`, the same GGUF weights rounded to the dtype):
- every edge's score of `headscope.circuit(method=...)` (EAP; EAP-IG with 5 steps, left rule),
  against float32's: Spearman's rho over all edges, the overlap of the top 100 edges by |score|
  (shared / 100), and the largest |difference| as a share of float32's largest |score|;
- each head's direct logit attribution (`headscope.logit_attribution`) and AtP effect
  (`headscope.attribute`), against float32's: Spearman's rho and the largest |difference|;
- the seconds each took (on CPUs bfloat16 matmuls may be slower than float32's: the point here is
  agreement, not speed), with the load average at the start and the end.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import headscope
from circuit_ioi import spearman  # the benchmarks' folder is on the path when one runs as a script
from headscope.atomic import write_text_atomic

HERE = Path(__file__).resolve().parent
DTYPES = ("float32", "bfloat16", "float16")
STEPS, TOP = 5, 100


def agreement(reference: np.ndarray, other: np.ndarray, top: int = 0) -> dict:
    row = {"spearman": spearman(reference, other),
           "max_abs_diff_share": float(np.abs(reference - other).max() / np.abs(reference).max())}
    if top:
        best = lambda x: set(np.argsort(-np.abs(x))[:top].tolist())  # noqa: E731
        row[f"top{top}_overlap"] = len(best(reference) & best(other)) / top
    return row


def run(dtype: str, n: int, methods: list, batch: int) -> dict:
    loaded = headscope.load("smollm2-135m", device="cpu", dtype=dtype)
    task = headscope.task("ioi", loaded.tokenizer, n=n, seed=0)
    out: dict = {"seconds": {}}
    for method in methods:
        start = time.perf_counter()
        found = headscope.circuit(loaded, task, method=method, steps=STEPS, batch_size=batch)
        out["seconds"][method] = time.perf_counter() - start
        out[method] = dict(zip(found.edges.src + "->" + found.edges.dst, found.edges.score.astype(float)))
    start = time.perf_counter()
    dla = headscope.logit_attribution(loaded, task, n_resamples=100)
    out["seconds"]["dla"] = time.perf_counter() - start
    heads = dla[dla.kind == "head"]
    out["dla"] = {f"{r.layer}.{r.head}": float(r.effect) for r in heads.itertuples()}
    start = time.perf_counter()
    atp = headscope.attribute(loaded, task, method="atp", n_resamples=100, batch_size=batch)
    out["seconds"]["atp"] = time.perf_counter() - start
    out["atp"] = {f"{r.layer}.{r.head}": float(r.effect) for r in atp.itertuples()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--methods", default="eap,eap-ig")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "results-circuit-dtypes.json")
    args = parser.parse_args()
    methods = args.methods.split(",")
    result = {"n": args.n, "steps": STEPS, "load_average_start": os.getloadavg(), "dtypes": {}}
    runs = {dtype: run(dtype, args.n, methods, args.batch) for dtype in args.dtypes.split(",")}
    reference = runs["float32"]
    for dtype, measured in runs.items():
        row: dict = {"seconds": measured["seconds"]}
        for what in methods + ["dla", "atp"]:
            keys = sorted(reference[what])
            assert set(keys) == set(measured[what]), (dtype, what)
            ours = np.array([measured[what][k] for k in keys])
            theirs = np.array([reference[what][k] for k in keys])
            row[what] = agreement(theirs, ours, TOP if what in methods else 0)
        result["dtypes"][dtype] = row
    result["load_average_end"] = os.getloadavg()
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps({d: {k: v for k, v in r.items() if k != "seconds"} for d, r in result["dtypes"].items()}, indent=1))


if __name__ == "__main__":
    main()
