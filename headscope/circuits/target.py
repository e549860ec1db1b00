"""Running a `Task` through a model: what every attribution method shares.

- `Target(loaded, task, sites)`: the model, its analysed sites and residual width, after checking
  that the task fits the model (its tokenizer and vocabulary) and that the model has logits.
- `Target.inputs(task, which)`: the model inputs of a task's clean or corrupted prompts and the
  position each example's answer is read at. An encoder-decoder's decoder sites read each
  prompt as a teacher-forced continuation: the encoder reads the prompt, the decoder its start
  token and then the prompt, so the decoder's last real position predicts the answer. An
  encoder-decoder is attributed at its decoder's self-attention ("decoder.self") unless told
  otherwise; one whose encoder reads something other than token ids (Whisper's audio) is refused.
- `batches(n, batch_size)`: row slices of a task.
- `read_positions(model, positions)`: inside it, the LM head of a run reads each example's answer
  position only (a task's metric reads nothing else), and `.logits(out)` gives logits a task
  scores as it would the whole run's.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch

from ..checks import check_count
from ..errors import HeadscopeError
from ..hf.adapters import head_sizes
from ..hf.route import selection
from ..probes.copy import decoder_start_token

__all__ = ["Target", "batches", "output_logits", "check_token_inputs", "read_positions"]


def batches(n: int, batch_size: int) -> list[slice]:
    """Row slices covering `range(n)` in order, `batch_size` rows each; the last may be shorter but
    holds at least two rows where `n` does (a lone row joins the batch before it)."""
    check_count("batch_size", batch_size)
    parts = [slice(start, min(n, start + batch_size)) for start in range(0, n, batch_size)]
    if len(parts) > 1 and parts[-1].stop - parts[-1].start == 1:
        parts[-2:] = [slice(parts[-2].start, n)]
    return parts


def output_logits(out) -> torch.Tensor:
    """The logits of a transformers model's output; HeadscopeError for a model without an LM head."""
    logits = getattr(out, "logits", None)
    if logits is None:
        raise HeadscopeError("attribution needs a model that predicts tokens (a language-model head); this one "
                             "returns hidden states only")
    return logits


class _Positions:
    """What `read_positions` yields: the LM head's input cut to one position per example."""

    def __init__(self, positions: Optional[torch.Tensor]):
        self.positions = positions
        self.length: Optional[int] = None  # the positions the run had, where the head read only one

    def cut(self, module, args):
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        hidden = args[0]
        if hidden.dim() != 3 or hidden.shape[0] != len(self.positions) or hidden.shape[1] <= int(self.positions.max()):
            return None  # not the rows and positions expected: the head reads them all
        self.length = hidden.shape[1]
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return (hidden[rows, self.positions.to(hidden.device)].unsqueeze(1), *args[1:])

    def logits(self, out) -> torch.Tensor:
        """The run's logits `[n, pos, vocab]`: where the head read one position per example, that
        row seen at every position (a view; a task's metric reads only its own position)."""
        logits = output_logits(out)
        if self.length is None or logits.dim() != 3 or logits.shape[1] != 1:
            return logits
        return logits.expand(logits.shape[0], self.length, logits.shape[2])


@contextmanager
def read_positions(model, positions: Optional[torch.Tensor]) -> Iterator[_Positions]:
    """Inside it, `model`'s output embeddings (its LM head) read only `positions[i]` of row i
    (the positions `Target.inputs` gives): a run's logits cost one position per example instead
    of every position. Anything the model does after its head (a soft cap, a scale) is
    elementwise and stays as it is. A model without output embeddings, or `positions` None,
    runs as it is (`.logits(out)` then gives the whole run's)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kept = _Positions(positions)
    handle = head.register_forward_pre_hook(kept.cut) \
        if isinstance(head, torch.nn.Module) and positions is not None else None
    try:
        yield kept
    finally:
        if handle is not None:
            handle.remove()


def check_token_inputs(model, otherwise: str) -> None:
    """HeadscopeError unless the model reads token ids (Whisper's encoder reads audio features);
    `otherwise` says what cannot be done."""
    read = getattr(model, "main_input_name", "input_ids")
    if read != "input_ids":
        raise HeadscopeError(f"{type(model).__name__} reads {read}, not token ids, so {otherwise}")


class Target:
    """A model and the group of attention sites a task is attributed to (module docstring)."""

    def __init__(self, loaded: Any, task: Any, sites: Optional[str] = None, what: str = "attribution"):
        if not all(hasattr(task, name) for name in ("clean", "corrupted", "answer", "wrong", "position", "subset")):
            raise HeadscopeError(f"{what} takes a headscope.Task (headscope.task('ioi', tokenizer) or "
                                 f"headscope.Task(clean=..., corrupted=..., answer=..., wrong=...)), "
                                 f"not a {type(task).__name__}")
        self.model = loaded if isinstance(loaded, torch.nn.Module) else getattr(loaded, "model", None)
        if not isinstance(self.model, torch.nn.Module):
            raise HeadscopeError(f"{what} takes a loaded model (headscope.load(...)) or a transformers model, "
                                 f"not a {type(loaded).__name__}")
        task.check_for(loaded)
        self.sites = sites if sites is not None else getattr(loaded, "sites", None)
        self.selection = selection(self.model, self.sites)
        if getattr(self.model.config, "is_encoder_decoder", False):
            check_token_inputs(self.model, "a task's prompts cannot feed it")
            if self.sites is None and not self.selection.group.startswith("decoder"):
                self.sites = "decoder.self"  # the logits come from the decoder: its heads are the components
                self.selection = selection(self.model, self.sites)
        self.d_model = head_sizes(self.model.config)[0]
        self.two_inputs = self.selection.group.startswith("decoder")
        self.device = next(self.model.parameters()).device
        if self.two_inputs:
            self.start = decoder_start_token(self.model)
            if self.start is None:
                raise HeadscopeError(f"{type(self.model).__name__}'s decoder has no start token "
                                     f"(decoder_start_token_id), so the task cannot feed it")

    def inputs(self, task: Any, which: str) -> tuple[dict, torch.Tensor]:
        """`(model inputs, positions [n])` of `task`'s clean or corrupted prompts (module docstring)."""
        given = task.inputs(which, device=self.device)
        positions = task.position.to(self.device)
        if not self.two_inputs:
            return given, positions
        ids, mask = given["input_ids"], given["attention_mask"]
        start = torch.full_like(ids[:, :1], int(self.start))
        decoder_ids = torch.cat([start, ids], dim=1)  # (n, pos + 1): the start token, then the prompt
        decoder_mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        return dict(given, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask), positions + 1

    def aligned(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` `[n, pos, vocab]` of a run, aligned with the task's positions (`task.score` reads
        them): the decoder's, without its start position; anything else as it is."""
        return logits[:, 1:] if self.two_inputs else logits
