"""Do SmolLM2's top heads by activation patching match the induction detector's top-5? (issue 19)

    python benchmarks/patching_induction.py                               # the primary design
    python benchmarks/patching_induction.py --direction noising --hook pattern   # a variant

The design, fixed before measuring (see docs/results.md for the reasons):
- clean: BOS, N random ordinary tokens, the same N tokens again (repeated random tokens);
- corrupted: BOS, the same first N tokens, then N other random tokens, none of them from the
  first half (non-repeating): a minimal pair that differs only in whether the second half repeats;
- metric: mean log-probability of the clean next token over the second half, at the positions
  where induction can predict it (tokens 2..N of the repeat), averaged over prompts;
- primary variant: denoising (clean -> corrupted) of hook_z, every head; the others are reported
  beside it, not chosen from.
The detector's top-5 is taken twice: from the golden `headscope analyze` of the model
(tests/support/golden, 16 x 25 x 4 repeated tokens) and from the induction detector run on the clean
prompts of this script. One JSON line per run is appended to --out.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

import headscope
from headscope.probes.base import ProbeSet, candidate_ids

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "tests" / "golden" / "smollm2-135m" / "scores.csv"


def induction_prompts(tokenizer, n_prompts: int, half: int, seed: int = 0, fresh: bool = False):
    """(clean, corrupted) `[n_prompts, 1 + 2 * half]`: BOS A A and BOS A C, C disjoint from A
    (fresh: BOS B C, both halves new, so previous-token heads' outputs differ too)."""
    candidates = candidate_ids(tokenizer)
    g = torch.Generator().manual_seed(seed)
    picks = torch.stack([candidates[torch.randperm(len(candidates), generator=g)[:3 * half]]
                         for _ in range(n_prompts)])  # (P, 3N) distinct tokens per prompt
    first, other, third = picks[:, :half], picks[:, half:2 * half], picks[:, 2 * half:]
    bos = torch.full((n_prompts, 1), tokenizer.bos_token_id, dtype=torch.long)
    return torch.cat([bos, first, first], 1), torch.cat([bos, third if fresh else first, other], 1)


def next_token_logprob(clean: torch.Tensor, half: int):
    """metric(logits) -> [batch]: mean log-prob of the clean next token where induction predicts it."""
    pos = torch.arange(half + 2, 2 * half + 1)  # positions holding A_2..A_N of the repeat (BOS at 0)
    targets = clean[:, pos]

    def metric(logits):  # logits [copies * P, T, vocab]; called on one P-sized piece at a time
        logp = logits[:, pos - 1].float().log_softmax(-1)  # predictions made one position earlier
        return logp.gather(-1, targets[: logits.shape[0], :, None]).squeeze(-1).mean(-1)
    return metric


def top(table: pd.DataFrame, column: str, k: int) -> list[str]:
    best = table.sort_values(column, ascending=False).head(k)
    return [f"{r.layer}.{r.head}" for r in best.itertuples()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--half", type=int, default=16, help="random tokens per half")
    parser.add_argument("--hook", default="z", choices=["z", "pattern", "result"])
    parser.add_argument("--direction", default="denoising", choices=["denoising", "noising"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corruption", default="second-half", choices=["second-half", "fresh"],
                        help="second-half: BOS A C (primary); fresh: BOS B C, both halves new")
    parser.add_argument("--out", default=str(HERE / "results-patching.jsonl"))
    args = parser.parse_args()
    torch.manual_seed(0)

    loaded = headscope.load("smollm2-135m", device="cpu")
    clean, corrupted = induction_prompts(loaded.tokenizer, args.prompts, args.half, args.seed,
                                         fresh=args.corruption == "fresh")
    metric = next_token_logprob(clean, args.half)

    start = time.time()
    table = headscope.patch(loaded, clean, corrupted, metric, hook=args.hook, direction=args.direction)
    seconds = time.time() - start
    attrs = dict(table.attrs)  # merge below drops them

    golden = pd.read_csv(GOLDEN)
    golden = golden[golden.detector == "induction"]
    here = headscope.analyze(loaded, detectors=["induction"], explorer_examples=0, batch_size=args.prompts, control=None,
                             probes={"repeated": ProbeSet("repeated", clean, 1, "patching clean prompts")})
    scores = here.score_grid("induction")
    table["induction_here"] = [float(scores[l][h]) for l, h in zip(table.layer, table["head"])]
    table = table.merge(golden[["layer", "head", "score"]].rename(columns={"score": "induction_golden"}))

    patch_top = top(table, "effect", 10)
    det_golden, det_here = top(table, "induction_golden", 5), top(table, "induction_here", 5)
    row = {
        "model": "smollm2-135m", "prompts": args.prompts, "half": args.half, "seed": args.seed,
        "hook": args.hook, "direction": args.direction, "corruption": args.corruption, "metric": "mean log-prob of the clean next token",
        "clean_metric": attrs["clean_metric"], "corrupted_metric": attrs["corrupted_metric"],
        "seconds": round(seconds, 1),
        "patch_top10": patch_top, "patch_top10_effect": [round(float(e), 4) for e in
                                                         table.sort_values("effect", ascending=False).effect.head(10)],
        "detector_top5_golden": det_golden, "detector_top5_here": det_here,
        "overlap_top5_golden": len(set(patch_top[:5]) & set(det_golden)),
        "overlap_top5_here": len(set(patch_top[:5]) & set(det_here)),
        "spearman_effect_vs_induction_golden": round(float(table.effect.corr(table.induction_golden, method="spearman")), 4),
        "effects": {f"{r.layer}.{r.head}": round(float(r.effect), 5) for r in table.itertuples()},
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: v for k, v in row.items() if k != "effects"}, indent=1))


if __name__ == "__main__":
    main()
