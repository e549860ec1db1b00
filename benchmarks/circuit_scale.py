"""EAP-IG scoring's peak memory and time against plain forward/backward passes of the same batches.

    python benchmarks/circuit_scale.py [--models smollm2,qwen2-shaped] [--n 32] [--batch 32]
        [--runs R] [--before DIR] [--out benchmarks/results-circuit-scale.json]

For each model, on `headscope.task("ioi", SmolLM2's tokenizer, n=N)` in micro-batches of
`--batch` prompts, each contender in a fresh process:
- "plain": one forward and backward pass per micro-batch, the metric's gradient taken with respect
  to the input embeddings (what a gradient-based attribution needs at least), S + 2 times over;
  "plain-once": the same passes once (the allocator's growth over repeated passes left out);
- "eap-ig": `score_edges` with 5 steps (the default left rule): 2 + 5 forward, 5 backward passes;
- with `--before DIR`, "eap-ig-before": the same scoring with the headscope found in DIR (a
  checkout of an earlier commit), for before/after numbers;
- "forward": one forward pass per micro-batch without a gradient, the baseline of
- "patched": one patched run of `Circuit.evaluate` (`Patched.metric`, a random circuit keeping
  10% of the edges) in micro-batches of `--batch` prompts, after the empty circuit's run, which
  caches the corrupted run's senders as an evaluation does (its memory counted in the growth,
  its time in `setup_seconds`, not in `seconds`).
Recorded per contender: the peak resident set of the whole process (VmHWM, model included),
the resident set once the model and task are loaded, their difference (the growth: what the
contender itself needed), and the seconds it ran. Before the contender starts, the heap that
setting up freed is returned (`malloc_trim`) and the peak reset (/proc/self/clear_refs): freed
heap left from building the graph would otherwise be reused by whichever contender fits in it,
and the growth would measure the leftover instead of the contender (the single plain pass moved
between 752 and 1,012 MiB that way). The ratios compare EAP-IG's growth with the
plain pass's growth on the same micro-batches, and its time with the plain contender's (S + 2) passes.
With `--runs R` every contender runs in R processes, and the medians are recorded beside each run.

Models: "smollm2" (SmolLM2-135M, the bundled GGUF) and "qwen2-shaped", a Qwen2-0.5B-shaped model
with random weights (24 layers x 14 heads, 2 key/value heads, d_model 896, q/k/v biases, its
vocabulary of 151,936): about 180k edges. float32 on the CPU.
The load average is recorded at the start and the end: a time taken under load is noise.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 5


def resident_mib(field: str = "VmRSS") -> float:
    """The process's resident set now (VmRSS) or its peak (VmHWM), in MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _model(name: str):
    import torch
    import transformers as tf

    import headscope

    smollm2 = headscope.load("smollm2-135m")
    if name == "smollm2":
        return smollm2.model, smollm2.tokenizer
    config = tf.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=512,
                            tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = tf.Qwen2ForCausalLM(config).eval()
    del smollm2
    return model, headscope.load("smollm2-135m").tokenizer


