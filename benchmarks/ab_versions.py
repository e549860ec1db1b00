"""Time `analyze` of one code version, to compare two checkouts run alternately (A/B).

    cd OLD && PYTHONPATH=OLD python PATH/TO/ab_versions.py before lazy
    cd NEW && PYTHONPATH=NEW python PATH/TO/ab_versions.py after lazy      # or: maps

Loads SmolLM2-135M, warms up, then times 3 runs of the pattern detectors (previous-token,
induction, sink, uniform; 8 x 256 text tokens and 8 x 101 repeated tokens) with no control
model, on 2 threads. Prints one JSON line. Used for "nothing slows down" checks.
"""
import sys, time, inspect, json
import torch
torch.set_num_threads(2)
import headscope
from headscope.analysis.analyze import analyze
loaded = headscope.load("smollm2-135m", device="cpu")
kw = dict(detectors=["previous_token", "induction", "sink", "uniform"], n_examples=8, seq_len=256, repeat_len=25,
          repeats=4, explorer_examples=0, lazy=(sys.argv[2] == "lazy"))
if "control" in inspect.signature(analyze).parameters:
    kw["control"] = None
analyze(loaded, **{**kw, "n_examples": 2})  # warm-up
times = []
for _ in range(3):
    t = time.perf_counter(); analyze(loaded, **kw); times.append(time.perf_counter() - t)
print(json.dumps({"version": sys.argv[1], "times": times}))
