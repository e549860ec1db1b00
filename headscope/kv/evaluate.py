"""What a KV-cache policy keeps and loses: needle accuracy, loss and cache bytes, against baselines.

`kv_evaluate(loaded, policy)` runs the model once per condition and needle prompt, with the
condition's streaming key/value heads restricted to their first `sink` and last `recent` keys
(`headscope.hf.streaming.stream_heads`, through headscope's kernel; full heads unchanged), and
measures, per condition and prompt length T:

- needle accuracy: the share of answer tokens the model predicts (argmax, teacher-forced) on
  needle prompts built from `HELD_OUT_NEEDLES` and `HELD_OUT_QUESTION`, sentences and a question
  the retrieval detector never ranks heads on (it reads `headscope.probes.needle.NEEDLES`);
  averaged over the prompts of that length;
- loss: the mean next-token cross-entropy (nats) over the haystack positions before the needle,
  natural text from the bundled corpus that the needle cannot influence (causal attention),
  predictions from position sink + recent on (earlier ones are the same under every policy),
  pooled over the prompts of that length;
- KV bytes a real cache would keep for one sequence of T tokens:
  2 (keys and values) x d_head x bytes per value (the model's dtype) x
  (full heads x T + streaming heads x min(T, sink + recent)), and that as a share of the full cache.

Conditions, at each keep fraction (default 0.1, 0.25, 0.5, and the policy's own): the policy's
ranking ("headscope"), its reverse (the lowest-ranked heads kept), `n_random` draws of random
key/value heads (the same number of full heads); and once each: every head streaming
("streaming", StreamingLLM) and full attention ("full"). Every condition keeps
n_full = max(1, round(keep x layers x kv_heads)) heads full.

- `kv_evaluate(loaded, policy, ...)` -> `KVEvaluation` (`.table`, `.examples`, `.meta`,
  `.summary()`, `.save(dir)`).
- `conditions(policy, keeps, n_random, seed)`: the conditions as `(kind, keep, draw, full mask)`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..atomic import atomic_dir, write_card
from ..errors import HeadscopeError
from ..checks import check_count, check_loaded
from ..hf.adapters import family_of, head_sizes
from ..hf.streaming import stream_heads
from ..probes.needle import NeedleExample, needle_probe
from .report import render_kv_html
from .policy import KVPolicy, cache_bytes, check_cached_per_head, check_keep, full_count, ranking_order

__all__ = ["HELD_OUT_NEEDLES", "HELD_OUT_QUESTION", "KEEPS", "KVEvaluation", "kv_evaluate", "conditions",
           "check_policy_fits", "RETAINED"]

# Written for this evaluation, apart from the retrieval detector's NEEDLES: specific, one sentence each.
HELD_OUT_NEEDLES = (
    "The night ferry to Quellport leaves at twenty past four from the pier behind the old salt warehouse.",
    "Doctor Yusuf Brannock stores the museum's spare keys in a tin of peppermints on the top shelf.",
    "The recipe for Granny Ottoline's plum cake calls for nine cardamom pods and a cup of cold tea.",
    "The orange kite that won the Harwick beach festival was built from umbrella cloth and fishing line.",
    "Every Tuesday the lighthouse keeper on Solway Rock plays the accordion for the passing seals.",
    "The combination of the blue safe in the Pemberton attic is eleven, thirty-two and seven.",
)
HELD_OUT_QUESTION = "\n\nQuestion: One sentence in the text above does not belong there. Quote it exactly.\nAnswer:"
KEEPS = (0.1, 0.25, 0.5)
RETAINED = 0.9  # the share of full attention's needle accuracy a keep fraction must retain

Progress = Callable[[str, int, int], None]


def conditions(policy: KVPolicy, keeps: Sequence[float] = KEEPS, n_random: int = 5,
               seed: int = 0) -> list[tuple[str, float, int, np.ndarray]]:
    """`(kind, keep, draw, full [layer, kv_head] bool)` of every condition (see the module docstring).

    kind is "full", "streaming", "headscope", "reverse" or "random" (draw 1..n_random; 0 for
    the others); keep is 1.0 for full and 0.0 for streaming.
    """
    check_count("n_random", n_random)
    shape, size = policy.values.shape, policy.values.size
    order = ranking_order(policy.values)
    rng = np.random.default_rng(seed)
    out = [("full", 1.0, 0, np.ones(shape, dtype=bool)), ("streaming", 0.0, 0, np.zeros(shape, dtype=bool))]
    for keep in sorted({check_keep(k) for k in keeps}):
        n = full_count(keep, size)

        def mask(heads) -> np.ndarray:
            full = np.zeros(size, dtype=bool)
            full[np.asarray(heads)] = True
            return full.reshape(shape)

        out.append(("headscope", keep, 0, mask(order[:n])))
        out.append(("reverse", keep, 0, mask(order[::-1][:n])))
        out += [("random", keep, d + 1, mask(rng.permutation(size)[:n])) for d in range(n_random)]
    return out


def check_policy_fits(loaded, policy: KVPolicy) -> None:
    """HeadscopeError unless the policy has the model's layers, key/value heads and query heads."""
    _, n_heads, n_kv, _ = head_sizes(loaded.model.config)
    model_shape, policy_shape = (loaded.n_layers, n_kv, n_heads), (policy.n_layers, policy.n_kv_heads, policy.n_heads)
    if model_shape != policy_shape:
        raise HeadscopeError(f"the policy is for {policy_shape[0]} layers x {policy_shape[1]} key/value heads "
                             f"({policy_shape[2]} query heads), but {loaded.name} has {model_shape[0]} x {model_shape[1]} "
                             f"({model_shape[2]}): a policy of another model")


