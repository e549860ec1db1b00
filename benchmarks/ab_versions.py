"""Time `analyze` of one code version, to compare two checkouts run alternately (A/B).

    cd OLD && PYTHONPATH=OLD python NEW/benchmarks/ab_versions.py before
    cd NEW && PYTHONPATH=NEW python NEW/benchmarks/ab_versions.py after

Loads SmolLM2-135M, warms up, then times 3 runs of the pattern detectors (previous-token,
induction, sink, uniform; 8 x 256 text tokens and 8 x 101 repeated tokens) with no control
model, on 2 threads. Only the public API (`headscope.load`, `headscope.analyze`, the probe
settings), so the same script runs on any version since the probe settings. Prints one JSON line.
Used for "nothing slows down" checks.
"""
import json
import sys
import time

import torch

import headscope

torch.set_num_threads(2)
loaded = headscope.load("smollm2-135m", device="cpu")
kw = dict(detectors=["previous_token", "induction", "sink", "uniform"], control=None, explorer_examples=0)


def probes(n):
    return [headscope.TextProbe(n_examples=n, seq_len=256), headscope.RepeatedProbe(n_examples=n, repeat_len=25, repeats=4)]


headscope.analyze(loaded, probes=probes(2), **kw)  # warm-up
times = []
for _ in range(3):
    start = time.perf_counter()
    headscope.analyze(loaded, probes=probes(8), **kw)
    times.append(time.perf_counter() - start)
print(json.dumps({"version": sys.argv[1] if len(sys.argv) > 1 else "", "times": times}))
