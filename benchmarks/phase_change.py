"""Olsson et al.'s induction-head phase change, reproduced on two CPU cores with HeadscopeCallback.

    python benchmarks/phase_change.py [--seeds 0 1 2] [--steps 600] [--every 10]

A tiny Llama (2 layers x 4 heads, hidden 64, vocab 64) and its 1-layer twin train on 61-token
sequences holding one random segment of 8-30 tokens twice, the second copy ending the sequence
(`headscope.training.toy.repeated_segments`: the distance between the copies varies, so only
content-based copying pays), batch 64, AdamW lr 1e-3, one thread. The callback records every
`--every` steps, its ICL score on 64 held-out sequences. From each timeline.csv it reads:
(`headscope.training.toy.induction_window`):
  (a) the window: the last record at which layer 1's best induction score is near chance (at
      most twice the step-0 control's best head) and the first at which a layer-1 head earns the
      induction label;
  (b) the ICL score at both ends of the window;
  (c) layer 0's best previous-token score at both ends, and the first record at which a layer-0
      head earns the previous-token label;
  (d) whether the 1-layer model ever earns an induction label.
Then the callback's overhead at its default interval (`DEFAULT_EVERY`) in one process: the same
2-layer run with and without it. Results: benchmarks/results-phase-change.json; timelines:
benchmarks/phase-change/ (seed 0, for the docs' figure).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from headscope.training.callback import DEFAULT_EVERY, HeadscopeCallback
from headscope.training.toy import induction_window, repeated_segments, tiny_llama, train_toy

HERE = Path(__file__).resolve().parent


class TimedCallback(HeadscopeCallback):
    """The callback, with the seconds spent in its records and its final write added up."""

    seconds = 0.0

    def _record(self, model, state, control) -> None:
        start = time.perf_counter()
        super()._record(model, state, control)
        self.seconds += time.perf_counter() - start

    def on_train_end(self, args, state, control, **kwargs):
        start = time.perf_counter()
        super().on_train_end(args, state, control, **kwargs)
        self.seconds += time.perf_counter() - start


def run(n_layers: int, seed: int, steps: int, every, out: Path, work: Path, timed=None) -> tuple[list[float], float]:
    """Train one model (callback at `every`, or none when every is None; `timed`: a TimedCallback
    instead); (losses, seconds)."""
    torch.manual_seed(seed)
    model = tiny_llama(n_layers)
    ids, _ = repeated_segments(steps * 64, torch.Generator().manual_seed(seed))
    held, _ = repeated_segments(64, torch.Generator().manual_seed(10_000 + seed))
    callbacks = [] if every is None else [HeadscopeCallback(every=every, out=out, icl_data=held)]
    if timed is not None:
        timed._settings["icl_data"] = held
        callbacks = [timed]
    start = time.perf_counter()
    losses = train_toy(model, ids, steps, work / f"run-{n_layers}-{seed}-{every}", callbacks, seed=seed)
    return losses, time.perf_counter() - start


def overhead(steps: int, rounds: int, work: Path) -> dict:
    """The callback at its default interval against no callback, in this process: `rounds`
    alternating pairs of runs (seed 0, 2 layers); the median of the pairs' time ratios, and the
    seconds spent inside the callback as a share of the run it was in (less sensitive to the
    load of a shared machine, which can change between two runs)."""
    load = uptime()
    ratios, shares, identical = [], [], True
    for i in range(rounds):
        plain_losses, plain = run(2, 0, steps, None, work / f"plain-{i}", work)
        timed = TimedCallback(every=DEFAULT_EVERY, out=work / f"tracked-{i}")
        tracked_losses, tracked = run(2, 0, steps, DEFAULT_EVERY, work / f"tracked-{i}", work, timed=timed)
        ratios.append(tracked / plain - 1)
        shares.append(timed.seconds / (tracked - timed.seconds))
        identical &= plain_losses == tracked_losses
        print(f"round {i}: without {plain:.1f} s, with {tracked:.1f} s, in the callback {timed.seconds:.2f} s",
              flush=True)
    median = lambda xs: sorted(xs)[len(xs) // 2]
    return {"every": DEFAULT_EVERY, "steps": steps, "rounds": rounds, "ratio_median": round(median(ratios), 4),
            "ratios": [round(r, 4) for r in ratios], "callback_share_median": round(median(shares), 4),
            "callback_shares": [round(r, 4) for r in shares], "losses_identical": identical,
            "load_before": load, "load_after": uptime(), "cpus": os.cpu_count()}


def uptime() -> str:
    return Path("/proc/loadavg").read_text().split()[:3].__repr__() if Path("/proc/loadavg").exists() else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--one-layer-steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--overhead-steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--overhead-only", action="store_true", help="skip the seeds; keep their last results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kept = HERE / "phase-change"
    results = {"config": vars(args), "seeds": {}, "load_before": uptime()}
    saved = HERE / "results-phase-change.json"
    if args.overhead_only and saved.is_file():
        kept_results = json.loads(saved.read_text())
        results.update({k: kept_results[k] for k in ("config", "seeds", "load_before")})
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for seed in [] if args.overhead_only else args.seeds:
            two = work / f"two-{seed}"
            _, secs2 = run(2, seed, args.steps, args.every, two, work)
            one = work / f"one-{seed}"
            _, secs1 = run(1, seed, args.one_layer_steps, args.every * 5, one, work)
            results["seeds"][seed] = {"two_layer": induction_window(two), "one_layer": induction_window(one),
                                      "seconds": [round(secs2, 1), round(secs1, 1)]}
            print(seed, json.dumps(results["seeds"][seed]), flush=True)
            if seed == args.seeds[0]:
                shutil.rmtree(kept, ignore_errors=True)
                kept.mkdir()
                for name, folder in (("two-layer", two), ("one-layer", one)):
                    shutil.copytree(folder, kept / name, ignore=shutil.ignore_patterns("control"))
        results["overhead"] = overhead(args.overhead_steps, args.rounds, work)
    print(json.dumps(results["overhead"]))
    saved.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
