"""Retrieval heads of SmolLM2-135M: scores at 2k/4k/8k tokens, then the ablation check.

    PYTHONPATH=. python benchmarks/retrieval_smollm2.py [--lengths 2048 4096 8192] [--n-needles 1]
        [--out benchmarks/results-retrieval.json]

Writes one JSON file: per-head scores with CIs and the control, the top per-length means,
per-example accuracy, the top-5 ablation against 5 random same-layer draws, the overlap with the induction
heads named in the issue, and the share of heads labelled; and beside it a CSV of every head's
mean at every length (`<out>.by_length.csv`). CPU: about an hour on two busy cores per needle.
"""
from __future__ import annotations

import argparse
import json
import time

import headscope
from headscope.detectors.retrieval.scoring import retrieval_scores, validate_retrieval

INDUCTION_TOP = [(18, 6), (17, 4), (17, 3)]  # SmolLM2's top induction heads (golden analysis)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--depths", type=float, nargs="+", default=[0.25, 0.75])
    parser.add_argument("--n-needles", type=int, default=1, help="needle sentences per (length, depth)")
    parser.add_argument("--ablation-needles", type=int, default=1, help="needles per depth of the ablation prompts")
    parser.add_argument("--control-max-len", type=int, default=2048)
    parser.add_argument("--ablation-len", type=int, default=1024)
    parser.add_argument("--out", default="benchmarks/results-retrieval.json")
    args = parser.parse_args()
    loaded = headscope.load("smollm2-135m")
    log = lambda stage, done, total: print(f"{time.strftime('%H:%M:%S')} {stage} {done}/{total}", flush=True)
    started = time.perf_counter()
    result = retrieval_scores(loaded, lengths=args.lengths, depths=args.depths, n_needles=args.n_needles,
                              control_max_len=args.control_max_len, progress=log)
    seconds = time.perf_counter() - started
    top = result.top(10)
    print(top.to_string(index=False), flush=True)
    print(result.examples.to_string(index=False), flush=True)
    labelled = result.scores[result.scores.retrieval]
    out = {
        "meta": result.meta, "seconds_scores": round(seconds, 1),
        "top10": top.to_dict(orient="records"),
        "labelled": [f"{r.layer}.{r.head}" for r in labelled.itertuples()],
        "fraction_labelled": len(labelled) / len(result.scores),
        "at_threshold": int((result.scores.score >= 0.1).sum()),
        "by_length_top": {int(length): part.sort_values("score", ascending=False).head(10).to_dict(orient="records")
                          for length, part in result.by_length.groupby("length")},
        "examples": result.examples.to_dict(orient="records"),
        "induction_overlap": {f"{l}.{h}": bool(((result.scores.layer == l) & (result.scores["head"] == h)
                                                & result.scores.retrieval).any()) for l, h in INDUCTION_TOP},
    }
    json.dump(out, open(args.out, "w"), indent=1, default=float)
    result.by_length.to_csv(args.out.removesuffix(".json") + ".by_length.csv", index=False, float_format="%.6g")
    started = time.perf_counter()
    frame = validate_retrieval(loaded, result, k=5, n_random=5, lengths=(args.ablation_len,), depths=(0.1, 0.5, 0.9),
                               n_needles=args.ablation_needles)
    print(frame.to_string(index=False), frame.attrs, flush=True)
    out["ablation"] = {"rows": frame.to_dict(orient="records"), **frame.attrs,
                       "seconds": round(time.perf_counter() - started, 1)}
    json.dump(out, open(args.out, "w"), indent=1, default=float)


if __name__ == "__main__":
    main()
