"""A task: clean and corrupted prompts, the answers a model should give, and how to score a run.

- `Task(clean=, corrupted=, answer=, wrong=, attention_mask=None, metric="logit_diff", ...)`:
  token ids `[n, pos]` (right-padded), answer and wrong token ids `[n]` or sets `[n, k]` (-1 pads a
  set, each token once), at most `MAX_TASK_TOKENS` prompt positions, checked when made. `score(logits)` gives each example's metric of a run at its last real
  token, differentiably; `direction(W_U)` the logit difference's readout direction;
  `check_for(loaded)` refuses a model whose tokenizer the ids do not come from or whose
  positions the prompts do not fit (`positions_of(model)`); `save(path,
  force=False)` and `Task.load(path)` keep it as one JSON file (`is_task_file(bytes)`: one of
  them, which `force` may replace).
- `METRICS`: the metric names and their formulas (docs/tasks.md).
- `tokenizer_fingerprint(tokenizer)`: a short stable hash of a tokenizer's vocabulary and
  special tokens, so that a task remembers which tokenizer its ids belong to.

Metrics, at each example's `position` (the last real token, where the answer is predicted), with
`l` the logits there, `p = softmax(l)`, A the answer set and W the wrong set:
    logit_diff = mean_{a in A} l[a] - mean_{w in W} l[w]
    prob       = sum_{a in A} p[a]
    prob_diff  = sum_{a in A} p[a] - sum_{w in W} p[w]      (Hanna et al. 2023, greater-than)
    kl         = -KL(p_clean || p) = -sum_v p_clean[v] (log p_clean[v] - log p[v])   (0 on the clean run)
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch

from ..atomic import atomic_file
from ..errors import HeadscopeError
from ..hf.adapters import text_config

__all__ = ["Task", "METRICS", "tokenizer_fingerprint", "FORMAT", "is_task_file", "positions_of", "MAX_TASK_TOKENS"]

METRICS = {
    "logit_diff": "mean logit over the answer set - mean logit over the wrong set",
    "prob": "total probability of the answer set",
    "prob_diff": "probability of the answer set - probability of the wrong set",
    "kl": "-KL(p_clean || p_run) over the whole vocabulary",
}
FORMAT = "headscope-task"  # the "format" field of a saved task
# Prompt positions of one task (n x pos, padding included), clean or corrupted: 64 prompts of
# 16,384 tokens. Every method holds several activations of that size per layer at once.
MAX_TASK_TOKENS = 2**20
VERSION = 1
SETS = "[n] or [n, k]"


def is_task_file(data: bytes) -> bool:
    """Whether `data` is a task file `Task.save` writes: a JSON object whose "format" is `FORMAT`
    (what `force` may replace)."""
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and record.get("format") == FORMAT


def tokenizer_fingerprint(tokenizer) -> str:
    """`"<vocabulary size>-<12 hex digits>"`: SHA-256 of the token -> id map and the special tokens.

    The same vocabulary and special tokens give the same string in every process; any token,
    id or special token that differs gives another.
    """
    try:
        vocab = tokenizer.get_vocab()
    except AttributeError:
        raise HeadscopeError(f"a {type(tokenizer).__name__} is not a tokenizer (it has no get_vocab())") from None
    special = {role: getattr(tokenizer, f"{role}_token", None) for role in ("bos", "eos", "pad", "unk")}
    special["all"] = sorted(str(token) for token in getattr(tokenizer, "all_special_tokens", []) or [])
    text = json.dumps([sorted(vocab.items(), key=lambda item: item[1]), special], ensure_ascii=True)
    return f"{len(vocab)}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}"


def _ids(value, field: str, shapes: str) -> torch.Tensor:
    """`value` as an int64 CPU tensor of `shapes` ("[n, pos]", or "[n] or [n, k]" for answer sets)."""
    try:
        tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise HeadscopeError(f"Task {field} must be token ids {shapes} ({type(err).__name__}: {err})") from None
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise HeadscopeError(f"Task {field} must hold integer token ids, got dtype {tensor.dtype}")
    if tensor.dim() not in ((1, 2) if "[n]" in shapes else (2,)):
        raise HeadscopeError(f"Task {field} must be {shapes}, got shape {list(tensor.shape)}")
    return tensor.detach().to("cpu", torch.long)


def _first_bad_row(bad: torch.Tensor) -> int:
    """The first row of a boolean [n, ...] tensor with any True."""
    return int(bad.reshape(bad.shape[0], -1).any(1).nonzero()[0, 0])


def _check_set(field: str, ids: torch.Tensor, n: int) -> None:
    """One row per example; single ids non-negative; sets padded with -1, none empty."""
    if ids.shape[0] != n:
        raise HeadscopeError(f"Task {field} has {ids.shape[0]} rows, clean {n}: one per example")
    if ids.dim() == 1 and (ids < 0).any():
        raise HeadscopeError(f"Task {field} row {_first_bad_row(ids < 0)} is a negative token id")
    if ids.dim() == 2:
        if (ids < -1).any():
            raise HeadscopeError(f"Task {field} row {_first_bad_row(ids < -1)} holds an id below -1 (-1 pads a set)")
        if ids.shape[1] == 0 or (ids < 0).all(1).any():
            empty = 0 if ids.shape[1] == 0 else _first_bad_row((ids < 0).all(1))
            raise HeadscopeError(f"Task {field} row {empty} is an empty set: give at least one token id")
        twice = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] >= 0)  # [n, k, k]
        twice &= ~torch.eye(ids.shape[1], dtype=torch.bool)
        if twice.any():
            row = _first_bad_row(twice)
            token = int(ids[row][twice[row].any(1)][0])
            raise HeadscopeError(f"Task {field} row {row} lists token id {token} twice; a set holds each token once "
                                 f"(prob and prob_diff would count it twice)")


def _check_mask(mask: torch.Tensor, shape: list) -> torch.Tensor:
    """A 0/1 mask of the prompts' shape, each row real tokens then padding."""
    if list(mask.shape) != shape:
        raise HeadscopeError(f"Task attention_mask has shape {list(mask.shape)}, clean {shape}: they must be equal")
    if ((mask != 0) & (mask != 1)).any():
        raise HeadscopeError(f"Task attention_mask row {_first_bad_row((mask != 0) & (mask != 1))} holds a value other than 0 and 1")
    if (mask[:, 0] == 0).any():
        raise HeadscopeError(f"Task attention_mask row {_first_bad_row(mask[:, :1] == 0)} has no real token "
                             "first: prompts are right-padded, each with at least one real token")
    if (mask[:, 1:] > mask[:, :-1]).any():
        raise HeadscopeError(f"Task attention_mask row {_first_bad_row(mask[:, 1:] > mask[:, :-1])} has a real "
                             "token after padding: prompts are right-padded")
    return mask


