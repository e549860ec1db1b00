"""Heads over training: `Timeline.record(model, step)` scores a model as it trains.

Each record runs `headscope.analyze` (lazy detectors, no OV table, no explorer maps) on small
probes built once (`headscope.training.timeline_probes.timeline_probes`: the same examples at every step,
so steps compare), against one control for the whole timeline, and Olsson et al.'s
in-context-learning score (`headscope.training.icl`). Training is left untouched: the model's
train/eval mode of every module, the grad mode and the random states (torch CPU, CUDA when
initialised, Python's `random`, numpy) are saved before and restored after, and nothing runs
with gradients, so a training run's losses are the same with and without records.

- `Timeline(detectors=None, probes=None, ...)`, `.record(model, step, train_loss=None)` -> the
  step's summary (`headscope/induction_max`, `headscope/icl_score`, ...), `.save(out)`,
  `Timeline.resume(out, ...)`.
- Tables: `.scores` (`TIMELINE_COLUMNS`: step, layer, head, detector, score, ci_low, ci_high,
  control), `.labels` (step, layer, head, label), `.steps` (step, icl_score, loss, train_loss).
- Under torchrun (DDP) every rank calls `record` at the same step and takes part in scoring
  (`analyze` deals the probe batches and gathers, `headscope.loading.distributed`); only rank 0
  should write (`HeadscopeCallback` does that). A model sharded with FSDP is refused.

Control (`control=`): "initial" (default) is the model as it was at its first record when that
record is step 0 (a frozen copy), else the random-init twin (`headscope.loading.control`);
"random-init", None, or a `Loaded` as for `analyze`.
"""
from __future__ import annotations

import copy
import json
import numbers
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
import pandas as pd
import torch

from ..analysis.analyze import analyze
from ..atomic import atomic_dir
from ..errors import HeadscopeError
from ..loading.control import random_twin, CONTROL_SEED_OFFSET
from ..loading.loader import Loaded
from .icl import icl_score
from .timeline_probes import IdTokenizer, has_text_tokenizer, timeline_probes

__all__ = ["Timeline", "TIMELINE_COLUMNS", "LABEL_COLUMNS", "STEP_COLUMNS", "DEFAULT_DETECTORS", "untouched",
           "unwrap"]

# site: the head's attention module, as in an analysis's tables (timelines saved before it read it as missing)
TIMELINE_COLUMNS = ["step", "layer", "head", "detector", "score", "ci_low", "ci_high", "control", "site"]
LABEL_COLUMNS = ["step", "layer", "head", "label", "site"]
STEP_COLUMNS = ["step", "icl_score", "loss", "train_loss"]
DEFAULT_DETECTORS = ("previous_token", "induction", "duplicate_token", "sink", "uniform")
FILES = {"scores": "timeline.csv", "labels": "labels.csv", "steps": "steps.csv"}


def unwrap(model):
    """The module inside a DDP (or DataParallel) wrapper; HeadscopeError for FSDP."""
    name = type(model).__name__
    if "FullyShardedDataParallel" in name or name.startswith("FSDP") or hasattr(model, "_fsdp_wrapped_module"):
        raise HeadscopeError("headscope timelines do not support FSDP-sharded models; score a gathered copy or use DDP")
    return getattr(model, "module", model) if name in ("DistributedDataParallel", "DataParallel") else model


@contextmanager
def untouched(model):
    """Run the block without gradients and give back the model's modes and every random state."""
    modes = [(module, module.training) for module in model.modules()]
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        for module, mode in modes:
            module.training = mode


