"""Peak memory and time of `analyze` with the default pattern detectors against a plain SDPA forward
pass over the same tokens, one contender per fresh process, with the breakdown by detector.

    python benchmarks/memory_by_detector.py                          # 1024x4, 4096x1, 8192x1; 3 runs each
    python benchmarks/memory_by_detector.py --sizes 1024x4 --repeats 1 --each

A size `TxB` is B examples of T tokens for each of the two probes the pattern detectors read: the
natural-text probe (previous_token, self, sink, uniform) and the repeated-random-token probe
(induction, duplicate_token; a unit of T/2 tokens twice). The contenders, each in its own process
(the model loaded, the probes built, then the peak reset through /proc/self/clear_refs):
- plain: the model body's default (SDPA) forward over both probes' tokens, the floor;
- plain x2: the same twice, the floor of an analysis with its control twin (the twin's pass is a
  second forward over the same tokens);
- all: `analyze` with every default pattern detector of the model, no control twin, no OV;
- all+control: the same with the random-init control twin;
- only:NAME (`--each`): `analyze` with that one detector (and only its probe);
- entropy pass (`--floor`): only the fused kernel call per layer that `uniform`'s row entropy
  needs on the text probe (`LazyPattern.entropy`: aten's CPU flash kernel with the keys as
  values), on random q and k of the probe's shape. It is work no plain forward does and no exact
  entropy avoids with torch's CPU kernels, so (plain + entropy pass) / plain is the lowest time
  ratio `all` can reach on this machine.
Peak memory is the process's peak resident set during the contender (VmHWM: the model's weights
included, as a user's process holds them), with large allocations forced to mmap
(MALLOC_MMAP_THRESHOLD_) so freed buffers leave the resident set; "extra" is that peak minus the
resident set before the contender. The table gives medians over `--repeats` processes and the
ratios of those medians to the plain forward's (all+control against plain x2). Results are
appended as JSON lines to --out (results-memory.jsonl).
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


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def _probes(loaded, seq_len: int, batch: int) -> dict:
    from headscope.errors import HeadscopeError
    from headscope.probes.base import ProbeSet, repeated_probe, text_probe

    n = batch
    while True:  # the corpus has fewer long windows than a large batch needs: rows then repeat
        try:
            text = text_probe(loaded.tokenizer, n, seq_len, seed=0)
            break
        except HeadscopeError:
            n -= 1
            if n == 0:
                raise
    ids = text.input_ids.repeat((batch + n - 1) // n, 1)[:batch]
    text = ProbeSet("text", ids, text.content_start, text.description, text.token_counts)
    repeated = repeated_probe(loaded.tokenizer, batch, repeat_len=(seq_len - 1) // 2, repeats=2, seed=0,
                              vocab_size=loaded.model.config.vocab_size)
    return {"text": text, "repeated": repeated}


def entropy_pass(loaded, seq_len: int, batch: int):
    """`run()`: the fused kernel call per layer that `uniform`'s row entropy adds to a forward
    (`LazyPattern.entropy`: aten's CPU flash kernel with the keys as values, grouped keys as the
    model has them), on random q and k of the text probe's shape."""
    import torch

    try:
        from headscope.attention.lazy import cpu_flash_groups_heads
    except ImportError:  # a checkout from before grouped keys reached the kernel: it repeats them
        cpu_flash_groups_heads = lambda: False  # noqa: E731

    config = loaded.model.config
    n_heads, n_kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, n_heads, seq_len, d_head, generator=generator)
    k = torch.randn(batch, n_kv, seq_len, d_head, generator=generator)
    if not cpu_flash_groups_heads():
        k = k.repeat_interleave(n_heads // n_kv, dim=1)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def run():
        for _ in range(len(loaded.attention_layers)):
            op(q, k, k, 0.0, True, scale=d_head ** -0.5)
    return run


def child(contender: str, seq_len: int, batch: int, model: str) -> None:
    """Run one contender in this process; print its JSON line."""
    import torch

    import headscope
    from headscope.detectors import get
    from headscope.detectors.registry import defaults

    torch.set_grad_enabled(False)
    loaded = headscope.load(model)
    pattern = [name for name in defaults(loaded.causal) if get(name).probe in ("text", "repeated")]
    if contender == "list":  # the default pattern detectors, nothing run
        print(json.dumps({"detectors": pattern}))
        return
    probes = _probes(loaded, seq_len, batch)
    if contender == "entropy pass":
        run = entropy_pass(loaded, seq_len, batch)
    elif contender.startswith("plain"):
        times = 2 if contender == "plain x2" else 1

        def run():
            for _ in range(times):
                for probe in probes.values():
                    loaded.body(input_ids=probe.input_ids, attention_mask=torch.ones_like(probe.input_ids))
    else:
        chosen = pattern if contender.startswith("all") else [contender.split(":", 1)[1]]
        used = {get(name).probe for name in chosen}
        control = "random-init" if contender == "all+control" else None

        def run():
            headscope.analyze(loaded, detectors=chosen, probes=[p for name, p in probes.items() if name in used],
                              batch_size=batch, control=control, ov=False)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _kib("VmRSS:")
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    peak = _kib("VmHWM:")
    print(json.dumps({"contender": contender, "seconds": seconds, "peak_mib": peak / 1024,
                      "extra_mib": (peak - before) / 1024, "detectors": pattern}))


def spawn(contender: str, seq_len: int, batch: int, model: str) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, __file__, "--child", contender, "--sizes", f"{seq_len}x{batch}",
                          "--model", model], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{contender} at {seq_len}x{batch} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", nargs="+", default=["1024x4", "4096x1", "8192x1"], help="SEQ_LENxBATCH")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--each", action="store_true", help="also each detector alone")
    parser.add_argument("--control", action="store_true", help="also analyze with the control twin")
    parser.add_argument("--only-control", action="store_true", help="only the control rows (plain x2, all+control)")
    parser.add_argument("--floor", action="store_true", help="also the entropy pass alone (the time floor)")
    parser.add_argument("--out", type=Path, default=HERE / "results-memory.jsonl")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes]
    if args.child:
        return child(args.child, *sizes[0], args.model)
    contenders = (["plain x2", "all+control"] if args.only_control else
                  ["plain", "all"] + (["plain x2", "all+control"] if args.control else []))
    if args.each:
        contenders += [f"only:{name}" for name in spawn("list", *sizes[0], args.model)["detectors"]]
    if args.floor:
        contenders.append("entropy pass")
    for seq_len, batch in sizes:
        runs = {name: [] for name in contenders}
        for _ in range(args.repeats):  # round robin: a slow spell does not land on one contender
            for name in contenders:
                runs[name].append(spawn(name, seq_len, batch, args.model))
        row = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": args.model, "seq_len": seq_len, "batch": batch,
               "repeats": args.repeats, "load": os.getloadavg()[0], "contenders": {}}
        for name, results in runs.items():
            row["contenders"][name] = {key: statistics.median(r[key] for r in results)
                                       for key in ("seconds", "peak_mib", "extra_mib")}
            row["contenders"][name]["runs"] = [{k: round(r[k], 3) for k in ("seconds", "peak_mib")} for r in results]
        base = row["contenders"]
        for name in contenders:
            floor = base["plain x2"] if name == "all+control" else base.get("plain", base[name])
            base[name]["peak_ratio"] = base[name]["peak_mib"] / floor["peak_mib"]
            base[name]["time_ratio"] = base[name]["seconds"] / floor["seconds"]
            print(f"{seq_len}x{batch} {name:>24}: {base[name]['seconds']:8.2f} s (x{base[name]['time_ratio']:.3f})"
                  f" peak {base[name]['peak_mib']:8.1f} MiB (x{base[name]['peak_ratio']:.3f}),"
                  f" extra {base[name]['extra_mib']:8.1f} MiB", flush=True)
        if "entropy pass" in base and "plain" in base:
            row["time_floor"] = (base["plain"]["seconds"] + base["entropy pass"]["seconds"]) / base["plain"]["seconds"]
            print(f"{seq_len}x{batch} time floor (plain + entropy pass) / plain: x{row['time_floor']:.3f}", flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
