"""What `headscope.kv_evaluate` costs against plain forward passes over the same prompts (SmolLM2-135M).

One process, the model loaded once. Each round runs, on the same held-out needle prompt of T
tokens (`headscope.kv.evaluate`'s own, built by `needle_probe`):
- plain: the model's own forward (its default SDPA attention, no headscope), once per condition
  kv_evaluate runs, with the same `logits_to_keep` positions kv_evaluate asks for;
- kv_evaluate: the whole call (keep 0.25, 5 random draws: full, streaming, headscope, reverse and
  5 random conditions = 9 forward passes), its bookkeeping included.
ratio = kv_evaluate's seconds / plain's seconds, per round; the median over rounds is reported
(the issue's bound: at most 1.3). Also per condition kind: one forward under that condition
(`headscope.kv.evaluate._run`) against one plain forward, median over rounds.
Run: `OMP_NUM_THREADS=1 python3 benchmarks/kv_evaluate_cost.py [T] [rounds]`; writes
results-kv-cost.json.
"""
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import headscope  # noqa: E402
from headscope.kv.evaluate import HELD_OUT_NEEDLES, HELD_OUT_QUESTION, _positions, _run, conditions  # noqa: E402
from headscope.probes.needle import needle_probe  # noqa: E402

HERE = Path(__file__).resolve().parent


def main():
    length = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    torch.set_num_threads(1)
    loaded = headscope.load("smollm2-135m")
    policy = headscope.kv_policy(headscope.Analysis.load(HERE / "results-kv-smollm2" / "analysis"), keep=0.25)
    example = needle_probe(loaded.tokenizer, [length], (0.5,), 1, 0, HELD_OUT_NEEDLES, HELD_OUT_QUESTION)[0]
    todo = conditions(policy, (0.25,), 5, 0)
    ids = example.input_ids[None]
    wanted = _positions(example, policy.sink + policy.recent)

    @torch.no_grad()
    def plain():
        return loaded.model(input_ids=ids, logits_to_keep=wanted).logits

    def streaming_of(full):
        return [(int(l), int(h)) for l, h in zip(*np.nonzero(~full))]

    plain()  # warm-up
    _run(loaded, example, streaming_of(todo[2][3]), policy.sink, policy.recent)
    ratios, per_kind = [], {kind: [] for kind in ("full", "streaming", "headscope")}
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in todo:
            plain()
        t_plain = time.perf_counter() - start
        start = time.perf_counter()
        headscope.kv_evaluate(loaded, policy, lengths=(length,), depths=(0.5,), keeps=(0.25,), n_random=5)
        t_eval = time.perf_counter() - start
        ratios.append(t_eval / t_plain)
        seconds.append({"plain": t_plain, "kv_evaluate": t_eval})
        for kind, _, _, full in todo[:3]:  # full, streaming, headscope at 0.25
            start = time.perf_counter()
            plain()
            one_plain = time.perf_counter() - start
            start = time.perf_counter()
            _run(loaded, example, streaming_of(full), policy.sink, policy.recent)
            per_kind[kind].append((time.perf_counter() - start) / one_plain)
        print(seconds[-1], ratios[-1], flush=True)
    result = {"model": "smollm2-135m", "tokens": example.length, "rounds": rounds, "threads": 1,
              "forward_passes_per_call": len(todo), "seconds": seconds, "ratio_median": statistics.median(ratios),
              "ratios": ratios, "per_condition_ratio_median": {k: statistics.median(v) for k, v in per_kind.items()},
              "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    (HERE / "results-kv-cost.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