def _positions(example: NeedleExample, start: int) -> torch.Tensor:
    """Positions whose logits are needed: the natural-text predictions, then the answer queries."""
    text = torch.arange(start, max(start, example.needle.start - 1))  # predicts tokens before the needle
    return torch.cat([text, example.queries])


@torch.no_grad()
def _run(loaded, example: NeedleExample, streaming: list, sink: int, recent: int) -> tuple[float, float, int]:
    """(needle accuracy, summed natural-text loss, natural-text positions) of one prompt."""
    ids = example.input_ids[None].to(loaded.device)
    wanted = _positions(example, sink + recent)
    n_text = len(wanted) - len(example.queries)
    with stream_heads(loaded.model, streaming, sink, recent):
        try:
            logits = loaded.model(input_ids=ids, logits_to_keep=wanted.to(loaded.device)).logits[0].float()
        except TypeError:  # a model class without logits_to_keep
            logits = loaded.model(input_ids=ids).logits[0, wanted.to(loaded.device)].float()
    targets = example.input_ids[wanted + 1].to(logits.device)
    answer = logits[n_text:].argmax(-1) == targets[n_text:]
    loss = torch.nn.functional.cross_entropy(logits[:n_text], targets[:n_text], reduction="sum") if n_text else 0.0
    return float(answer.float().mean()), float(loss), n_text


