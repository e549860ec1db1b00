"""The row entropy computed in the layer's own kernel call against a second call, in one process.

    python benchmarks/entropy_in_the_call.py                      # 1024x4 and 4096x1, 3 rounds
    python benchmarks/entropy_in_the_call.py --sizes 8192x1 --rounds 5

`uniform` reads each row's entropy, H_i = lse_i - scale q_i . sum_j A[i, j] k_j: the sum is an
attention pass with the keys as the values. Two ways to get it on the CPU's fused kernel
(aten's flash kernel), A/B in turn in one process on SmolLM2-135M's shapes (9 query heads, 3 key
and value heads, 64 wide, causal):
- **kernel**: `two calls` is the layer's call for z and a second one with the keys as values;
  `one call` is a single call whose values are `[v | k]`, q and k padded with zeros to the joined
  width (`headscope.attention.lazy._cpu_flash_with_mean_key`); `z alone` is the layer's call by
  itself. Random q, k, v; milliseconds per layer, the mean of 5 calls.
- **analyze**: `headscope.analyze` with the default pattern detectors, `control=None`, `ov=False`,
  on the probes of `memory_by_detector._probes`, with the entropy in the layer's call (as
  shipped) and with it turned off (`Capture.wants_entropy` False: the second call when read).
Prints medians; the ratio is one call over two. Time it on an idle machine (`uptime` under 1.5).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _kernel(batch: int, seq_len: int, rounds: int) -> dict:
    from headscope.attention.lazy import _cpu_flash, _cpu_flash_with_mean_key

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 9, seq_len, 64, generator=generator)
    k, v = (torch.randn(batch, 3, seq_len, 64, generator=generator) for _ in range(2))
    scale = 64 ** -0.5
    contenders = {
        "z alone": lambda: _cpu_flash(q, k, v, True, None, scale),
        "two calls": lambda: (_cpu_flash(q, k, v, True, None, scale), _cpu_flash(q, k, k, True, None, scale)),
        "one call": lambda: _cpu_flash_with_mean_key(q, k, v, True, None, scale),
    }
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            run()
            start = time.perf_counter()
            for _ in range(5):
                run()
            times[name].append((time.perf_counter() - start) / 5 * 1000)
    return times


def _analyze(loaded, detectors, batch: int, seq_len: int, rounds: int) -> dict:
    import headscope
    from headscope.hf.capture import Capture

    sys.path.insert(0, str(HERE))
    from memory_by_detector import _probes

    probes = list(_probes(loaded, seq_len, batch).values())
    shipped = Capture.wants_entropy
    times = {"one call": [], "two calls": []}
    try:
        for _ in range(rounds):
            for name in times:
                Capture.wants_entropy = shipped if name == "one call" else (lambda self, layer: False)
                start = time.perf_counter()
                headscope.analyze(loaded, detectors=detectors, probes=probes, batch_size=batch, control=None, ov=False)
                times[name].append(time.perf_counter() - start)
    finally:
        Capture.wants_entropy = shipped
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1024x4", "4096x1"], help="SEQ_LENxBATCH")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-analyze", action="store_true", help="the kernel contenders only")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    loaded = detectors = None
    if not args.skip_analyze:
        import headscope
        from headscope.detectors import get
        from headscope.detectors.registry import defaults

        loaded = headscope.load("smollm2-135m", device="cpu")
        detectors = [name for name in defaults(loaded.causal) if get(name).probe in ("text", "repeated")]
    for size in args.sizes:
        seq_len, batch = (int(x) for x in size.split("x"))
        parts = [("kernel, ms a layer", _kernel(batch, seq_len, args.rounds))]
        if loaded is not None:
            parts.append(("analyze, s", _analyze(loaded, detectors, batch, seq_len, args.rounds)))
        for what, times in parts:
            medians = {name: statistics.median(found) for name, found in times.items()}
            shown = ", ".join(f"{name} {value:.2f}" for name, value in medians.items())
            print(f"{size} {what}: {shown}; one call / two calls {medians['one call'] / medians['two calls']:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
