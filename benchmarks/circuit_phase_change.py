"""Edge-level circuits of the trained phase-change model: do EAP and EAP-IG find the previous-token
head -> induction head key edge?

    python benchmarks/circuit_phase_change.py [--steps 340] [--out benchmarks/results-circuit-phase-change.json]

The 2-layer toy Llama of `headscope.training.toy` trained by the tests' own `train_phase`
(tests/support/phase_change.py: seed 0, one thread, 340 steps, just past its phase change) with
`HeadscopeCallback` recording every 20 steps; heads are read off the labels of the last record
(`labelled_heads`: layer 0's previous-token heads, layer 1's induction heads). For the induction
and induction-keys tasks (`toy_tokenizer`, n=16) at lengths 16, 14 and 10 and seeds 0 and 1, and
for a hand-built variant of the length-16 task in which the whole *first* copy is corrupted
(fresh tokens, the wrong answer last) instead of the second, each method's: strongest edge into
the induction heads' keys and its rank among all edges by |score|, the ranks of the
previous-token -> induction-key edges, and the top 5 edges.

Results: benchmarks/results-circuit-phase-change.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import headscope
from headscope.atomic import write_text_atomic
from headscope.circuits.tasks import Task
from headscope.training.callback import HeadscopeCallback
from headscope.training.toy import toy_tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.support.phase_change import EVERY, SEED, held_out, labelled_heads, train_phase  # noqa: E402  the tests' run


def train(steps: int, work: Path):
    """The tests' phase-change run (`tests/support/phase_change.py`) with the callback's timeline."""
    callback = HeadscopeCallback(every=EVERY, out=work / "timeline", icl_data=held_out())
    _, model = train_phase(2, steps, work / "run", [callback])
    return model, work / "timeline"


def heads(timeline: Path) -> tuple[set, set, dict]:
    previous, induction = labelled_heads(timeline)
    scores = pd.read_csv(timeline / "timeline.csv")
    final = scores[(scores.step == scores.step.max()) & scores.detector.isin(["previous_token", "induction"])]
    return previous, induction, {f"{r.detector} {r.layer}.{r['head']}": round(float(r.score), 3)
                                 for _, r in final.iterrows()}


def first_copy_corrupted(task: Task, length: int) -> Task:
    """The same prompts with the first copy (positions 1..length) replaced by the task's fresh tokens
    and its wrong answer: the second copy and the query are the clean run's."""
    corrupted = task.clean.clone()
    fresh = task.corrupted[:, 1 + length:2 * length]  # the L - 1 tokens the built-in task puts in the second copy
    corrupted[:, 1:1 + length] = torch.cat([fresh, task.wrong[:, None]], dim=1)
    return Task(clean=task.clean, corrupted=corrupted, answer=task.answer, wrong=task.wrong,
                name="induction, first copy corrupted")


def ranks(model, task, previous: set, induction: set) -> dict:
    out = {}
    keys = {f"{h}.k" for h in induction}
    for method in ("eap-ig", "eap"):
        start = time.perf_counter()
        found = headscope.circuit(model, task, method=method, steps=5)
        seconds = time.perf_counter() - start
        edges = found.top(len(found.edges))
        edges["rank"] = range(1, len(edges) + 1)
        into = edges[edges.dst.isin(keys)]
        best = into.iloc[0]
        wanted = edges[edges.src.isin(previous) & edges.dst.isin(keys)]
        out[method] = {"seconds": round(seconds, 2), "n_edges": len(edges),
                       "clean_metric": round(found.meta["clean_metric"], 4),
                       "corrupted_metric": round(found.meta["corrupted_metric"], 4),
                       "strongest_into_induction_keys": f"{best.src}->{best.dst} {best.score:+.4f} (rank {best['rank']})",
                       "from_previous_token_head": bool(best.src in previous),
                       "previous_token_to_induction_key_ranks": [int(r) for r in wanted["rank"]],
                       "top5": [f"{r.src}->{r.dst} {r.score:+.4f}" for r in edges.head(5).itertuples()]}
        print(task.name, method, json.dumps(out[method]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=340)
    parser.add_argument("--out", type=Path, default=HERE / "results-circuit-phase-change.json")
    args = parser.parse_args()
    result = {"seed": SEED, "steps": args.steps, "load_average_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        model, timeline = train(args.steps, Path(work))
        result["train_seconds"] = round(time.perf_counter() - start, 1)
        previous, induction, scores = heads(timeline)
    result.update(previous_token_heads=sorted(previous), induction_heads=sorted(induction), final_scores=scores)
    print(json.dumps(result), flush=True)
    tokenizer = toy_tokenizer()
    result["runs"] = []
    for name in ("induction", "induction-keys"):
        for length in (16, 14, 10):
            for seed in (0, 1):
                task = headscope.task(name, tokenizer, n=16, seed=seed, length=length)
                result["runs"].append({"task": name, "length": length, "seed": seed,
                                       **ranks(model, task, previous, induction)})
    for seed in (0, 1):
        task = first_copy_corrupted(headscope.task("induction", tokenizer, n=16, seed=seed, length=16), 16)
        result["runs"].append({"task": task.name, "length": 16, "seed": seed, **ranks(model, task, previous, induction)})
    result["load_average_end"] = os.getloadavg()
    write_text_atomic(args.out, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
