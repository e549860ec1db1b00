"""SmolLM2's induction heads and OV copying, with and without the norm gains folded in.

    PYTHONPATH=. python benchmarks/ov_folded_smollm2.py [--n-tokens 500] [--n-heads 20]

positive_eig_share for all 270 heads both ways, through the small matrix W_O diag(g_f) (W_U W_E)
diag(g_in) W_V (`[d_head, d_head]`; W_U W_E is `[d_model, d_model]`, computed once), the same
eigenvalues `ov_scores` reads; copy_top1 (`ov_scores`, a seeded sample of source tokens) for the
induction heads and a seeded sample of other heads, both ways. Prints each induction head's
values and rank against the median head.
"""
from __future__ import annotations

import argparse
import json
import random

import torch

import headscope
from headscope.head_geometry.norm_gains import norm_gains
from headscope.head_geometry.ov_circuit import head_ov_weights, ov_scores

INDUCTION = [(18, 6), (17, 4), (17, 3)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-tokens", type=int, default=500)
    parser.add_argument("--n-heads", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results-ov-folded.json")
    args = parser.parse_args()
    loaded = headscope.load("smollm2-135m")
    model = loaded.model
    W_E = model.get_input_embeddings().weight.detach().float()  # (V, D)
    W_U = model.get_output_embeddings().weight.detach().float().T  # (D, V)
    gains, final = norm_gains(model)
    M = W_U @ W_E  # (D, D)
    rows = torch.randperm(W_E.shape[0], generator=torch.Generator().manual_seed(0))[:args.n_tokens]
    heads = [(l, h) for l in range(loaded.n_layers) for h in range(loaded.n_heads)]
    sampled = set(INDUCTION) | set(random.Random(0).sample([x for x in heads if x not in INDUCTION], args.n_heads))
    table = []
    for layer, head, V, O in head_ov_weights(model):
        row = {"layer": layer, "head": head}
        for name, Vf, Mf, Uf in (("plain", V, M, W_U),
                                 ("folded", gains[layer][:, None] * V, final[:, None] * M, final[:, None] * W_U)):
            eig = torch.linalg.eigvals((O @ Mf @ Vf).double())
            row[f"eig_{name}"] = float(eig.real.clamp(min=0).sum() / eig.abs().sum())
            if (layer, head) in sampled:
                row[f"top1_{name}"] = ov_scores(W_E, Vf, O, Uf, rows=rows)[0]
        table.append(row)
        if head == loaded.n_heads - 1:
            print(f"layer {layer} done", flush=True)
    import pandas as pd

    frame = pd.DataFrame(table)
    out = {"n_tokens": args.n_tokens, "sampled_heads": len(sampled), "norms_found": {"layers": sum(g is not None for g in gains.values()), "final": final is not None}}
    for name in ("plain", "folded"):
        eig = frame[f"eig_{name}"]
        top = frame[f"top1_{name}"].dropna()
        out[name] = {"eig_median": float(eig.median()), "eig_max": float(eig.max()),
                     "top1_median_sampled": float(top.median()),
                     "top10_eig": frame.sort_values(f"eig_{name}", ascending=False).head(10)[["layer", "head", f"eig_{name}"]].values.tolist()}
        for l, h in INDUCTION:
            r = frame[(frame.layer == l) & (frame["head"] == h)].iloc[0]
            out[name][f"{l}.{h}"] = {"eig": float(r[f"eig_{name}"]), "eig_rank": int((eig > r[f"eig_{name}"]).sum()) + 1,
                                     "top1": float(r[f"top1_{name}"]),
                                     "top1_rank_in_sample": int((top > r[f"top1_{name}"]).sum()) + 1}
    print(json.dumps(out, indent=1))
    json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
