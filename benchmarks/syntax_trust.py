"""Do syntactic labels hold up? Controls, held-out data and random-init twins, measured.

    python benchmarks/syntax_trust.py [--models smollm2-135m minilm-l6] [--ud ../shared/ud/en_ewt-ud-dev-1000.conllu]

For each model it computes every head's predicted partners once per treebank (the trained
model, its random-init control twin, and a second random twin standing in for "an untrained
model under test"), then scores subsets with headscope's own scorer
(`headscope.syntax.crossfit.score_arcs`):
- significant (head, relation, direction) triples and syntactic labels, trained and random;
- stability: Jaccard overlap of the significant triples between the bundled treebank and the
  UD file, and between two seeded halves of the UD file, on the relations that are frequent
  (>= MIN_ARCS arcs in each cross-fitting half) in both sets compared;
- the time of the control's forward passes against the model's.
Prints one JSON line per model and writes them to benchmarks/results-syntax-trust.jsonl.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import headscope  # noqa: E402
from headscope.control import CONTROL_SEED_OFFSET, random_twin  # noqa: E402
from headscope.syntax.align import align_words  # noqa: E402
from headscope.syntax.baselines import predictor_hits  # noqa: E402
from headscope.syntax.crossfit import score_arcs  # noqa: E402
from headscope.syntax.run import _bos_to_add, _predict  # noqa: E402
from headscope.syntax.scoring import MIN_ARCS, arc_hits, collect_arcs  # noqa: E402
from headscope.treebank import bundled_treebank, read_conllu  # noqa: E402


def prepare(loaded, sentences):
    """Sentences that fit, with their alignments."""
    alignments = [align_words(loaded.tokenizer, s) for s in sentences]
    bos = _bos_to_add(loaded, alignments[0])
    alignments = [a.with_prefix(bos) for a in alignments] if bos else alignments
    context = loaded.context_length
    kept = [i for i, a in enumerate(alignments) if context is None or len(a.input_ids) <= context]
    return [sentences[i] for i in kept], [alignments[i] for i in kept]


def score(loaded, sentences, alignments, predictions, control_predictions, subset, seed=0):
    """(significant triples, labelled heads, eligible (relation, direction) pairs) on a subset."""
    sentences = [sentences[i] for i in subset]
    alignments = [alignments[i] for i in subset]
    arcs = collect_arcs(sentences, loaded.causal, [a.aligned for a in alignments])
    pieces = [[a.token_words.count(w) for w in range(a.n_words)] for a in alignments]
    table, heads = score_arcs(arc_hits(predictions[subset], arcs).flatten(1), arcs, len(sentences),
                              (loaded.n_layers, loaded.n_heads), predictor_hits(arcs, sentences, pieces),
                              arc_hits(control_predictions[subset], arcs).flatten(1), min_arcs=MIN_ARCS, seed=seed)
    significant = table[table.significant]
    triples = {(int(r.layer), int(r.head), r.relation, r.direction) for r in significant.itertuples()}
    labelled = {(int(r.layer), int(r.head)): r.label for r in heads.itertuples() if r.label != "none"}
    eligible = set(zip(table[table.held_out_margin.notna()].relation, table[table.held_out_margin.notna()].direction))
    return triples, labelled, eligible, table


def margin_agreement(first, second, pairs) -> float:
    """Spearman correlation of accuracy - baseline over every head and shared pair (all data)."""
    keys = ["layer", "head", "relation", "direction"]
    both = first.assign(margin=first.accuracy - first.baseline)[keys + ["margin"]].merge(
        second.assign(margin=second.accuracy - second.baseline)[keys + ["margin"]], on=keys)
    both = both[[(r, d) in pairs for r, d in zip(both.relation, both.direction)]]
    return round(float(both.margin_x.rank().corr(both.margin_y.rank())), 3)


def jaccard(a, b, pairs):
    a = {t for t in a if t[2:] in pairs}
    b = {t for t in b if t[2:] in pairs}
    return len(a & b) / max(1, len(a | b)), len(a), len(b)


def run(name, ud_path, batch_size=16, cache=None):
    loaded = headscope.load(name, device="cpu")
    control = random_twin(loaded, 0 + CONTROL_SEED_OFFSET)
    untrained = random_twin(loaded, 7)  # a random model under test, not the control
    result = {"model": name}
    preds = {}
    timing = {}
    for tb_name, raw in (("bundled", bundled_treebank()), ("ud", read_conllu(ud_path))):
        sentences, alignments = prepare(loaded, raw)
        for who, model in (("trained", loaded), ("control", control), ("untrained", untrained)):
            cached = Path(cache or "/nonexistent") / f"{name}-{tb_name}-{who}.pt"
            if cached.exists():
                preds[tb_name, who] = torch.load(cached)
                continue
            t = time.perf_counter()
            preds[tb_name, who] = _predict(model, alignments, batch_size, None)
            timing[f"{tb_name}_{who}_s"] = round(time.perf_counter() - t, 1)
            if cache:
                Path(cache).mkdir(parents=True, exist_ok=True)
                torch.save(preds[tb_name, who], cached)
        preds[tb_name] = (sentences, alignments)
    result["timing"] = timing
    out = {}
    for tb_name in ("bundled", "ud"):
        sentences, alignments = preds[tb_name]
        everything = list(range(len(sentences)))
        for who in ("trained", "untrained"):
            triples, labelled, eligible, table = score(loaded, sentences, alignments, preds[tb_name, who],
                                                       preds[tb_name, "control"], everything)
            out[tb_name, who] = (triples, labelled, eligible, table)
            labels = sorted({label for label in labelled.values()})
            result[f"{tb_name}_{who}"] = {"sentences": len(sentences), "significant_triples": len(triples),
                                          "labelled_heads": len(labelled), "relations": labels}
    trained_bundled, trained_ud = out["bundled", "trained"], out["ud", "trained"]
    shared = trained_bundled[2] & trained_ud[2]
    result["jaccard_bundled_vs_ud"] = jaccard(trained_bundled[0], trained_ud[0], shared)
    result["triples"] = {"bundled": sorted(trained_bundled[0]), "ud": sorted(trained_ud[0]), "shared_pairs": len(shared)}
    result["margin_spearman_bundled_vs_ud"] = margin_agreement(trained_bundled[3], trained_ud[3], shared)
    sentences, alignments = preds["ud"]
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(11)).tolist()
    half_a, half_b = sorted(order[: len(order) // 2]), sorted(order[len(order) // 2:])
    a = score(loaded, sentences, alignments, preds["ud", "trained"], preds["ud", "control"], half_a)
    b = score(loaded, sentences, alignments, preds["ud", "trained"], preds["ud", "control"], half_b)
    result["jaccard_ud_halves"] = jaccard(a[0], b[0], a[2] & b[2])
    result["triples"].update(ud_half_a=sorted(a[0]), ud_half_b=sorted(b[0]))
    table = trained_ud[3]
    best = (table[table.significant].sort_values("held_out_margin", ascending=False)
            .drop_duplicates("relation").head(12))
    result["ud_best_significant"] = [
        {"relation": r.relation, "head": f"{r.layer}.{r.head}", "direction": r.direction,
         "accuracy": round(r.accuracy, 3), "baseline": round(r.baseline, 3), "baseline_kind": r.baseline_kind,
         "held_out_margin": round(r.held_out_margin, 3), "ci": [round(r.ci_low, 3), round(r.ci_high, 3)], "n": int(r.n)}
        for r in best.itertuples()]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm-l6", "smollm2-135m"])
    parser.add_argument("--ud", default=str(ROOT.parent / "shared" / "ud" / "en_ewt-ud-dev-1000.conllu"))
    parser.add_argument("--cache", help="keep predicted partners here and reuse them (a folder)")
    args = parser.parse_args()
    with open(ROOT / "benchmarks" / "results-syntax-trust.jsonl", "a") as sink:
        for name in args.models:
            result = run(name, args.ud, cache=args.cache)
            line = json.dumps(result, default=list)
            print(line, flush=True)
            sink.write(line + "\n")


if __name__ == "__main__":
    main()
