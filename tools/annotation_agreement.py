"""Agreement of a blind annotation with gold trees: UAS, LAS and where they differ.

    python tools/annotation_agreement.py GOLD.conllu MINE.conllu|MINE.tsv [--export OUT.tsv]

MINE may be a CoNLL-U file or the word-free TSV this script exports (sent_id, word index,
head, relation per line), so an annotation of a licensed treebank can be kept without its text.
UAS = share of words (punctuation included, as in CoNLL shared tasks) whose head matches;
LAS = head and relation (subtypes dropped: "nmod:poss" counts as "nmod", as CoNLL 2018's LAS).
Prints the overall scores, LAS per gold relation, and the most frequent confusions.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headscope.probes.conllu import read_conllu  # noqa: E402


def read_trees(path: str) -> dict:
    """sent_id -> (heads, relations)."""
    if path.endswith(".tsv"):
        trees: dict = {}
        for line in Path(path).read_text().splitlines()[1:]:
            sent_id, _, head, relation = line.split("\t")
            heads, relations = trees.setdefault(sent_id, ([], []))
            heads.append(int(head))
            relations.append(relation)
        return {k: (tuple(h), tuple(r)) for k, (h, r) in trees.items()}
    return {s.sent_id: (s.heads, s.relations) for s in read_conllu(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gold")
    parser.add_argument("mine")
    parser.add_argument("--export", help="write MINE as a word-free TSV")
    args = parser.parse_args()
    gold, mine = read_trees(args.gold), read_trees(args.mine)
    if args.export:
        lines = ["sent_id\tword\thead\trelation"]
        lines += [f"{sid}\t{i + 1}\t{h}\t{r}" for sid, (heads, rels) in mine.items() for i, (h, r) in enumerate(zip(heads, rels))]
        Path(args.export).write_text("\n".join(lines) + "\n")
    words = heads_ok = labels_ok = 0
    per_relation = collections.Counter()
    per_relation_ok = collections.Counter()
    confusions = collections.Counter()
    for sent_id, (my_heads, my_rels) in mine.items():
        gold_heads, gold_rels = gold[sent_id]
        if len(gold_heads) != len(my_heads):
            raise SystemExit(f"{sent_id}: {len(my_heads)} words, gold has {len(gold_heads)}")
        for gh, gr, mh, mr in zip(gold_heads, gold_rels, my_heads, my_rels):
            base_g, base_m = gr.split(":")[0], mr.split(":")[0]
            words += 1
            per_relation[base_g] += 1
            heads_ok += gh == mh
            if gh == mh and base_g == base_m:
                labels_ok += 1
                per_relation_ok[base_g] += 1
            elif gh != mh or base_g != base_m:
                confusions[(base_g, base_m if gh == mh else f"{base_m} (other head)")] += 1
    print(f"{len(mine)} sentences, {words} words: UAS {heads_ok / words:.3f}, LAS {labels_ok / words:.3f}")
    print("LAS per gold relation (n >= 10):")
    for relation, n in per_relation.most_common():
        if n >= 10:
            print(f"  {relation:<10} {per_relation_ok[relation] / n:.3f}  (n={n})")
    print("most frequent disagreements (gold -> mine):")
    for (g, m), n in confusions.most_common(15):
        print(f"  {g} -> {m}: {n}")


if __name__ == "__main__":
    main()