@dataclass
class KVEvaluation:
    """What `kv_evaluate` returns.

    Attributes:
        table: one row per condition and length: kind, keep, draw, length, full_heads,
            kv_bytes, kv_share (of the full cache), accuracy, loss, n_prompts, n_answer_tokens,
            n_text_tokens.
        examples: one row per condition and prompt: kind, keep, draw, length, depth, needle,
            accuracy, loss_sum, n_text_tokens.
        meta: model, policy, settings, sample sizes.
    """

    table: object
    examples: object
    meta: dict = field(default_factory=dict)

    def summary(self, retained: float = RETAINED) -> object:
        """Per length: full and streaming accuracy, and for headscope, reverse and the median
        random draw the smallest keep whose accuracy is >= `retained` x full's (NaN: none).
        The median random draw at a keep is the median accuracy over the draws there. Also
        headscope's accuracy at each keep beside the best and median random draw's."""
        import pandas as pd

        rows = []
        t = self.table
        for length in sorted(t.length.unique()):
            part = t[t.length == length]
            full = float(part[part.kind == "full"].accuracy.iloc[0])
            row = {"length": int(length), "full_accuracy": full,
                   "streaming_accuracy": float(part[part.kind == "streaming"].accuracy.iloc[0])}
            for kind in ("headscope", "reverse", "random"):
                per_keep = part[part.kind == kind].groupby("keep").accuracy.median()
                good = per_keep[per_keep >= retained * full]
                row[f"{kind}_smallest_keep"] = float(good.index.min()) if len(good) else float("nan")
            for keep, acc in part[part.kind == "headscope"].set_index("keep").accuracy.items():
                random = part[(part.kind == "random") & (part.keep == keep)].accuracy
                row[f"keep {keep:g}: headscope"] = float(acc)
                row[f"keep {keep:g}: random median"] = float(random.median())
                row[f"keep {keep:g}: random best"] = float(random.max())
            rows.append(row)
        return pd.DataFrame(rows)

    @classmethod
    def load(cls, folder) -> "KVEvaluation":
        """Read a folder `save` wrote (no model, no forward pass)."""
        import pandas as pd

        folder = Path(folder)
        if not (folder / "results.csv").is_file():
            raise HeadscopeError(f"{folder} has no results.csv: not a kv-eval folder")
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8")) if (folder / "meta.json").is_file() else {}
        examples = pd.read_csv(folder / "examples.csv") if (folder / "examples.csv").is_file() else pd.DataFrame()
        return cls(pd.read_csv(folder / "results.csv"), examples, meta)

    def write_into(self, folder, plotlyjs: str = "embed") -> None:
        """Write `results.csv`, `examples.csv`, `summary.csv`, `meta.json` and `index.html` into
        an existing (temporary) folder."""
        folder = Path(folder)
        page = render_kv_html(self, plotlyjs)
        self.table.to_csv(folder / "results.csv", index=False)
        self.examples.to_csv(folder / "examples.csv", index=False)
        self.summary().to_csv(folder / "summary.csv", index=False)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=1), encoding="utf-8")
        (folder / "index.html").write_text(page, encoding="utf-8")
        model = str(self.meta.get("model", ""))
        write_card(folder, "kv evaluation", title=model or "?", model=model, headline=self.headline())

    def headline(self) -> list:
        """`(name, value)` pairs for a list of reports: the policy, and at its keep fraction the
        needle accuracy of its heads beside the median random draw and full attention, per length."""
        policy = self.meta.get("policy", {})
        keep = policy.get("keep")
        if keep is None:
            return [("policy", "?")]
        out = [("policy", f"{policy.get('rank_by', '?')}, keep {keep:g}")]
        for row in self.summary().to_dict("records"):
            ours, random = row.get(f"keep {keep:g}: headscope"), row.get(f"keep {keep:g}: random median")
            if ours is not None:
                out.append((f"needle accuracy at {row['length']} tokens",
                            f"{ours:.3f} (random median {random:.3f}, full {row['full_accuracy']:.3f})"))
        return out

    def save(self, folder, force: bool = False, plotlyjs: str = "embed", protect=()) -> Path:
        """`write_into` a folder written atomically (a temporary name renamed into place)."""
        with atomic_dir(folder, force=force, protect=protect) as tmp:
            self.write_into(tmp, plotlyjs)
        return Path(folder)


