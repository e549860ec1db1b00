"""Cold start of the bundled SmolLM2-135M: loading, with and without the load cache.

    python benchmarks/bench_load.py                 # 2 rounds of loads, then analyze before/after
    python benchmarks/bench_load.py --rounds 3 --skip-analyze
    python benchmarks/bench_load.py --fresh 5       # warm loads in fresh processes, imports apart

In one process, after importing torch and transformers once, each round times:
- `transformers`: transformers' own GGUF loading, what `headscope.load` did before the cache
  (AutoConfig, AutoModelForCausalLM and AutoTokenizer, each with `gguf_file=`);
- `no_cache`: `headscope.load("smollm2-135m", cache=False)` (one metadata decode, no cache);
- `first`: `headscope.load` on an empty cache (converts and writes the entry);
- `second`: `headscope.load` again (reads the entry).
Each round uses a new empty cache folder. Times are medians over rounds; the ratios are medians of
each round's ratio. Then `headscope analyze` (default arguments, --device cpu) runs as a
subprocess --analyze-rounds times each with --no-cache (before) and with a warm cache (after),
alternating; that wall time includes the interpreter start and imports. Results are appended as
one JSON line to --out.

`--fresh N` instead times a warm load (the entry already in the cache) in N fresh processes,
alternating two kinds: `whole`, `headscope.load` as a user's first call (it imports
transformers' Llama modelling code, which imports torch.distributed.tensor and torch._dynamo),
and `split`, where the same imports (torch, then `LlamaForCausalLM`, `AutoTokenizer`) are timed
first and `headscope.load` after them: the load's own work.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _transformers_load(path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    return model


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def one_round(path: Path) -> dict:
    import headscope

    times = {"transformers": _timed(lambda: _transformers_load(path)),
             "no_cache": _timed(lambda: headscope.load("smollm2-135m", device="cpu", cache=False))}
    with tempfile.TemporaryDirectory(prefix="headscope-bench-cache-") as folder:
        os.environ["HEADSCOPE_CACHE"] = folder
        times["first"] = _timed(lambda: headscope.load("smollm2-135m", device="cpu"))
        times["second"] = _timed(lambda: headscope.load("smollm2-135m", device="cpu"))
    return times


def analyze_wall(cache_folder: str, *extra: str) -> float:
    with tempfile.TemporaryDirectory(prefix="headscope-bench-out-") as out:
        env = dict(os.environ, HEADSCOPE_CACHE=cache_folder, PYTHONPATH=str(ROOT))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "headscope", "analyze", "--device", "cpu", "--out",
                        str(Path(out) / "run"), *extra], env=env, check=True, capture_output=True)
        return time.perf_counter() - start


FRESH_CHILD = """
import json, sys, time
start = time.perf_counter()
if sys.argv[1] == "split":
    import torch
    torch_done = time.perf_counter()
    from transformers import AutoTokenizer, LlamaForCausalLM
    imports_done = time.perf_counter()
else:
    torch_done = imports_done = start
import headscope
loaded = headscope.load("smollm2-135m", device="cpu")
end = time.perf_counter()
print(json.dumps({"import_torch": torch_done - start, "import_modeling": imports_done - torch_done,
                  "load": end - imports_done}))
"""


def fresh_loads(rounds: int, cache_folder: str) -> dict:
    """Warm loads in fresh processes: whole (imports inside the load) and split (imports first)."""
    env = dict(os.environ, HEADSCOPE_CACHE=cache_folder, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", "import headscope; headscope.load('smollm2-135m', device='cpu')"],
                   env=env, check=True, capture_output=True)  # the entry exists before any timing
    runs = {"whole": [], "split": []}
    for _ in range(rounds):
        for kind in runs:
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", FRESH_CHILD, kind], env=env, check=True,
                                  capture_output=True, text=True)
            runs[kind].append({**json.loads(done.stdout.strip().splitlines()[-1]),
                               "process": time.perf_counter() - start})
    median = {kind: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for kind, rows in runs.items()}
    return {"fresh_runs": runs, "fresh_median_s": median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--analyze-rounds", type=int, default=1)
    parser.add_argument("--skip-analyze", action="store_true")
    parser.add_argument("--fresh", type=int, default=0, help="only: N warm loads in fresh processes")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("load-results.jsonl"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from headscope.loading.loader import ALIASES

    path = ALIASES["smollm2-135m"].location()
    if args.fresh:
        with tempfile.TemporaryDirectory(prefix="headscope-bench-cache-") as folder:
            result = {"date": date.today().isoformat(), "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
                      **fresh_loads(args.fresh, folder)}
        for kind, median in result["fresh_median_s"].items():
            print(kind, " ".join(f"{k} {v:.2f} s" for k, v in median.items()))
        with open(args.out, "a") as fh:
            fh.write(json.dumps(result) + "\n")
        return
    import torch  # noqa: F401  imports are paid once, before any timing
    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    rounds = [one_round(path) for _ in range(args.rounds)]
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratio = lambda a, b: statistics.median(r[a] / r[b] for r in rounds)
    result = {"date": date.today().isoformat(), "cpus": os.cpu_count(), "rounds": rounds,
              "median_s": median, "second_over_first": ratio("second", "first"),
              "first_over_transformers": ratio("first", "transformers"),
              "no_cache_over_transformers": ratio("no_cache", "transformers")}
    for name, seconds in median.items():
        print(f"{name:<14} {seconds:7.2f} s")
    print(f"second/first {result['second_over_first']:.3f}   first/transformers "
          f"{result['first_over_transformers']:.3f}   no_cache/transformers {result['no_cache_over_transformers']:.3f}")
    if not args.skip_analyze:
        with tempfile.TemporaryDirectory(prefix="headscope-bench-cache-") as folder:
            env = dict(os.environ, HEADSCOPE_CACHE=folder, PYTHONPATH=str(ROOT))
            subprocess.run([sys.executable, "-c", "import headscope; headscope.load('smollm2-135m', device='cpu')"],
                           env=env, check=True, capture_output=True)
            pairs = [(analyze_wall(folder, "--no-cache"), analyze_wall(folder)) for _ in range(args.analyze_rounds)]
        before = statistics.median(b for b, _ in pairs)
        after = statistics.median(a for _, a in pairs)
        result["analyze_s"] = {"no_cache": [b for b, _ in pairs], "warm_cache": [a for _, a in pairs],
                               "warm_over_no_cache": statistics.median(a / b for b, a in pairs)}
        print(f"analyze: --no-cache {before:.1f} s, warm cache {after:.1f} s "
              f"({result['analyze_s']['warm_over_no_cache']:.2f}x)")
    with open(args.out, "a") as fh:
        fh.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
