"""AtP and AtP* against exact patching on SmolLM2-135M's indirect-object identification (IOI).

Builds `headscope.task("ioi", tokenizer, n=N)`, runs `headscope.attribute` with method "exact",
"atp" and "atp*" at hook_z (denoising: clean into the ABC-corrupted prompts) over all 270 heads,
and records, against exact patching:
- Spearman's rho of the effects (AtP's signed effect; AtP*'s GradDrop magnitude against |exact|);
- how many of exact patching's top 10 and top 20 heads (by |effect|) each method puts in its own
  top 10 and top 20 (AtP by |effect|, AtP* by its magnitude), and the heads it misses;
- the time of each method in this process (the cost ratio atp / exact and atp* / exact) and
  the passes each spent.

    python benchmarks/attribution_ioi.py [--n 64] [--out benchmarks/results-attribution-ioi.json]

Run it on a quiet machine (the times are ratios within one process, but a loaded machine blurs them).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import headscope


def _ranks(values: torch.Tensor) -> torch.Tensor:
    order = values.argsort()
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(len(values), dtype=values.dtype)
    return ranks


def spearman(a, b) -> float:
    """Spearman's rho (no ties expected in continuous effects)."""
    ra, rb = _ranks(torch.as_tensor(a, dtype=torch.float64)), _ranks(torch.as_tensor(b, dtype=torch.float64))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def top(frame, column: str, k: int) -> list:
    ranked = frame.reindex(frame[column].abs().sort_values(ascending=False).index)
    return [f"{int(r.layer)}.{int(r.head)}" for r in ranked.head(k).itertuples()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results-attribution-ioi.json")
    args = parser.parse_args()
    torch.set_grad_enabled(True)
    loaded = headscope.load("smollm2-135m")
    task = headscope.task("ioi", loaded.tokenizer, n=args.n, seed=args.seed)
    tables, seconds = {}, {}
    for method in ("atp", "atp*", "exact"):
        start = time.perf_counter()
        tables[method] = headscope.attribute(loaded, task, method=method, point="z", batch_size=16)
        seconds[method] = time.perf_counter() - start
        print(f"{method}: {seconds[method]:.1f} s", flush=True)
    exact = tables["exact"]
    result = {"model": "smollm2-135m", "task": "ioi", "n": task.n, "seed": args.seed, "point": "z",
              "direction": "denoising", "clean_metric": exact.attrs["clean_metric"],
              "corrupted_metric": exact.attrs["corrupted_metric"], "seconds": seconds,
              "cost_ratio": {m: seconds[m] / seconds["exact"] for m in ("atp", "atp*")},
              "passes": {m: t.attrs["passes"] for m, t in tables.items()},
              "exact_top20": top(exact, "effect", 20), "methods": {}}
    for method, column in (("atp", "effect"), ("atp*", "magnitude")):
        frame = tables[method]
        estimate = frame[column].values
        truth = exact.effect.values if column == "effect" else abs(exact.effect.values)
        entry = {"spearman": spearman(estimate, truth),
                 "spearman_abs": spearman(abs(frame[column].values), abs(exact.effect.values))}
        for k in (10, 20):
            mine, theirs = top(frame, column, k), top(exact, "effect", k)
            entry[f"top{k}_found"] = len(set(mine) & set(theirs))
            entry[f"top{k}_missed"] = [h for h in theirs if h not in mine]
        result["methods"][method] = entry
    result["effects"] = {f"{int(r.layer)}.{int(r.head)}": {m: float(tables[m].effect[i]) for m in tables}
                         | {"atp*_magnitude": float(tables["atp*"].magnitude[i])}
                         for i, r in enumerate(exact.itertuples())}
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "effects"}, indent=1))


if __name__ == "__main__":
    main()