class Timeline:
    """Head scores, labels and the ICL score of one model, step after step.

    Args:
        detectors: registered detector names (default `DEFAULT_DETECTORS`: the lazy ones, about
            one forward pass per probe).
        probes: built `ProbeSet`s or probe settings, built on the first record; a kind not
            given takes `timeline_probes`' (at most 64 tokens).
        tokenizer: the model's tokenizer; None (or one whose ids do not fit the model) builds
            the probes from token ids (`IdTokenizer`).
        icl_data: `[example, pos]` token ids for the ICL score (held-out training data is
            best); default: the text probe's windows when there is a text tokenizer, else the
            repeated probe's sequences.
        control: see the module docstring.
        seed: probes and bootstrap; batch_size: examples per forward pass.
    """

    def __init__(self, detectors: Optional[Iterable[str]] = None, probes: Optional[Iterable] = None, *,
                 tokenizer=None, icl_data: Optional[torch.Tensor] = None, control="initial", seed: int = 0,
                 batch_size: int = 16, n_examples: int = 16):
        self.detectors = list(detectors or DEFAULT_DETECTORS)
        self.probes = None if probes is None else list(probes)
        self._built = False
        self.tokenizer = tokenizer
        self.icl_data = icl_data
        self.control = control
        self.seed, self.batch_size, self.n_examples = seed, batch_size, n_examples
        self._twin: Optional[Loaded] = None
        self._scores, self._labels, self._steps = [], [], []
        self._shape: Optional[tuple] = None
        self._control_path: Optional[Path] = None
        self.processes = 1  # torchrun processes that scored the last record
        self._kept_control = True  # write_into saves the step-0 control (the CLI's series need not)

    # --- recording -------------------------------------------------------------------------

    def record(self, model, step: int, train_loss: Optional[float] = None) -> dict:
        """Score `model` (a transformers causal LM, DDP-wrapped or not) at training step `step`.

        Returns:
            The step's summary for a logger: `headscope/<detector>_max` (best head's score),
            `headscope/<detector>_heads` (heads with that label), `headscope/icl_score`.
        """
        inner = unwrap(model)
        if not hasattr(inner, "config") or not callable(getattr(inner, "modules", None)):
            raise HeadscopeError(f"Timeline.record needs the transformers model being trained, got {type(model).__name__}")
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise HeadscopeError(f"Timeline.record needs the training step as an integer of at least 0, got {step!r}")
        step = int(step)
        if any(int(s["step"]) == step for s in self._steps):
            return self.summary(step)  # a step recorded twice (a save right after a record) scores once
        with untouched(inner):
            loaded = self._loaded(inner)
            if not self._built:
                self.probes = self._build_probes(loaded)
            control = self._control_for(inner, loaded, step)
            analysis = analyze(loaded, self.detectors, probes=self.probes, batch_size=self.batch_size,
                               seed=self.seed, explorer_examples=0, control=control, ov=False)
            icl, loss = icl_score(inner, self._icl_ids(loaded), self.batch_size)
        self.processes = analysis.meta.get("processes", 1)
        scores = analysis.scores.assign(step=step)[TIMELINE_COLUMNS]
        labels = analysis.labels.assign(step=step)[LABEL_COLUMNS]
        self._scores.append(scores)
        self._labels.append(labels)
        self._steps.append({"step": step, "icl_score": icl, "loss": loss,
                            "train_loss": float("nan") if train_loss is None else float(train_loss)})
        return self.summary(step)

    def _build_probes(self, loaded) -> list:
        """The probes given, built once (settings objects become `ProbeSet`s: every step reads the
        same examples), and `timeline_probes`' for every kind not given (so a repeated probe
        alone does not bring the 128-token text default)."""
        self._built = True
        given = {p.name: p.build(loaded, self.seed) for p in self.probes or ()}
        defaults = [p for p in timeline_probes(loaded, self.seed, self.n_examples) if p.name not in given]
        return defaults + list(given.values())

    def _loaded(self, inner) -> Loaded:
        vocab = inner.config.vocab_size
        tokenizer = self.tokenizer
        if not has_text_tokenizer(tokenizer, vocab):
            bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
            bos = bos if bos is not None else getattr(inner.config, "bos_token_id", None)
            tokenizer = IdTokenizer(vocab, bos if bos is not None and bos < vocab else None)
        loaded = Loaded.from_model(inner, tokenizer, name=getattr(inner.config, "name_or_path", "") or "model")
        shape = (loaded.n_layers, loaded.n_heads)
        if self._shape is not None and shape != self._shape:
            raise HeadscopeError(f"this timeline holds a model of {self._shape[0]} layers x {self._shape[1]} heads; "
                                 f"got {shape[0]} x {shape[1]}")
        self._shape = shape
        return loaded

    def _control_for(self, inner, loaded: Loaded, step: int):
        if self.control != "initial":
            return self.control
        if self._twin is None:
            if self._control_path is not None:  # resumed: the step-0 copy the first run saved
                twin = type(inner).from_pretrained(self._control_path, dtype=inner.dtype).to(loaded.device)
                self._twin = Loaded.from_model(twin, loaded.tokenizer, name=f"{loaded.name} at step 0")
            elif step == 0 and not self._steps:
                twin = copy.deepcopy(inner).eval()
                for p in twin.parameters():
                    p.grad = None  # a frozen copy: no gradients kept
                    p.requires_grad_(False)
                self._twin = Loaded.from_model(twin, loaded.tokenizer, name=f"{loaded.name} at step 0")
            else:
                self._twin = random_twin(loaded, self.seed + CONTROL_SEED_OFFSET)
        return self._twin

    def _icl_ids(self, loaded) -> torch.Tensor:
        if self.icl_data is not None:
            return torch.as_tensor(self.icl_data)
        by_name = {getattr(p, "name", None): p for p in self.probes}
        text = by_name.get("text")
        if text is not None and has_text_tokenizer(loaded.tokenizer, loaded.text_config.vocab_size) \
                and hasattr(text, "input_ids"):
            return text.input_ids
        repeated = by_name.get("repeated")
        if repeated is None or not hasattr(repeated, "input_ids"):
            raise HeadscopeError("the ICL score needs icl_data= token ids, a built text probe or a repeated probe")
        return repeated.input_ids

    def note_train_loss(self, step: int, loss: float) -> None:
        """The training loss the trainer logged at `step`, kept in `.steps` when the step was recorded."""
        for row in self._steps:
            if int(row["step"]) == int(step):
                row["train_loss"] = float(loss)

    # --- reading ---------------------------------------------------------------------------

    @property
    def scores(self) -> pd.DataFrame:
        return _frame(self._scores, TIMELINE_COLUMNS)

    @property
    def labels(self) -> pd.DataFrame:
        return _frame(self._labels, LABEL_COLUMNS)

    @property
    def steps(self) -> pd.DataFrame:
        return pd.DataFrame(self._steps, columns=STEP_COLUMNS).sort_values("step", ignore_index=True)

    def summary(self, step: int) -> dict:
        """What a logger shows for `step` (see `record`)."""
        scores, labels = self.scores, self.labels
        at = scores[scores.step == step]
        out = {f"headscope/{det}_max": float(group.score.max()) for det, group in at.groupby("detector", sort=False)}
        named = labels[labels.step == step].label.value_counts()
        out.update({f"headscope/{det}_heads": int(named.get(det, 0)) for det in at.detector.unique()})
        row = [s for s in self._steps if s["step"] == step]
        if row:
            out["headscope/icl_score"] = row[-1]["icl_score"]
        return out

    # --- saving ----------------------------------------------------------------------------

    def save(self, out, force: bool = True) -> Path:
        """Write the timeline folder `out` atomically (`write_into` a temporary folder, then
        renamed); `force` replaces a timeline folder headscope wrote."""
        out = Path(out)
        with atomic_dir(out, force=force) as tmp:
            self.write_into(Path(tmp))
        return out

    def write_into(self, folder: Path) -> None:
        """timeline.csv, labels.csv, steps.csv, meta.json, and (when the control is the step-0
        copy) that model under control/, so a resumed run keeps its control."""
        self.scores.to_csv(folder / FILES["scores"], index=False)
        self.labels.to_csv(folder / FILES["labels"], index=False)
        self.steps.to_csv(folder / FILES["steps"], index=False)
        initial = self.control == "initial" and self._twin is not None and self._twin.name.endswith("at step 0")
        meta = {"detectors": self.detectors, "seed": self.seed, "processes": self.processes,
                "control": "the step-0 model" if initial else
                (f"random-init twin (seed {self.seed + CONTROL_SEED_OFFSET})" if self._twin is not None
                 else str(self.control))}
        (folder / "meta.json").write_text(json.dumps(meta, indent=1))
        if initial and self._kept_control:
            self._twin.model.save_pretrained(folder / "control")

    @classmethod
    def resume(cls, out, up_to: Optional[int] = None, **kwargs) -> "Timeline":
        """A timeline that continues the one saved in `out` (rows after step `up_to` dropped: a
        run resumed from an earlier checkpoint redoes them); a new one if `out` holds none."""
        timeline = cls(**kwargs)
        out = Path(out)
        if not (out / FILES["scores"]).is_file():
            return timeline
        keep = (lambda f: f) if up_to is None else (lambda f: f[f.step <= up_to])
        timeline._scores = [keep(pd.read_csv(out / FILES["scores"]))]
        timeline._labels = [keep(pd.read_csv(out / FILES["labels"]))]
        timeline._steps = keep(pd.read_csv(out / FILES["steps"])).to_dict("records")
        if timeline.control == "initial" and (out / "control").is_dir():
            timeline._control_path = out / "control"
        return timeline

def _frame(parts: list, columns: list) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame(columns=columns)
    frame = pd.concat(parts, ignore_index=True).reindex(columns=columns)
    return frame.sort_values(["step", "layer", "head"] if "detector" not in columns else
                             ["step", "detector", "layer", "head"], kind="stable", ignore_index=True)
