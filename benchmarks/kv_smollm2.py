"""SmolLM2-135M: a KV-cache policy from headscope's retrieval scores, measured at 4k and 8k tokens.

1. Rank: `headscope.analyze` with the retrieval detector on its own needle prompts (2048 tokens,
   depths 0.25 and 0.75, 2 needles: 4 prompts), plus induction and duplicate_token (the razor
   ranking); saved to `results-kv-smollm2/analysis`.
2. Policy: `headscope.kv_policy(analysis, keep=0.25)` (sink 16, recent 64, the small-model
   default), exported as DuoAttention's folder and HeadKV's JSON (`results-kv-smollm2/policy-*`).
3. Evaluate: `headscope.kv_evaluate` at 4096 and 8192 tokens, one held-out needle prompt per
   length (depth 0.5), keep 0.1 / 0.25 / 0.5, 5 random draws each; `results-kv-smollm2/eval`.
Run from the repository root: `OMP_NUM_THREADS=1 python3 benchmarks/kv_smollm2.py`.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import headscope  # noqa: E402
from headscope.kv import write_duo, write_headkv  # noqa: E402
from headscope.probes.kinds import NeedleProbe  # noqa: E402

OUT = Path(__file__).resolve().parent / "results-kv-smollm2"
LENGTHS = tuple(int(n) for n in os.environ.get("KV_LENGTHS", "4096,8192").split(","))


def main():
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    OUT.mkdir(exist_ok=True)
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    loaded = headscope.load("smollm2-135m")
    start = time.time()
    if (OUT / "analysis" / "meta.json").is_file() and os.environ.get("KV_REUSE_ANALYSIS"):
        analysis = headscope.Analysis.load(OUT / "analysis")  # the ranking of an earlier run of this script
        seconds_rank = analysis.meta["timings"]["total"]
    else:
        analysis = headscope.analyze(loaded, ["retrieval", "induction", "duplicate_token"],
                                     [NeedleProbe(lengths=(2048,), depths=(0.25, 0.75), n_needles=2)], ov=False)
        analysis.save(OUT / "analysis", force=True)
        seconds_rank = time.time() - start
    print(f"ranking analysis {seconds_rank:.0f} s", flush=True)
    policy = headscope.kv_policy(analysis, keep=0.25)
    write_duo(policy, OUT / "policy-duo", force=True)
    write_headkv(policy, OUT / "policy-headkv.json")
    start = time.time()

    def progress(stage, done, total):
        print(f"{time.strftime('%H:%M:%S')} {stage} {done}/{total}", flush=True)

    evaluation = headscope.kv_evaluate(loaded, policy, lengths=LENGTHS, depths=(0.5,), n_needles=1, n_random=5,
                                       progress=progress)
    seconds_eval = time.time() - start
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    evaluation.meta.update({"seconds_rank": seconds_rank, "seconds_eval": seconds_eval, "threads": torch.get_num_threads(),
                            "uptime_before": load_before, "uptime_after": load_after})
    raw = OUT / "raw"
    raw.mkdir(exist_ok=True)
    evaluation.table.to_csv(raw / "results.csv", index=False)
    evaluation.examples.to_csv(raw / "examples.csv", index=False)
    (raw / "meta.json").write_text(json.dumps(evaluation.meta, indent=1))
    evaluation.save(OUT / "eval", force=True)
    print(evaluation.summary().T.to_string(), flush=True)


if __name__ == "__main__":
    main()
