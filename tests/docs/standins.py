"""Stand-ins for the two bundled models in the documentation's code blocks, where the real model
is not the point: random-init models of the same family and head grid with tiny widths, and the
planted model's character tokenizer (`tests/support/planted.char_tokenizer`).

- `smollm2-135m`: a Llama with SmolLM2's 9 query heads and 3 key/value heads in 2 layers,
  hidden size 36 (head size 4); `model.model.layers[L].self_attn` as in SmolLM2.
- `minilm-l6`: a BERT encoder with MiniLM's 12 heads in 2 layers, hidden size 48.
`save_standins(folder)` writes both as model folders and returns `{alias: path}`.
"""
from pathlib import Path

from tests.support.planted import VOCAB, char_tokenizer

__all__ = ["save_standins"]


def _llama():
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=36, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                            bos_token_id=2, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    return tf.LlamaForCausalLM(config).eval()


def _bert():
    import transformers as tf

    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=12, max_position_embeddings=512, pad_token_id=0)
    return tf.BertModel(config).eval()


def save_standins(folder) -> dict:
    """Write the two stand-ins (seeded) under `folder`; `{alias: model folder}`."""
    import torch

    folder = Path(folder)
    out = {}
    for alias, build in (("smollm2-135m", _llama), ("minilm-l6", _bert)):
        torch.manual_seed(0)
        path = folder / alias
        build().save_pretrained(path)
        char_tokenizer().save_pretrained(path)
        out[alias] = path
    return out
