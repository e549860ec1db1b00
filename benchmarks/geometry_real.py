"""Heads as subspaces on the shipped models:
`python benchmarks/geometry_real.py [smollm2-135m|minilm-l6] [DEVICE] [--normalize]`.

Prints time and peak memory, the JS approximation error, clusters, redundant pairs, the top
heads by Michel et al.'s importance, where SmolLM2's induction heads (18.6, 17.3, 17.4) rank,
and how many heads can be removed before the loss rises 10% in importance vs random order
(`--normalize`: the pruning order is the importance normalised per layer, as Michel et al. prune).
"""
import resource
import sys
import time

import headscope
from headscope.head_geometry.geometry_result import removable_heads

normalize = "--normalize" in sys.argv
args = [a for a in sys.argv[1:] if a != "--normalize"]
name = args[0] if args else "smollm2-135m"
device = args[1] if len(args) > 1 else "auto"
loaded = headscope.load(name, device=device)
start = time.time()
result = headscope.geometry(loaded, n_examples=8, seq_len=128, batch_size=4, pruning_steps=20, seeds=(0, 1, 2),
                            normalize=normalize)
print(f"{name} ({'normalised' if normalize else 'raw'} importance order): {time.time() - start:.1f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
heads, pairs = result.heads, result.pairs
print(f"JS approximation error (within-layer pairs): {result.approximation_error:.4f} bits")
print(f"clusters: {heads.cluster.nunique()} for {len(heads)} heads; redundant pairs: {int(pairs.redundant.sum())}")
print(f"mean within-layer overlap {pairs.overlap.mean():.3f} (chance {pairs.chance.iloc[0]:.3f}); "
      f"max {pairs.overlap.max():.3f}; mean JS within layers {pairs.js.mean():.3f} bits")
print(f"QK effective rank median {heads.qk_effective_rank.median():.1f}, OV {heads.ov_effective_rank.median():.1f}")
if result.curve is not None:
    ranked = heads.sort_values("importance_normalized" if normalize else "importance", ascending=False).reset_index(drop=True)
    print("top 10 by importance:", [f"{r.layer}.{r.head}" for r in ranked.head(10).itertuples()])
    for h in [(18, 6), (17, 3), (17, 4)]:
        idx = ranked.index[(ranked.layer == h[0]) & (ranked["head"] == h[1])]
        if len(idx):
            print(f"  {h[0]}.{h[1]} importance rank {int(idx[0]) + 1} of {len(ranked)}")
    print("removable before +10% loss:", removable_heads(result.curve))
    print(result.curve.to_string())
