"""Tiny random-init Hugging Face models with odd sizes, one per supported family (no network)."""
import torch

FAMILIES = ("gpt2", "bert", "llama", "qwen2", "gpt_neox")
VOCAB = 99


def tiny_config(family: str, positions: int = 64):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                  intermediate_size=37, max_position_embeddings=positions)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, n_embd=36, n_layer=2, n_head=3,
                             n_positions=positions,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if family == "bert":
        return tf.BertConfig(**common, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if family == "llama":  # GQA: 6 query heads share 2 key/value heads; head_dim untied
        return tf.LlamaConfig(**{**common, "num_attention_heads": 6}, num_key_value_heads=2, head_dim=10)
    if family == "qwen2":  # biases on q/k/v, MQA
        return tf.Qwen2Config(**common, num_key_value_heads=1)
    if family == "gpt_neox":  # fused interleaved qkv, partial rotary
        return tf.GPTNeoXConfig(**common, rotary_pct=0.5, hidden_dropout=0.0, attention_dropout=0.0)
    raise ValueError(family)


def tiny_model(family: str, seed: int = 0, positions: int = 64):
    """A model in eval mode with the default (SDPA) attention."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tiny_config(family, positions)
    cls = tf.BertModel if family == "bert" else tf.AutoModelForCausalLM
    model = cls.from_config(config) if cls is tf.AutoModelForCausalLM else cls(config)
    return model.eval()


def tiny_inputs(batch: int = 2, length: int = 11, seed: int = 1, pad: bool = True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad and batch > 1:
        mask[1, -3:] = 0  # right padding on the second example
    return {"input_ids": ids, "attention_mask": mask}