def contender(mode: str, model_name: str, n: int, batch: int) -> None:
    """One contender in this process; prints its measurements as JSON."""
    import torch

    import headscope
    from headscope.circuits.eap import score_edges
    from headscope.circuits.edges import graph_of
    from headscope.circuits.target import Target
    from headscope.loading.heap import return_freed_heap

    torch.manual_seed(0)
    model, tokenizer = _model(model_name)
    for param in model.parameters():
        param.requires_grad_(False)
    task = headscope.task("ioi", tokenizer, n=n, seed=0)
    target = Target(model, task)
    graph = graph_of(target, task)
    gc.collect()
    return_freed_heap()  # what setting up freed goes back, so that no contender starts with free heap to reuse
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    loaded = resident_mib()
    started = time.perf_counter()
    if mode.startswith("plain"):  # the S + 2 passes EAP-IG makes, each with a gradient (plain-once: one)
        for start in [start for _ in range(1 if mode == "plain-once" else STEPS + 2) for start in range(0, n, batch)]:
            rows = task.subset(slice(start, min(n, start + batch)))
            inputs = rows.inputs("clean")
            embedded = model.get_input_embeddings()(inputs.pop("input_ids")).detach().requires_grad_()
            metric = rows.score(model(inputs_embeds=embedded, **inputs, use_cache=False).logits.float()).sum()
            torch.autograd.grad(metric, embedded)
    elif mode == "forward":
        with torch.no_grad():
            for start in range(0, n, batch):
                model(**task.subset(slice(start, min(n, start + batch))).inputs("clean"), use_cache=False)
    elif mode == "patched":
        import numpy as np

        from headscope.circuits.edge_patching import Patched

        patched = Patched(target, graph, task, batch)
        patched.metric(np.zeros(patched.n_edges, dtype=bool))  # the corrupted senders cached
        kept = np.zeros(patched.n_edges, dtype=bool)
        kept[np.random.default_rng(0).choice(patched.n_edges, patched.n_edges // 10, replace=False)] = True
        setup, started = time.perf_counter() - started, time.perf_counter()
        patched.metric(kept)
    else:
        score_edges(target, graph, task, "eap-ig", STEPS, batch)
    seconds = time.perf_counter() - started
    edges = sum(len(r.names) * len(r.upstream) for r in graph.receivers)
    print(json.dumps({"peak": resident_mib("VmHWM"), "loaded": loaded, "seconds": seconds, "edges": edges,
                      "headscope": str(Path(headscope.__file__).parent),
                      **({"setup_seconds": setup} if mode == "patched" else {})}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,qwen2-shaped")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32, help="prompts per micro-batch")
    parser.add_argument("--before", type=Path, help="a checkout of an earlier headscope to compare with")
    parser.add_argument("--runs", type=int, default=1, help="processes per contender (medians recorded)")
    parser.add_argument("--modes", help="only these contenders, comma-separated (into the results already there)")
    parser.add_argument("--out", type=Path, default=HERE / "results-circuit-scale.json")
    parser.add_argument("--contender", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        return contender(args.contender[0], args.contender[1], args.n, args.batch)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for name in args.models.split(","):
        result = {"n": args.n, "batch": args.batch, "steps": STEPS, "load_average_start": os.getloadavg()}
        modes = ["plain", "plain-once", "eap-ig"] + (["eap-ig-before"] if args.before else []) + ["forward", "patched"]
        if args.modes:  # a rerun of some contenders beside the results already there
            result = dict(results.get(name, {}), load_average_start=os.getloadavg())
            modes = args.modes.split(",")
        for mode in modes:
            env = dict(os.environ)
            if mode == "eap-ig-before":
                env["PYTHONPATH"] = str(args.before.resolve())
            runs = []
            for _ in range(args.runs):
                out = subprocess.run([sys.executable, __file__, "--contender", mode.replace("-before", ""), name,
                                      "--n", str(args.n), "--batch", str(args.batch)],
                                     capture_output=True, text=True, env=env, cwd=args.before or None)
                if out.returncode:
                    lines = out.stderr.strip().splitlines()
                    runs = [{"error": lines[-1] if lines else f"exit status {out.returncode} (killed: out of memory?)"}]
                    break
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                runs[-1]["growth"] = runs[-1]["peak"] - runs[-1]["loaded"]
            if "error" in runs[0]:
                result[mode] = runs[0]
            else:  # medians over the processes, each run kept
                result[mode] = {key: statistics.median(run[key] for run in runs)
                                for key in ("peak", "loaded", "growth", "seconds")}
                result[mode].update(edges=runs[0]["edges"], headscope=runs[0]["headscope"], runs=runs)
                if mode == "patched":
                    result[mode]["setup_seconds"] = statistics.median(run["setup_seconds"] for run in runs)
            print(name, mode, json.dumps({k: v for k, v in result[mode].items() if k != "runs"}), flush=True)
        plain, once = result.get("plain", {}), result.get("plain-once", {})
        for mode in [m for m in ("eap-ig", "eap-ig-before") if m in result]:
            if "growth" in result[mode] and "growth" in plain and "growth" in once:
                result[f"{mode}_growth_ratio"] = result[mode]["growth"] / plain["growth"]
                result[f"{mode}_growth_ratio_once"] = result[mode]["growth"] / once["growth"]
                result[f"{mode}_time_ratio"] = result[mode]["seconds"] / plain["seconds"]
        if "growth" in result.get("patched", {}) and "growth" in result.get("forward", {}):
            result["patched_growth_ratio"] = result["patched"]["growth"] / result["forward"]["growth"]
            result["patched_time_ratio"] = result["patched"]["seconds"] / result["forward"]["seconds"]
        result["load_average_end"] = os.getloadavg()
        results[name] = result
        print(name, json.dumps({k: v for k, v in result.items() if k.endswith("ratio")}), flush=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