def kv_evaluate(loaded, policy: KVPolicy, lengths: Sequence[int] = (4096, 8192), depths: Sequence[float] = (0.5,),
                n_needles: int = 1, keeps: Sequence[float] = KEEPS, n_random: int = 5, seed: int = 0,
                progress: Optional[Progress] = None) -> KVEvaluation:
    """Measure a KV-cache policy against its reverse, random heads, all-streaming and full attention.

    Args:
        loaded: a `headscope.load(...)` result of a causal model of the policy's shape.
        policy: a `KVPolicy` (`headscope.kv_policy`, or read from a file); its ranking and its
            sink and recent sizes are used at every keep fraction.
        lengths: needle prompt lengths in tokens.
        depths, n_needles: needle positions (shares of the haystack) and needles per (length,
            depth): `len(depths) * n_needles` prompts per length, from `HELD_OUT_NEEDLES`.
        keeps: keep fractions compared (the policy's own is added).
        n_random: random draws per keep fraction.
        seed: the needle prompts and the random draws.
        progress: `fn(stage, done, total)` after each forward pass.
    Returns:
        A `KVEvaluation` (formulas in the module docstring).
    """
    check_loaded(loaded, "kv_evaluate")
    import pandas as pd

    if not loaded.causal:
        raise HeadscopeError(f"kv_evaluate needs a causal model (a KV cache, needle prompts); {loaded.name} is "
                             f"bidirectional")
    check_cached_per_head(family_of(loaded.model.config))
    check_policy_fits(loaded, policy)
    for length in lengths:
        loaded.check_fits("a needle prompt", int(length))
    examples = needle_probe(loaded.tokenizer, [int(n) for n in lengths], depths, n_needles, seed,
                            needles=HELD_OUT_NEEDLES, question=HELD_OUT_QUESTION)
    todo = conditions(policy, sorted(set(keeps) | {policy.keep}), n_random, seed)
    d_head = head_sizes(loaded.model.config)[3]
    bytes_per_value = next(loaded.model.parameters()).element_size()
    per_example, total, done = [], len(todo) * len(examples), 0
    for kind, keep, draw, full in todo:
        streaming = [(int(l), int(h)) for l, h in zip(*np.nonzero(~full))]
        for example in examples:
            accuracy, loss_sum, n_text = _run(loaded, example, streaming, policy.sink, policy.recent)
            per_example.append({"kind": kind, "keep": keep, "draw": draw, "length": example.length,
                                "depth": example.depth, "needle": example.needle_index, "accuracy": accuracy,
                                "loss_sum": loss_sum, "n_text_tokens": n_text,
                                "n_answer_tokens": len(example.queries), "full_heads": int(full.sum())})
            done += 1
            if progress:
                progress("kv conditions", done, total)
    frame = pd.DataFrame(per_example)
    rows = []
    for (kind, keep, draw, length), part in frame.groupby(["kind", "keep", "draw", "length"], sort=False):
        full_heads = int(part.full_heads.iloc[0])
        mask = np.arange(policy.values.size) < full_heads  # only the count matters
        kv_bytes = cache_bytes(mask, int(length), policy.sink, policy.recent, d_head, bytes_per_value)
        full_bytes = cache_bytes(np.ones(policy.values.size, bool), int(length), policy.sink, policy.recent, d_head,
                                 bytes_per_value)
        n_text = int(part.n_text_tokens.sum())
        rows.append({"kind": kind, "keep": keep, "draw": draw, "length": int(length), "full_heads": full_heads,
                     "kv_bytes": int(kv_bytes), "kv_share": kv_bytes / full_bytes, "accuracy": float(part.accuracy.mean()),
                     "loss": float(part.loss_sum.sum() / n_text) if n_text else float("nan"), "n_prompts": len(part),
                     "n_answer_tokens": int(part.n_answer_tokens.sum()), "n_text_tokens": n_text})
    meta = {"model": loaded.name, "policy": {"model": policy.model, "rank_by": policy.rank_by, "keep": policy.keep,
                                             "sink": policy.sink, "recent": policy.recent,
                                             "layers": policy.n_layers, "kv_heads": policy.n_kv_heads},
            "lengths": sorted({e.length for e in examples}), "depths": list(depths), "n_needles": n_needles,
            "prompts_per_length": len(depths) * n_needles, "keeps": sorted(set(keeps) | {policy.keep}),
            "n_random": n_random, "seed": seed, "retained": RETAINED, "d_head": d_head,
            "bytes_per_value": bytes_per_value, "needles": "HELD_OUT_NEEDLES (headscope.kv.evaluate)"}
    return KVEvaluation(pd.DataFrame(rows), frame.drop(columns=["full_heads", "n_answer_tokens"]), meta)
