"""The default `Circuit.evaluate` on SmolLM2-135M's IOI circuit: its total time, this checkout against another.

    python benchmarks/evaluation_time.py [--n 8] [--headscope /path/to/other/checkout --label before]

Each contender runs in a fresh process with the checkout's headscope on PYTHONPATH: it loads the
model, builds `headscope.task("ioi", tokenizer, n=N, seed=0)`, finds the EAP circuit
(`headscope.circuit(method="eap")`, not timed) and then times `circuit.evaluate()` with its
defaults (MIB's 10 sizes, 5 random circuits per size, the default batch size), the whole
evaluation as a user runs it: the empty and full circuits' runs, the method's circuits and the
random ones. Also recorded: the circuits measured (`patched_runs`) and the passes over the
prompts that measured them (`passes`; several circuits share a pass where the batch size holds
several copies of the prompts), a plain forward of the same prompts in the
same process (seconds), and the curve (faithfulness per size), which both checkouts must give
alike. One JSON line per contender is added to --out (results-evaluation-time.jsonl).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import json, time, torch
import headscope
from headscope.circuits import edge_patching
loaded = headscope.load("smollm2-135m")
task = headscope.task("ioi", loaded.tokenizer, n={n}, seed=0)
circuit = headscope.circuit(loaded, task, method="eap")
runs, passes = [], []
counted = "metrics" if hasattr(edge_patching.Patched, "metrics") else "metric"  # (older checkouts: a circuit a call)
own = getattr(edge_patching.Patched, counted)
def counting(self, kept):
    runs.extend([1] * (len(kept) if counted == "metrics" else 1))
    passes.append(1)
    return own(self, kept)
setattr(edge_patching.Patched, counted, counting)
from headscope.circuits.target import Target
inputs, _ = Target(loaded, task).inputs(task, "clean")
with torch.no_grad():
    loaded.model(**inputs, use_cache=False)
    started = time.perf_counter()
    loaded.model(**inputs, use_cache=False)
    forward = time.perf_counter() - started
started = time.perf_counter()
table = circuit.evaluate()
seconds = time.perf_counter() - started
print(json.dumps({{"seconds": seconds, "patched_runs": len(runs), "passes": len(passes), "forward_seconds": forward,
                  "faithfulness": [round(float(f), 6) for f in table["faithfulness"]],
                  "sizes": [float(s) for s in table["size"]]}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="IOI prompts")
    parser.add_argument("--headscope", type=Path, default=HERE.parent, help="the checkout whose headscope runs")
    parser.add_argument("--label", default="", help="what the run is called in --out (e.g. before, after)")
    parser.add_argument("--out", type=Path, default=HERE / "results-evaluation-time.jsonl")
    args = parser.parse_args()
    checkout = args.headscope.resolve()
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()
    out = subprocess.run([sys.executable, "-c", CHILD.format(n=args.n)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(checkout)},
                         cwd=checkout)  # (`-c` puts the working folder first on the path, before PYTHONPATH)
    if out.returncode:
        raise SystemExit(f"the evaluation failed:\n{out.stderr[-3000:]}")
    row = {"date": time.strftime("%Y-%m-%d %H:%M"), "label": args.label, "commit": commit, "n": args.n,
           "load_average": [round(load[0], 2), round(os.getloadavg()[0], 2)],
           **json.loads(out.stdout.strip().splitlines()[-1])}
    print(f"{args.label or commit}: evaluate {row['seconds']:.1f} s, {row['patched_runs']} patched runs "
          f"in {row['passes']} passes ({row['seconds'] / max(1, row['patched_runs']):.2f} s a circuit; a plain forward "
          f"{row['forward_seconds']:.2f} s)")
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