@dataclass(frozen=True, eq=False)
class Task:
    """Clean and corrupted prompts with their answers and a metric (see the module docstring).

    Attributes:
        clean: token ids `[n, pos]`, right-padded.
        corrupted: token ids `[n, pos]`, the same shape; row i has as many real tokens as clean's.
        answer: token ids `[n]`, or sets `[n, k]` padded with -1.
        wrong: token ids `[n]`, or sets `[n, k]` padded with -1.
        attention_mask: `[n, pos]`, 1 for a real token, 0 for padding (right only); None: all real.
        metric: "logit_diff", "prob", "prob_diff" or "kl" (`METRICS`).
        name: what reports call the task.
        texts: per example {"clean", "corrupted", "answer", "wrong"} strings, for pages (or None).
        tokenizer: `tokenizer_fingerprint` of the tokenizer the ids come from (None: unknown).
    """

    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: torch.Tensor
    wrong: torch.Tensor
    attention_mask: Optional[torch.Tensor] = None
    metric: str = "logit_diff"
    name: str = "custom"
    texts: Optional[list] = None
    tokenizer: Optional[str] = None

    def __post_init__(self):
        clean = _ids(self.clean, "clean", "[n, pos]")
        corrupted = _ids(self.corrupted, "corrupted", "[n, pos]")
        answer = _ids(self.answer, "answer", SETS)
        wrong = _ids(self.wrong, "wrong", SETS)
        n, pos = clean.shape
        if n == 0 or pos == 0:
            raise HeadscopeError(f"Task clean must hold at least one example of at least one token, got shape {[n, pos]}")
        if n * pos > MAX_TASK_TOKENS:
            raise HeadscopeError(f"Task clean holds {n} x {pos} = {n * pos:,} prompt positions; a task holds at most "
                                 f"{MAX_TASK_TOKENS:,} (MAX_TASK_TOKENS): fewer or shorter prompts")
        if corrupted.shape != clean.shape:
            raise HeadscopeError(f"Task corrupted has shape {list(corrupted.shape)}, clean {[n, pos]}: they must be equal")
        for field, ids in (("clean", clean), ("corrupted", corrupted)):
            if (ids < 0).any():
                raise HeadscopeError(f"Task {field} row {_first_bad_row(ids < 0)} holds a negative token id")
        for field, ids in (("answer", answer), ("wrong", wrong)):
            _check_set(field, ids, n)
        answers, wrongs = _sets(answer), _sets(wrong)
        shared = ((answers[:, :, None] == wrongs[:, None, :]) & (answers[:, :, None] >= 0)).any(2).any(1)
        if shared.any():
            row = int(shared.nonzero()[0, 0])
            raise HeadscopeError(f"Task row {row}: answer and wrong share a token id; a token is one or the other")
        mask = None if self.attention_mask is None else _check_mask(_ids(self.attention_mask, "attention_mask", "[n, pos]"), [n, pos])
        if self.metric not in METRICS:
            raise HeadscopeError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        if self.texts is not None and len(self.texts) != n:
            raise HeadscopeError(f"Task texts has {len(self.texts)} entries, clean {n} rows: one per example")
        if self.texts is not None and not all(isinstance(entry, dict) for entry in self.texts):
            raise HeadscopeError("Task texts must be one dict per example ({'clean': ..., 'corrupted': ..., ...})")
        for field, value in (("clean", clean), ("corrupted", corrupted), ("answer", answer), ("wrong", wrong),
                             ("attention_mask", mask), ("name", str(self.name)),
                             ("texts", None if self.texts is None else [dict(t) for t in self.texts])):
            object.__setattr__(self, field, value)

    # --- shapes -----------------------------------------------------------------------------

    @property
    def n(self) -> int:
        """The number of examples."""
        return self.clean.shape[0]

    @property
    def mask(self) -> torch.Tensor:
        """`[n, pos]`: the attention mask, or ones when every token is real."""
        return self.attention_mask if self.attention_mask is not None else torch.ones_like(self.clean)

    @property
    def position(self) -> torch.Tensor:
        """`[n]`: each example's last real token, where the answer is predicted."""
        return self.mask.sum(1) - 1

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        kind = "sets" if self.answer.dim() == 2 else "tokens"
        return (f"Task(name={self.name!r}, n={self.n}, pos={self.clean.shape[1]}, metric={self.metric!r}, "
                f"answers as {kind}, tokenizer={self.tokenizer!r})")

    def subset(self, rows: Union[slice, Sequence[int], torch.Tensor]) -> "Task":
        """The task on some of its examples (a slice, indices in the order given, or a boolean mask), for batching."""
        if isinstance(rows, slice):
            index = torch.arange(self.n)[rows]
        else:
            index = torch.as_tensor(rows)
            index = (index.nonzero()[:, 0] if index.dtype == torch.bool else index.long()).reshape(-1)
            if index.numel() == 0:
                raise HeadscopeError("Task.subset needs at least one row")
            if (index >= self.n).any() or (index < -self.n).any():
                raise HeadscopeError(f"Task.subset row {int(index[(index >= self.n) | (index < -self.n)][0])} "
                                     f"is outside the task's {self.n} rows")
        texts = None if self.texts is None else [self.texts[i] for i in index.tolist()]
        mask = None if self.attention_mask is None else self.attention_mask[index]
        return replace(self, clean=self.clean[index], corrupted=self.corrupted[index], answer=self.answer[index],
                       wrong=self.wrong[index], attention_mask=mask, texts=texts)

    def with_metric(self, metric: str) -> "Task":
        """The same prompts and answers scored by another metric."""
        return replace(self, metric=metric)

    def inputs(self, which: str = "clean", device=None) -> dict:
        """`dict(input_ids=, attention_mask=)` of the clean or the corrupted prompts, for `model(**...)`."""
        if which not in ("clean", "corrupted"):
            raise HeadscopeError(f"Task.inputs takes which='clean' or 'corrupted', got {which!r}")
        ids = self.clean if which == "clean" else self.corrupted
        return {"input_ids": ids.to(device), "attention_mask": self.mask.to(device)}

    # --- scoring ----------------------------------------------------------------------------

    def score(self, logits: torch.Tensor, reference: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Each example's metric of a run (module docstring), differentiable in `logits`.

        Args:
            logits: `[n, pos, vocab]`, a run on this task's rows in order (`subset` for a batch).
            reference: the clean run's logits `[n, pos, vocab]`; needed by "kl" only.
        Returns:
            `[n]` on the logits' device, float32 (float64 for float64 logits).
        """
        final = self._at_position(logits, "logits")  # [n, vocab]
        if self.metric == "kl":
            if reference is None:
                raise HeadscopeError("the kl metric compares a run with the clean run: pass reference=<clean logits>")
            clean_log_p = torch.log_softmax(self._at_position(reference, "reference"), -1)
            return -(clean_log_p.exp() * (clean_log_p - torch.log_softmax(final, -1))).sum(-1)
        if self.metric == "logit_diff":
            return _set_mean(final, self.answer) - _set_mean(final, self.wrong)
        p = torch.softmax(final, -1)
        if self.metric == "prob":
            return _set_sum(p, self.answer)
        return _set_sum(p, self.wrong).neg().add(_set_sum(p, self.answer))  # prob_diff

    def _at_position(self, logits, what: str) -> torch.Tensor:
        """`[n, vocab]`: the logits at each example's position (half types as float32), after checking the shape."""
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise HeadscopeError(f"Task.score takes {what} [n, pos, vocab], got {shape}")
        if logits.shape[0] != self.n:
            raise HeadscopeError(f"Task.score got {what} for {logits.shape[0]} examples, the task has {self.n}; "
                                 "score a batch with task.subset(rows).score(...)")
        if logits.shape[1] <= int(self.position.max()):
            raise HeadscopeError(f"Task.score got {what} of {logits.shape[1]} positions; "
                                 f"the task's last real token is at {int(self.position.max())}")
        top = max(int(self.answer.max()), int(self.wrong.max()))
        if top >= logits.shape[2]:
            raise HeadscopeError(f"token id {top} of the task's answers is outside the {logits.shape[2]} logits")
        rows = torch.arange(self.n, device=logits.device)
        final = logits[rows, self.position.to(logits.device)]
        return final if final.dtype in (torch.float32, torch.float64) else final.float()  # half types: in float32

    def direction(self, unembed_weight: torch.Tensor) -> torch.Tensor:
        """`[n, d]`: mean_{a in A} W_U[a] - mean_{w in W} W_U[w], the direction the logit
        difference reads from the final residual stream (after the final norm): logit_diff = x . direction.

        Args:
            unembed_weight: `W_U` as `[vocab, d]` (an `nn.Linear` lm_head's weight).
        """
        if self.metric != "logit_diff":
            raise HeadscopeError(f"a readout direction exists for the logit_diff metric only; this task's is {self.metric!r}")
        if unembed_weight.dim() != 2:
            raise HeadscopeError(f"Task.direction takes the unembedding [vocab, d], got shape {list(unembed_weight.shape)}")
        top = max(int(self.answer.max()), int(self.wrong.max()))
        if top >= unembed_weight.shape[0]:
            raise HeadscopeError(f"token id {top} of the task's answers is outside the unembedding's {unembed_weight.shape[0]} rows")

        def mean_row(ids):
            sets = _sets(ids).to(unembed_weight.device)  # [n, k]
            weight = (sets >= 0).to(unembed_weight.dtype)
            rows = unembed_weight[sets.clamp(min=0)]  # [n, k, d]
            return (rows * weight[..., None]).sum(1) / weight.sum(1, keepdim=True)

        return mean_row(self.answer) - mean_row(self.wrong)

    # --- which model ------------------------------------------------------------------------

    def check_for(self, model_or_loaded: Any, tokenizer: Any = None) -> None:
        """HeadscopeError (one line) unless this task's ids fit the model: the tokenizer it was built
        with (when both fingerprints are known), prompts no wider than the model's positions
        (`positions_of`) and every id inside the model's vocabulary.

        Args:
            model_or_loaded: a `headscope.Loaded`, a `(model, tokenizer)` pair or a bare model.
            tokenizer: the model's tokenizer, when a bare model is passed.
        """
        model = model_or_loaded
        if isinstance(model_or_loaded, tuple) and len(model_or_loaded) == 2:
            model, tokenizer = model_or_loaded
        elif hasattr(model_or_loaded, "model") and hasattr(model_or_loaded, "tokenizer"):
            model, tokenizer = model_or_loaded.model, model_or_loaded.tokenizer
        if self.tokenizer is not None and tokenizer is not None:
            theirs = tokenizer_fingerprint(tokenizer)
            if theirs != self.tokenizer:
                raise HeadscopeError(f"task {self.name!r} was built for another tokenizer ({self.tokenizer}; this "
                                     f"model's is {theirs}); build it with this model's tokenizer")
        positions = positions_of(model)
        if positions is not None and self.clean.shape[1] > positions:
            longest = int(self.mask.sum(1).argmax())
            raise HeadscopeError(f"task {self.name!r} has prompts of {self.clean.shape[1]} positions (row {longest}: "
                                 f"{int(self.mask[longest].sum())} tokens); this model takes at most {positions}: "
                                 f"use shorter prompts")
        vocab = _vocab_size(model)
        top = max(int(self.clean.max()), int(self.corrupted.max()), int(self.answer.max()), int(self.wrong.max()))
        if vocab is not None and top >= vocab:
            raise HeadscopeError(f"task {self.name!r} holds token id {top}, outside this model's vocabulary of {vocab}; "
                                 "build it with this model's tokenizer")

    # --- files ------------------------------------------------------------------------------

    def save(self, path, *, force: bool = False) -> Path:
        """Write the task as one JSON file (ids as lists), atomically, under the rule every file
        headscope writes follows (`headscope.atomic`): an existing file is replaced only with
        `force`, and only when it is a task file (`is_task_file`).

        Args:
            path: the file to write.
            force: replace an existing task file.
        Returns:
            The path.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise HeadscopeError(f"Task.save needs a file to write, got {path!r}")
        record = {"format": FORMAT, "version": VERSION, "name": self.name, "metric": self.metric,
                  "tokenizer": self.tokenizer, "clean": self.clean.tolist(), "corrupted": self.corrupted.tolist(),
                  "answer": self.answer.tolist(), "wrong": self.wrong.tolist(),
                  "attention_mask": None if self.attention_mask is None else self.attention_mask.tolist(),
                  "texts": self.texts}
        with atomic_file(path, force=force, ours=is_task_file) as tmp:
            tmp.write_text(json.dumps(record, separators=(",", ":")), encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path) -> "Task":
        """Read a task written by `save`; HeadscopeError naming the file if it is not one."""
        path = Path(path)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise HeadscopeError(f"cannot read task file {path}: {err.strerror or type(err).__name__}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise HeadscopeError(f"{path} is not a task file (invalid JSON: {err})") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise HeadscopeError(f"{path} is not a task file (no \"format\": \"{FORMAT}\"; write one with Task.save)")
        if record.get("version") != VERSION:
            raise HeadscopeError(f"{path} is a task file of version {record.get('version')!r}; this headscope reads version {VERSION}")
        fields = ("clean", "corrupted", "answer", "wrong", "attention_mask", "metric", "name", "texts", "tokenizer")
        missing = [field for field in fields[:4] if field not in record]
        if missing:
            raise HeadscopeError(f"{path} is not a complete task file: no {missing[0]!r}")
        try:
            return cls(**{field: record[field] for field in fields if record.get(field) is not None})
        except HeadscopeError as err:
            raise HeadscopeError(f"{path}: {err}") from None
        except (TypeError, ValueError, RuntimeError) as err:
            raise HeadscopeError(f"{path} is not a valid task file ({type(err).__name__}: {err})") from None


def _sets(ids: torch.Tensor) -> torch.Tensor:
    """`[n, k]`: single answers as sets of one."""
    return ids[:, None] if ids.dim() == 1 else ids


def _set_mean(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`[n]`: the mean of `values[i, a]` over the ids a of row i's set (-1 left out)."""
    sets = _sets(ids).to(values.device)
    weight = (sets >= 0).to(values.dtype)
    return (values.gather(1, sets.clamp(min=0)) * weight).sum(1) / weight.sum(1)


def _set_sum(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`[n]`: the sum of `values[i, a]` over the ids a of row i's set (-1 left out)."""
    sets = _sets(ids).to(values.device)
    return (values.gather(1, sets.clamp(min=0)) * (sets >= 0).to(values.dtype)).sum(1)


def positions_of(model) -> Optional[int]:
    """The most positions a model takes (a `headscope.Loaded`'s or a transformers model's config:
    max_position_embeddings or n_positions), None where its config does not say."""
    context = getattr(model, "context_length", None)
    if isinstance(context, int):
        return context
    config = getattr(getattr(model, "model", model), "config", None)
    if config is None:
        return None
    config = text_config(config)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _vocab_size(model) -> Optional[int]:
    """The number of logits the model gives (its output embedding's rows), else its config's vocab_size."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(output, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    config = getattr(model, "config", None)
    for part in (config, getattr(config, "text_config", None)):
        if isinstance(getattr(part, "vocab_size", None), int):
            return part.vocab_size
    return None
