"""Treebanks for the syntactic tests: a small one written here, and real UD English where it lies.

- `small_conllu()`: 30 hand-annotated sentences "the <subject> <verb> <object> ." (det, nsubj,
  root, obj, punct) as CoNLL-U text: too few arcs per relation for the held-out significance rule.
- `UD`: real UD English (en_ewt dev, 1,000 sentences) in the team's shared folder beside the
  clone (`../shared/ud`; CI has it); `needs_ud`: the mark that skips a test, with that reason,
  where it is absent.
"""
from pathlib import Path

import pytest

SUBJECTS = ["cat", "dog", "bird", "fox", "cow", "hen"]
VERBS = ["sees", "likes", "hears", "finds", "eats"]
OBJECTS = ["mice", "seeds", "grass", "fish", "bugs"]

UD = Path(__file__).resolve().parents[3] / "shared" / "ud" / "en_ewt-ud-dev-1000.conllu"
needs_ud = pytest.mark.skipif(not UD.exists(), reason=f"real UD English not found at {UD} (../shared/ud beside the clone)")


def small_conllu() -> str:
    """30 sentences "the <subject> <verb> <object> ." (det, nsubj, root, obj, punct)."""
    blocks = []
    for i in range(30):
        subject, verb, obj = SUBJECTS[i % 6], VERBS[i % 5], OBJECTS[(i * 7) % 5]
        words = [("the", "DET", 2, "det"), (subject, "NOUN", 3, "nsubj"), (verb, "VERB", 0, "root"),
                 (obj, "NOUN", 3, "obj"), (".", "PUNCT", 3, "punct")]
        lines = [f"# sent_id = small-{i}", f"# text = the {subject} {verb} {obj}."]
        for k, (form, upos, head, relation) in enumerate(words, start=1):
            misc = "SpaceAfter=No" if k == 4 else "_"
            lines.append("\t".join([str(k), form, form, upos, "_", "_", str(head), relation, "_", misc]))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"
