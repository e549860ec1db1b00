"""`HeadscopeCallback`: a `transformers.TrainerCallback` that keeps a `Timeline` while a Trainer trains.

    trainer = Trainer(model, args, train_dataset=..., callbacks=[HeadscopeCallback(every=100, out="heads")])

- At the start of training (step 0, or the step a resumed run starts from) and every `every`
  optimizer steps it records the model (`Timeline.record`: lazy detectors on small probes, the
  ICL score; modes, grad mode and random states restored, so the losses are unchanged).
- The step's summary (`headscope/induction_max`, `headscope/icl_score`, ...) goes through the
  Trainer's logger: the callback asks for a log at that step and adds its entries to the logs, so
  TensorBoard, W&B or any `report_to` integration receives them with the loss. (The Trainer calls
  the callbacks in order, integrations before the user's; on its first event the callback moves
  itself to the front of the Trainer's list so the integrations see its entries.)
- The timeline folder `out` is written (atomically, by rank 0 only) at every checkpoint save and
  at the end. A run resumed from a checkpoint reads `out` and continues it, dropping the rows
  after the checkpoint's step (they are recorded again).
- Under torchrun (DDP) every rank records (scoring is split across ranks by `analyze`); rank 0
  logs and writes. FSDP is refused in one line (`Timeline`).
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Iterable, Optional

from transformers import TrainerCallback

from ..checks import check_count
from .timeline import Timeline

__all__ = ["HeadscopeCallback", "DEFAULT_EVERY"]

DEFAULT_EVERY = 100  # optimizer steps between records (benchmarks/README.md: overhead at this interval)


class HeadscopeCallback(TrainerCallback):
    """Score the heads of the model being trained every `every` optimizer steps.

    Args:
        every: optimizer steps between records (and one at the start).
        out: the timeline folder written at every save and at the end (`Timeline.save`).
        detectors: registered detector names (default: previous_token, induction,
            duplicate_token, sink, uniform).
        probes: built `ProbeSet`s or probe settings (default: `timeline_probes`).
        **timeline: more `Timeline` arguments (`icl_data=`, `control=`, `seed=`, `tokenizer=`;
            the Trainer's tokenizer, its `processing_class`, is used when none is given).
    """

    def __init__(self, every: int = DEFAULT_EVERY, out="headscope-timeline", detectors: Optional[Iterable[str]] = None,
                 probes: Optional[Iterable] = None, **timeline):
        check_count("every", every)
        self.every = every
        self.out = Path(out)
        self._settings = dict(detectors=detectors, probes=probes, **timeline)
        self.timeline: Optional[Timeline] = None
        self._pending: dict = {}
        self._first = True

    def _to_front(self) -> None:
        """Move this callback ahead of the reporting integrations (see the module docstring)."""
        caller = inspect.currentframe().f_back.f_back  # CallbackHandler.call_event
        handler = caller.f_locals.get("self") if caller is not None else None
        callbacks = getattr(handler, "callbacks", None)
        if isinstance(callbacks, list) and self in callbacks:
            callbacks.remove(self)
            callbacks.insert(0, self)  # the running loop still calls every callback once (same length)

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self._first:
            self._first = False
            self._to_front()
        settings = dict(self._settings)
        if settings.get("tokenizer") is None:
            settings["tokenizer"] = processing_class
        self.timeline = Timeline.resume(self.out, up_to=state.global_step, **settings) if state.global_step \
            else Timeline(**settings)
        self._record(model, state, control)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self._record(model, state, control)
            control.should_log = True  # every rank: the Trainer's log gathers the loss across ranks

    def _record(self, model, state, control) -> None:
        self._pending = {"step": state.global_step, "logs": self.timeline.record(model, state.global_step)}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        if "loss" in logs:
            self.timeline.note_train_loss(state.global_step, float(logs["loss"]))
        if self._pending.get("step") == state.global_step:  # step 0's summary stays in the timeline only
            logs.update(self._pending["logs"])
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self._pending["logs"])
            self._pending = {}

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.timeline.save(self.out)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.timeline.save(self.out)
