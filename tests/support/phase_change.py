"""The phase-change run of tests/training/test_phase_change.py, trained once per test session.

`train_phase(n_layers, steps, folder, callbacks)`: the tiny Llama of `headscope.training.toy`
trained on the benchmark's seed-0 data (one thread, batch 64, AdamW lr 1e-3); returns its losses
and the trained model. `held_out()`: the 64 rows the callbacks measure the ICL score on. `toy_tokenizer()`: a word-level tokenizer over the toy vocabulary (token
i is "t{i}", [BOS] is id 0 as in training), so that `headscope.task` builds tasks for the model.
"""
import torch

from headscope.training.toy import BOS, VOCAB, repeated_segments, tiny_llama, train_toy

__all__ = ["STEPS", "EVERY", "SEED", "train_phase", "held_out", "toy_tokenizer"]

STEPS, EVERY, SEED = 340, 20, 0
ROWS = 600 * 64  # the benchmark's data: the first STEPS steps are its seed-0 run's


def train_phase(n_layers: int, steps: int, folder, callbacks):
    """`(losses, model)` of the toy model trained for `steps` steps (module docstring)."""
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    ids, _ = repeated_segments(ROWS, torch.Generator().manual_seed(SEED))  # the same rows and order whatever `steps`
    model = tiny_llama(n_layers)
    losses = train_toy(model, ids, steps, folder, callbacks, seed=SEED)
    return losses, model.eval()


def held_out() -> torch.Tensor:
    return repeated_segments(64, torch.Generator().manual_seed(10_000 + SEED))[0]


def toy_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"[BOS]": BOS, **{f"t{i}": i for i in range(1, VOCAB)}, "[UNK]": VOCAB}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]")
