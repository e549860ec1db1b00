"""A training timeline's tables without a training run, as `headscope timeline` writes them:
`fake_timeline_tables()` gives `(scores, labels, steps)` for a 2-layer, 3-head model recorded at
steps 0, 10 and 20 (listed out of order in `steps`), where head 1.2 becomes an induction head
at step 20 and head 0.1 a previous-token head from step 10; every other head stays "none"."""
import pandas as pd


def fake_timeline_tables():
    """`(scores, labels, steps)` of a 2-layer, 3-head run recorded at steps 0, 10 and 20."""
    rows, labels = [], []
    for step in (0, 10, 20):
        for layer in (0, 1):
            for head in range(3):
                # head 1.2 climbs to induction at step 20; head 0.1 is previous-token from step 10
                ind = 0.9 if (layer, head, step) == (1, 2, 20) else 0.05 + 0.01 * head
                prev = 0.7 if (layer, head) == (0, 1) and step >= 10 else 0.1
                for det, score in (("induction", ind), ("previous_token", prev)):
                    rows.append({"step": step, "layer": layer, "head": head, "detector": det, "score": score,
                                 "ci_low": score - 0.01, "ci_high": score + 0.02, "control": 0.06})
                label = ("induction" if (layer, head, step) == (1, 2, 20) else
                         "previous_token" if (layer, head) == (0, 1) and step >= 10 else "none")
                labels.append({"step": step, "layer": layer, "head": head, "label": label})
    steps = pd.DataFrame({"step": [20, 0, 10], "icl_score": [-1.0, 0.0, -0.1], "loss": [3.0, 4.0, 3.9],
                          "train_loss": [3.1, float("nan"), 3.95]})
    return pd.DataFrame(rows), pd.DataFrame(labels), steps
