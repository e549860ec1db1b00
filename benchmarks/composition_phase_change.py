"""Composition scores on the phase-change model before and after induction heads form, and on SmolLM2-135M.

    python benchmarks/composition_phase_change.py [--seed 0] [--steps 450] [--every 25] [--no-smollm2]

Phase change (docs/training.md): the 2-layer tiny Llama of `headscope.training.toy` (4 heads, hidden
64, vocab 64) trains on repeated segments as benchmarks/phase_change.py trains it (batch 64, AdamW
lr 1e-3, one thread), with `HeadscopeCallback` recording every `--every` steps and a copy of the
weights kept at each record. The pair is read off the last record: layer 0's best previous-token
head and layer 1's best induction head. At every record: the pair's K-composition score, its rank
among the 16 layer-0 -> layer-1 pairs (1 = highest score) and among the 4 pairs into that
induction head, and its z; Elhage's score and the rotary-aware one (`rotary_offsets=60`: every
offset a 61-token sequence has), beside the two heads' detector scores.

SmolLM2-135M: each kind's seconds, baseline, score quantiles, share of pairs with z > 5 and the top
pairs, and K-composition with `rotary_offsets=64`.

Results: benchmarks/results-composition.json.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import headscope
from headscope.loading.loader import Loaded
from headscope.training.callback import HeadscopeCallback
from headscope.training.toy import SEQ_LEN, induction_window, repeated_segments, tiny_llama, train_toy

HERE = Path(__file__).resolve().parent
ROTARY = SEQ_LEN - 1  # offsets 1..60: every distance between a query and an earlier key


def snapshots(every: int):
    """A TrainerCallback keeping a copy of the weights at step 0 and every `every` steps."""
    import transformers as tf

    class Snapshots(tf.TrainerCallback):
        kept: dict = {}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.kept[0] = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every == 0:
                self.kept[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    return Snapshots()


def pair_row(table: pd.DataFrame, src: int, dst: int) -> dict:
    """The pair (0.src -> 1.dst)'s score, ranks and z in one K-composition table."""
    ranked = table.assign(rank=table.score.rank(ascending=False, method="min"))
    into = ranked[ranked.dst_head == dst].assign(rank_into=lambda f: f.score.rank(ascending=False, method="min"))
    row = into[into.src_head == src].iloc[0]
    return {"score": round(float(row.score), 4), "rank": int(row["rank"]), "of": len(table),
            "rank_into_head": int(row.rank_into), "z": round(float(row.z), 2),
            "baseline": round(float(row.baseline), 4), "baseline_std": round(float(row.baseline_std), 4),
            "best_score": round(float(table.score.max()), 4), "median_score": round(float(table.score.median()), 4)}


def phase_change(seed: int, steps: int, every: int, work: Path) -> dict:
    torch.manual_seed(seed)
    model = tiny_llama(2)
    ids, _ = repeated_segments(steps * 64, torch.Generator().manual_seed(seed))
    held, _ = repeated_segments(64, torch.Generator().manual_seed(10_000 + seed))
    out = work / "timeline"
    kept = snapshots(every)
    start = time.perf_counter()
    train_toy(model, ids, steps, work / "run", [HeadscopeCallback(every=every, out=out, icl_data=held), kept],
              seed=seed)
    seconds = time.perf_counter() - start
    scores = pd.read_csv(out / "timeline.csv")
    last = int(scores.step.max())
    final = scores[scores.step == last]
    prev = final[(final.detector == "previous_token") & (final.layer == 0)].sort_values("score").iloc[-1]
    ind = final[(final.detector == "induction") & (final.layer == 1)].sort_values("score").iloc[-1]
    src, dst = int(prev["head"]), int(ind["head"])
    records = []
    for step in sorted(kept.kept):
        twin = tiny_llama(2)
        twin.load_state_dict(kept.kept[step])
        loaded = Loaded.from_model(twin, None, f"step-{step}")
        at = scores[scores.step == step]

        def score_of(detector, layer, head):
            rows = at[(at.detector == detector) & (at.layer == layer) & (at["head"] == head)]
            return round(float(rows.score.iloc[0]), 3) if len(rows) else None

        plain = headscope.composition(loaded, "k")
        turned = headscope.composition(loaded, "k", rotary_offsets=ROTARY)
        records.append({"step": step, "previous_token_score": score_of("previous_token", 0, src),
                        "induction_score": score_of("induction", 1, dst),
                        "elhage": pair_row(plain, src, dst), "rotary": pair_row(turned, src, dst)})
        print(json.dumps(records[-1]), flush=True)
    def grid(table):  # rows: layer-0 (source) heads, columns: layer-1 (destination) heads
        return table.pivot(index="src_head", columns="dst_head", values="score").round(3).to_numpy().tolist()

    final_labels = {f"{r.layer}.{r['head']}": r.label for _, r in
                    pd.read_csv(out / "labels.csv").query("step == @last").iterrows() if r.label != "none"}
    return {"seed": seed, "steps": steps, "every": every, "train_seconds": round(seconds, 1),
            "pair": {"previous_token_head": f"0.{src}", "induction_head": f"1.{dst}"},
            "labels_at_end": final_labels, "window": induction_window(out).get("window"),
            "records": records, "k_scores_at_end": {"rows": "source head 0.r", "columns": "destination head 1.c",
                                 "elhage": grid(plain), "rotary": grid(turned)}}


def smollm2() -> dict:
    started = time.perf_counter()
    loaded = headscope.load("smollm2-135m", device="cpu")
    out = {"load_seconds": round(time.perf_counter() - started, 1)}
    for kind, offsets in (("q", None), ("k", None), ("v", None), ("k", 64)):
        start = time.perf_counter()
        table = headscope.composition(loaded, kind, rotary_offsets=offsets)
        seconds = time.perf_counter() - start
        top = table.sort_values("z", ascending=False).head(5)
        out[kind if offsets is None else f"{kind}_rotary_{offsets}"] = {
            "seconds": round(seconds, 1), "pairs": len(table), "baseline": round(float(table.baseline.iloc[0]), 4),
            "baseline_std": round(float(table.baseline_std.iloc[0]), 5),
            "score_quantiles": {str(q): round(float(table.score.quantile(q)), 4) for q in (0.5, 0.9, 0.99, 1.0)},
            "z_median": round(float(table.z.median()), 1), "share_z_over_5": round(float((table.z > 5).mean()), 3),
            "top": [{"pair": f"{r.src_layer}.{r.src_head} -> {r.dst_layer}.{r.dst_head}", "score": round(r.score, 4),
                     "z": round(r.z, 1)} for r in top.itertuples()]}
        print(kind, offsets, json.dumps(out[kind if offsets is None else f"{kind}_rotary_{offsets}"]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=450)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {"config": vars(args), "torch_threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        results["phase_change"] = phase_change(args.seed, args.steps, args.every, Path(tmp))
    if not args.no_smollm2:
        results["smollm2_135m"] = smollm2()
    (HERE / "results-composition.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
