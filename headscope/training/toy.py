"""The task and models of the phase-change reproduction (docs/training.md, benchmarks/phase_change.py).

- `repeated_segments(n, generator, ...)` -> `[n, seq_len]` ids: uniform random tokens in which
  one random segment of `min_len`..`max_len` tokens occurs twice, the second copy ending the
  sequence. The segment's length and the gap between the copies vary per example, so copying
  pays only to a head that finds the earlier copy by content (induction); a fixed offset serves
  a few examples at most (Olsson et al. 2022; a fixed period lets a 1-layer model fake
  induction with an offset head, ../shared/REFERENCES.md).
- `second_copy_mask(...)`: the same examples' `[n, seq_len]` bool mask of the second copy's
  tokens after its first (the tokens induction can predict).
- `tiny_llama(n_layers, ...)`: a Llama of `n_layers` x 4 heads, hidden 64, vocab 64, built from
  its config (random init, seeded by the caller).
- `train_toy(model, ids, steps, folder, callbacks, ...)` -> per-step training losses: a
  `transformers.Trainer` run (AdamW, constant lr 1e-3, batch 64, CPU) on the rows of `ids`.
- `induction_window(folder)`: what a timeline folder says of the phase change (below).
- `toy_tokenizer()`: a word-level tokenizer over the toy vocabulary (token i is "t{i}", [BOS] is
  id 0 as in training), so that `headscope.task` builds tasks for these models.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

__all__ = ["repeated_segments", "tiny_llama", "train_toy", "induction_window", "toy_tokenizer", "SEQ_LEN",
           "VOCAB"]

SEQ_LEN, VOCAB = 61, 64
BOS = 0  # every sequence starts with it; the random tokens are drawn from 1 .. VOCAB - 1


def repeated_segments(n: int, generator: torch.Generator, seq_len: int = SEQ_LEN, vocab: int = VOCAB,
                      min_len: int = 8, max_len: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` sequences `[BOS, noise, segment, noise, segment]` of `seq_len` tokens.

    Returns:
        (ids `[n, seq_len]` long, second `[n, seq_len]` bool: the second copy's tokens after its
        first, the ones an induction head predicts).
    """
    if 2 * max_len + 1 > seq_len:
        raise ValueError(f"two copies of {max_len} tokens and a BOS do not fit {seq_len} tokens")
    ids = torch.randint(1, vocab, (n, seq_len), generator=generator)
    ids[:, 0] = BOS
    second = torch.zeros(n, seq_len, dtype=torch.bool)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)
    for row, length in enumerate(lengths.tolist()):
        start2 = seq_len - length  # the second copy ends the sequence
        start1 = int(torch.randint(1, start2 - length + 1, (1,), generator=generator))  # anywhere before it
        ids[row, start2:] = ids[row, start1:start1 + length]
        second[row, start2 + 1:] = True
    return ids, second


def tiny_llama(n_layers: int, seq_len: int = SEQ_LEN, vocab: int = VOCAB, hidden: int = 64, heads: int = 4):
    """A randomly initialised `LlamaForCausalLM` (the caller seeds torch first)."""
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                            num_hidden_layers=n_layers, num_attention_heads=heads, num_key_value_heads=heads,
                            max_position_embeddings=max(64, seq_len), bos_token_id=BOS, eos_token_id=None,
                            pad_token_id=None, tie_word_embeddings=False)
    return tf.LlamaForCausalLM(config)


def toy_tokenizer(vocab: int = VOCAB):
    """A word-level tokenizer: "t1" .. "t{vocab - 1}" are ids 1 .. vocab - 1, [BOS] is id 0 and
    starts every encoded text, [UNK] is id `vocab` (outside the models' vocabulary: never in a task)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {"[BOS]": BOS, **{f"t{i}": i for i in range(1, vocab)}, "[UNK]": vocab}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]")


class _Rows(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train_toy(model, ids: torch.Tensor, steps: int, folder, callbacks=(), *, batch: int = 64, lr: float = 1e-3,
              seed: int = 0, save_steps: int = 0, resume=None) -> list[float]:
    """Train `model` with a `transformers.Trainer` on the rows of `ids` `[n, seq_len]` (next-token loss).

    Args:
        steps: optimizer steps; folder: the Trainer's output_dir.
        callbacks: extra `TrainerCallback`s (a `HeadscopeCallback`).
        save_steps: a checkpoint every so many steps (0: none).
        resume: a checkpoint folder to resume from (or True: the latest in `folder`).
    Returns:
        The training loss at every step (logged every step).
    """
    import transformers as tf

    args = tf.TrainingArguments(
        output_dir=str(folder), per_device_train_batch_size=batch, max_steps=steps, learning_rate=lr,
        optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, logging_steps=1,
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, report_to=[], seed=seed,
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = tf.Trainer(model=model, args=args, train_dataset=_Rows(ids), callbacks=list(callbacks))
    trainer.remove_callback(tf.trainer_callback.PrinterCallback)  # a line per step: the losses are returned
    trainer.train(resume_from_checkpoint=resume)
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def induction_window(folder) -> dict:
    """The phase change as a timeline folder records it.

    Returns a dict with: layers; chance (twice the step-0 control's best induction score in the
    last layer); induction_labelled (a last-layer head ever earned the induction label);
    first_previous_token_step (first record at which a layer-0 head is labelled previous_token,
    None if never); and, when induction_labelled: window = [start, end], end the first record at
    which a last-layer head is labelled induction, start the last record before it at which the
    last layer's best induction score is at most `chance`; best_induction and icl_score at both
    ends; best_previous_token (layer 0's best score) at both ends; head (the best at `end`);
    icl_score_step0 and icl_score_final.
    """
    folder = Path(folder)
    scores = pd.read_csv(folder / "timeline.csv")
    labels = pd.read_csv(folder / "labels.csv")
    steps = pd.read_csv(folder / "steps.csv").set_index("step")
    last = int(scores.layer.max())
    induction = scores[(scores.detector == "induction") & (scores.layer == last)]
    best = induction.groupby("step").score.max()
    previous = scores[(scores.detector == "previous_token") & (scores.layer == 0)].groupby("step").score.max()
    chance = 2 * float(induction[induction.step == induction.step.min()].control.max())
    labelled = labels[(labels.label == "induction") & (labels.layer == last)]
    prev = labels[(labels.label == "previous_token") & (labels.layer == 0)]
    out = {"layers": last + 1, "chance": chance, "induction_labelled": not labelled.empty,
           "first_previous_token_step": int(prev.step.min()) if not prev.empty else None,
           "best_induction_final": float(best.iloc[-1])}
    if labelled.empty:
        return out
    end = int(labelled.step.min())
    start = int(best[(best.index < end) & (best <= chance)].index.max())
    top = induction[induction.step == end].sort_values("score").iloc[-1]
    out.update({"window": [start, end], "best_induction": [float(best[start]), float(best[end])],
                "best_previous_token": [float(previous[start]), float(previous[end])],
                "head": f"{int(top.layer)}.{int(top['head'])}",
                "heads_labelled_at_end": int((labelled.step == end).sum()),
                "icl_score": [float(steps.icl_score[start]), float(steps.icl_score[end])],
                "icl_score_step0": float(steps.icl_score.iloc[0]), "icl_score_final": float(steps.icl_score.iloc[-1])})
    return out
