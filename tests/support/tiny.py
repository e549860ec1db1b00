"""Tiny random-init Hugging Face models, the one factory of them for every test (no network).

Two kinds, each a table of configs:

- `kind="odd"` (`ODD_FAMILIES`: gpt2, bert, llama, qwen2, gpt_neox): odd sizes (vocab 99,
  hidden 36, 2 layers, 3 heads; llama 6 query heads sharing 2 key/value heads with head_dim 10,
  qwen2 MQA with q/k/v biases, gpt_neox fused qkv and partial rotary). Built fresh on every call.
- `kind="interface"` (`INTERFACE_FAMILIES`: every family on transformers' attention interface):
  2 layers, hidden 64, 4 query heads sharing 2 key/value heads where the family has GQA, head
  size 16, vocab 99, and sliding windows of 4 (shorter than the test sequences) where the family
  has windows. Gemma 2 gets strong soft-capping (cap 1.0, large init) and gpt-oss (every family
  with sinks: mimo_v2_flash, granite_swa, ...) non-zero sink logits, so that a kernel ignoring
  either fails the tests. Built once per process and shared (`functools.cache`): tests never
  change them.

- `kind="hybrid"` (`HYBRID_FAMILIES`): attention next to Mamba, linear-attention or convolution
  layers, 4 layers with attention only in some of them (`HYBRID_ATTENTION[family]`, the
  model's own layer numbers), COMMON's sizes otherwise; small state sizes for the other mixers.
- `kind="composite"` (`COMPOSITE_FAMILIES`): vision-language models whose vocabulary, layer and
  head counts live in `config.text_config` (3 text layers, COMMON's sizes; a 2-layer vision
  tower of 2 heads on 28-pixel images), built as `AutoModelForImageTextToText`, with the
  parameters that keep a fresh model's logits blind to the image (gates and projections
  initialised to zero or nearly, `_IMAGE_GATES`) filled, so that the vision tower matters.
  Qwen3.5's (qwen3_5, qwen3_5_moe) text decoders are hybrids: attention in the layers
  `COMPOSITE_ATTENTION[family]` only.

- `kind="encoder_decoder"` (`ENCODER_DECODER_FAMILIES`: bart, whisper, marian, mbart, m2m_100,
  pegasus, blenderbot, blenderbot-small, plbart, t5, mt5), each as its ...ForConditionalGeneration
  (marian: MarianMTModel): 2 encoder and 2 decoder layers, hidden 64; whisper and the bart-like
  ones with 4 encoder heads and 2 decoder heads (so a group's head count is its own), T5 and mT5 with
  the interface kind's sizes; whisper on 8 mel bins and 6 source positions (12 input frames).
  Built fresh on every call. `tiny_seq2seq_inputs(family)`: the encoder's input (token ids
  with right padding on the second example; whisper: log-mel `input_features`) and 7
  `decoder_input_ids`.

- `tiny_decoder_alone(family, seed)`: a bart-like family's ForCausalLM, its decoder alone
  (`DECODER_LAYERS` layers of `DECODER_HEADS` heads, each with self- and cross-attention).

- `tiny_mllama(full, seed)`: mllama's text model (`MllamaForCausalLM`), 3 layers with a
  cross-attention layer at 1 that runs only with an image (never, for token ids alone); with
  `full`, the whole `MllamaForConditionalGeneration` around it (a vision tower of 2 local layers
  and 1 global one; its cross-attention gates open, as the composite kind's).

- `zamba2_with_lora(num_mem_blocks, seed)`: the hybrid zamba2 with its per-layer LoRA adapters on
  q, k, v (weights moved off their near-zero init) and rotary on, which the hybrid kind leaves off.

- `tiny_image_inputs(family, seed)`: a vision-language model's inputs with one image per example
  (`COMPOSITE_FAMILIES` and "mllama", the model of `tiny_mllama(full=True)`): `tiny_inputs()`
  with the family's image tokens in the ids, `pixel_values` and what else the family needs
  (mllama: aspect ratios and a cross-attention mask; qwen2_5_vl: `image_grid_thw`, 4 x 6 patches,
  which its windowed vision layer 0 splits into two windows, its full-attention layer 1 not; qwen3_5
  and qwen3_5_moe: the same patches, no windows, and `mm_token_type_ids`; gemma4: 18 patches per
  image as rows `[patch, 3 * 14 * 14]` with their (x, y) on a 6 x 3 grid, `image_position_ids`).

- `tiny_config(family, kind, positions)`, `tiny_model(family, seed, kind, positions)`.
- `tiny_inputs(batch, length, seed, pad)`: random ids in [3, 99) with right padding on the
  second example; `output_of(out)`: logits for decoders, the last hidden state for encoders.
"""
import functools

import torch

__all__ = ["VOCAB", "ODD_FAMILIES", "INTERFACE_FAMILIES", "ENCODERS", "HYBRID_FAMILIES", "HYBRID_ATTENTION",
           "COMPOSITE_FAMILIES", "COMPOSITE_ATTENTION", "VERIFIED_COMPOSITES", "TEXT_DECODERS", "ENCODER_DECODER_FAMILIES", "tiny_config", "tiny_model",
           "tiny_mllama", "tiny_decoder_alone", "DECODER_LAYERS", "DECODER_HEADS", "tiny_inputs", "tiny_seq2seq_inputs", "tiny_image_inputs", "output_of"]

VOCAB = 99
ODD_FAMILIES = ("gpt2", "bert", "llama", "qwen2", "gpt_neox")

COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=48, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, attention_dropout=0.0)
WINDOW = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])
# Multi-head latent attention: q/k heads of 16 + 8 rotary dims, values of 12, latents of 24 (q) and 16 (k, v).
MLA = dict(head_dim=None, num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
           kv_lora_rank=16, q_lora_rank=24)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
ENCODER = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

EXTRA = {
    "llama": {},
    "mistral": dict(sliding_window=4),
    "mixtral": dict(sliding_window=4, num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "qwen2_moe": dict(MOE, shared_expert_intermediate_size=16),
    "qwen3": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "qwen3_moe": dict(MOE),
    "gemma": {},
    "gemma2": dict(WINDOW, attn_logit_softcapping=1.0, final_logit_softcapping=None, query_pre_attn_scalar=24,
                   initializer_range=0.5),
    "gemma3_text": dict(WINDOW, query_pre_attn_scalar=24),
    "phi": dict(partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0),
    "phi3": dict(sliding_window=4, resid_pdrop=0.0, embd_pdrop=0.0),
    "olmo": dict(clip_qkv=0.1),
    "olmo2": {},
    "granite": dict(attention_multiplier=0.3),
    "stablelm": dict(partial_rotary_factor=0.25, hidden_dropout=0.0),
    "starcoder2": dict(sliding_window=4, residual_dropout=0.0, embedding_dropout=0.0),
    "cohere": dict(use_qk_norm=True),
    "gptj": dict(rotary_dim=8, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    # qkv_proj in 4 groups (mp_num), a head each; the default rotary_dim (64) is wider than a head
    "codegen": dict(rotary_dim=8, n_inner=48, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_neox": dict(rotary_pct=0.5, hidden_dropout=0.0),
    "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_oss": dict(WINDOW, num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(MLA, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        moe_intermediate_size=16, first_k_dense_replace=1),
    # DeepSeek-V3.2: each query attends to the 4 keys its indexer picks (of up to 11).
    "deepseek_v32": dict(MLA, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                         moe_intermediate_size=16, first_k_dense_replace=1, index_topk=4, index_n_heads=2,
                         index_head_dim=16),
    "deepseek_v2": dict(MLA, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        first_k_dense_replace=1),
    "minicpm3": dict(MLA),
    "glm4_moe_lite": dict(MLA, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                          moe_intermediate_size=16, first_k_dense_replace=1),
    "youtu": dict(MLA, rope_interleave=False),
    "smollm3": dict(no_rope_layers=[1, 0], sliding_window=4),
    "bitnet": {},
    "opt": dict(word_embed_proj_dim=64, ffn_dim=48, dropout=0.0, enable_bias=True),
    "ministral": dict(WINDOW),
    "phimoe": dict(sliding_window=4, num_local_experts=4, num_experts_per_tok=2),
    "seed_oss": dict(attention_bias=True, attention_out_bias=False, residual_dropout=0.0),
    "arcee": {},
    "exaone": {},
    "internlm3": {},
    "granitemoe": dict(attention_multiplier=0.3, num_local_experts=4, num_experts_per_tok=2),
    # sinks applied as a scale on the output (eager weights without them); layer 0 sliding with its own
    # rotary base, layer 1 full attention without rotary (layer_rope_theta 0)
    "granite_swa": dict(WINDOW, attention_multiplier=0.3, layer_rope_theta=[1000.0, 0.0]),
    "granitemoe_swa": dict(WINDOW, attention_multiplier=0.3, num_local_experts=4, num_experts_per_tok=2,
                           layer_rope_theta=[1000.0, 0.0]),
    "apertus": {},
    "dots1": dict(WINDOW, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
                  first_k_dense_replace=1),
    "olmo3": dict(WINDOW),
    "glm": dict(attention_bias=True),
    "glm4": dict(attention_bias=True),
    "helium": {},
    "ernie4_5": dict(use_bias=True),
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=16, moe_num_shared_experts=1),
    "glm4_moe": dict(use_qk_norm=True, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                     moe_intermediate_size=16, first_k_dense_replace=1),
    "exaone4": dict(WINDOW),
    "cohere2": dict(WINDOW),
    "nemotron": dict(partial_rotary_factor=0.5),
    "hunyuan_v1_dense": {},
    "hunyuan_v1_moe": dict(num_experts=4, moe_topk=2),
    "granitemoeshared": dict(attention_multiplier=0.3, num_local_experts=4, num_experts_per_tok=2,
                             shared_intermediate_size=16),
    "flex_olmo": dict(num_experts=4, num_experts_per_tok=2),
    "minimax_m2": dict(partial_rotary_factor=0.5, num_local_experts=4, num_experts_per_tok=2),
    "vaultgemma": dict(WINDOW, attn_logit_softcapping=1.0, final_logit_softcapping=None, query_pre_attn_scalar=24,
                       initializer_range=0.5),
    "exaone_moe": dict(WINDOW, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, num_shared_experts=1,
                       first_k_dense_replace=1),
    "olmoe": dict(clip_qkv=0.5, num_experts=4, num_experts_per_tok=2),
    # NoPE layer 1 with a temperature that grows within the test sequences (floor_scale 4); chunks of 6 in layer 0
    # (shorter ones would leave the padded tail of tiny_inputs a chunk of its own: query rows with no key to read).
    "llama4_text": dict(no_rope_layers=[1, 0], attention_chunk_size=6, floor_scale=4, attn_scale=0.5,
                        use_qk_norm=True, num_local_experts=2, num_experts_per_tok=1, intermediate_size_mlp=48),
    # Layer 1 (full attention): heads of 24, one key/value head whose values are the keys' projection.
    "gemma4_text": dict(WINDOW, global_head_dim=24, num_global_key_value_heads=1, attention_k_eq_v=True,
                        hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB),
    "gemma3n_text": dict(WINDOW, num_kv_shared_layers=0, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
                         laurel_rank=8, altup_num_inputs=2, activation_sparsity_pattern=[0.0, 0.0],
                         final_logit_softcapping=None),
    "solar_open": dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
                       attention_bias=True),
    "jais2": dict(attention_bias=True),
    "cwm": dict(WINDOW),
    "mellum": dict(WINDOW, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    "hy_v3": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    # layer 0 a dense prefix layer: full attention, with rotary (force_rope); layer 1 sliding
    "cohere2_moe": dict(sliding_window=4, layer_types=["full_attention", "sliding_attention"],
                        mlp_layer_types=["dense", "sparse"], num_experts=4, num_experts_per_tok=2),
    "persimmon": dict(qk_layernorm=True, partial_rotary_factor=0.5, hidden_dropout=0.0),
    "nanochat": {},
    # layer 0 sliding (rotary), layer 1 full attention (NoPE); layer 0's MLP dense
    "afmoe": dict(WINDOW, num_experts=4, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=16),
    # Its query scale grows from position 4 on (original_max_position_embeddings 4, beta 0.5).
    "ministral3": dict(WINDOW, rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                    original_max_position_embeddings=4, llama_4_scaling_beta=0.5)),
    # partial rotary per layer type: 6 of 16 dims in the sliding layer (int(16 * 0.334) = 5, rounded up to a
    # pair, as transformers' tables are), 8 in the full-attention one; values of 12, scaled by 0.6
    "mimo_v2_flash": dict(WINDOW, v_head_dim=12, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                          mlp_layer_types=["dense", "sparse"], attention_value_scale=0.6,
                          rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=10000.0,
                                                                     partial_rotary_factor=0.334),
                                           "full_attention": dict(rope_type="default", rope_theta=10000.0,
                                                                  partial_rotary_factor=0.5)}),
    "biogpt": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, activation_dropout=0.0),
    # each query attends to the 4 keys its indexer picks; layer 1 reuses layer 0's picks
    "hy_v4": dict(MLA, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, index_topk=4,
                  index_n_heads=2, index_head_dim=16, indexer_types=["full", "shared"], learnable_sink_init=1.0),
    "dbrx": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=64, resid_pdrop=0.0, emb_pdrop=0.0,
                 attn_config=dict(kv_n_heads=2, clip_qkv=0.5, rope_theta=10000.0),
                 ffn_config=dict(ffn_hidden_size=48, moe_num_experts=4, moe_top_k=2)),
    "laguna": dict(WINDOW, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    "doge": dict(keep_window_size=4, hidden_dropout=0.0),  # the dynamic mask keeps 4 keys per query
    # GLM-5's DSA: 4 keys a query, layer 1 reusing layer 0's picks
    "glm_moe_dsa": dict(MLA, head_dim=24, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        moe_intermediate_size=16, index_topk=4, index_n_heads=2, index_head_dim=16,
                        indexer_types=["full", "shared"]),
    "bert": dict(ENCODER),
    "roberta": dict(ENCODER),
    "electra": dict(ENCODER, embedding_size=64),
    "xlm-roberta": dict(ENCODER),
    "camembert": dict(ENCODER),
    "data2vec-text": dict(ENCODER),
    "xlm-roberta-xl": dict(ENCODER),
    "ernie": dict(ENCODER),
    "nomic_bert": dict(ENCODER),
    "roc_bert": dict(ENCODER),
    # pre_norm: a LayerNorm before the attention (post-norm xmod is roberta's layout); default_language: the
    # language whose adapters every input goes through (without it or lang_ids the model refuses to run)
    "xmod": dict(ENCODER, languages=["en_XX", "de_DE"], default_language="de_DE", pre_norm=True),
    "distilbert": dict(dropout=0.0),
    "modernbert": dict(local_attention=4, global_attn_every_n_layers=2, embedding_dropout=0.0, mlp_dropout=0.0),
    "t5": dict(d_model=64, d_kv=16, num_heads=4, d_ff=48, num_layers=2, dropout_rate=0.0),
    "mt5": dict(d_model=64, d_kv=16, num_heads=4, d_ff=48, num_layers=2, dropout_rate=0.0),
    "umt5": dict(d_model=64, d_kv=16, num_heads=4, d_ff=48, num_layers=2, dropout_rate=0.0),
}
INTERFACE_FAMILIES = tuple(EXTRA)
ENCODERS = ("bert", "roberta", "electra", "xlm-roberta", "camembert", "data2vec-text", "xlm-roberta-xl", "ernie",
            "nomic_bert", "roc_bert", "xmod", "distilbert", "modernbert", "t5", "mt5", "umt5")

MAMBA = dict(mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
             mamba_chunk_size=8)
QWEN3_5 = dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
               linear_value_head_dim=8)
HYBRID = {  # family -> (config extras, the layers that hold attention)
    "jamba": (dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4,
                   expert_layer_offset=3, num_experts=2, num_experts_per_tok=1,
                   mamba_d_state=8, mamba_dt_rank=8), (1, 3)),
    "bamba": (dict(MAMBA, num_hidden_layers=4, attn_layer_indices=[1, 3]), (1, 3)),
    "granitemoehybrid": (dict(MAMBA, num_hidden_layers=4, num_local_experts=2, num_experts_per_tok=1,
                              shared_intermediate_size=16,
                              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
                         (1, 3)),
    "lfm2": (dict(num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"]), (1, 3)),
    "qwen3_next": (dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                        linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                        shared_expert_intermediate_size=16,
                        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"]),
                   (2,)),
    # Qwen3.5's text decoders: qwen3_next's gated attention, multimodal rotary tables (all axes alike for text).
    "qwen3_5_text": (dict(QWEN3_5, layer_types=["linear_attention", "full_attention", "linear_attention",
                                                 "full_attention"]), (1, 3)),
    "qwen3_5_moe_text": (dict(QWEN3_5, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16,
                              layer_types=["full_attention", "linear_attention", "linear_attention",
                                           "full_attention"]), (0, 3)),
    "lfm2_moe": (dict(num_hidden_layers=4, num_dense_layers=1, num_experts=2, num_experts_per_tok=1,
                      moe_intermediate_size=16, layer_types=["conv", "full_attention", "conv", "full_attention"]),
                 (1, 3)),
    # Multi-head latent attention without rotary (the shared key part unrotated) beside Kimi Delta Attention.
    "kimi_linear": (dict(MLA, num_hidden_layers=4, q_lora_rank=None, linear_num_heads=2, linear_head_dim=16,
                         num_local_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                         mlp_layer_types=["dense", "sparse", "dense", "sparse"]), (1, 3)),
    "nemotron_h": (dict(num_hidden_layers=4, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=1,
                        chunk_size=8, layers_block_type=["linear_attention", "full_attention", "mlp", "full_attention"]),
                   (1, 3)),
    # Gated DeltaNet layers of 2 heads (keys of 8, values of 16) beside olmo2-like attention
    "olmo_hybrid": (dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                         linear_value_head_dim=16,
                         layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
                    (1, 3)),
    # layer 1 sliding (window 4, rotary over the head), layer 3 full attention (proportional rotary: half the dims)
    "lfm3": (dict(num_hidden_layers=4, sliding_window=4,
                  layer_types=["conv", "sliding_attention", "conv", "full_attention"]), (1, 3)),
    "falcon_h1": (dict(MAMBA, num_hidden_layers=4, mamba_d_ssm=128), (0, 1, 2, 3)),
    "minimax": (dict(num_hidden_layers=4, num_local_experts=2, num_experts_per_tok=1,
                     layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]), (1, 3)),
    "zamba2": (dict(num_hidden_layers=4, layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"],
                    hybrid_layer_ids=[1, 3], mamba_d_state=8, mamba_headdim=16, n_mamba_heads=8, num_mem_blocks=1,
                    attention_head_dim=16), (1, 3)),
}
HYBRID_FAMILIES = tuple(HYBRID)
HYBRID_ATTENTION = {family: layers for family, (_, layers) in HYBRID.items()}

TEXT = dict(COMMON, num_hidden_layers=3)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=40, image_size=28,
              patch_size=14, attention_dropout=0.0)
COMPOSITE = {
    "gemma3": dict(text_config=dict(TEXT, model_type="gemma3_text", query_pre_attn_scalar=24, sliding_window=4,
                                    layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                   vision_config=VISION, mm_tokens_per_image=4, image_token_index=98, boi_token_index=97,
                   eoi_token_index=96),
    "llava": dict(text_config=dict(TEXT, model_type="llama"),
                  vision_config=dict(VISION, model_type="clip_vision_model", projection_dim=32), image_token_index=98),
    "qwen2_5_vl": dict(text_config=dict(TEXT, model_type="qwen2_5_vl_text",
                                        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                       # windows of 56 pixels, 2 x 2 merge units: two windows per image (16 and 8 patches) in layer 0
                       vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=40, out_hidden_size=64,
                                          fullatt_block_indexes=[1], window_size=56),
                       image_token_id=98, video_token_id=97),
}
# Qwen3.5: its hybrid text decoder (layer 0 Gated DeltaNet, 1 and 2 attention) beside a windowless packed tower.
QWEN3_5_TEXT = dict(TEXT, **{**QWEN3_5, "num_hidden_layers": 3},
                    layer_types=["linear_attention", "full_attention", "full_attention"])
QWEN3_5_VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=40, out_hidden_size=64, patch_size=14,
                      initializer_range=0.2)
COMPOSITE["qwen3_5"] = dict(text_config=dict(QWEN3_5_TEXT, model_type="qwen3_5_text"), vision_config=QWEN3_5_VISION,
                            image_token_id=98, video_token_id=97)
COMPOSITE["qwen3_5_moe"] = dict(text_config=dict(QWEN3_5_TEXT, model_type="qwen3_5_moe_text", num_experts=2,
                                                 num_experts_per_tok=1, moe_intermediate_size=16,
                                                 shared_expert_intermediate_size=16),
                                vision_config=QWEN3_5_VISION, image_token_id=98, video_token_id=97)
# PaliGemma (Gemma), Aya Vision (Cohere 2) and VipLlava (Llama, features from its tower's last two layers of 3) beside
# SigLIP or CLIP towers; Mistral 3 (Mistral) beside Pixtral's, which joins both images' patches in one sequence.
COMPOSITE["paligemma"] = dict(text_config=dict(TEXT, model_type="gemma"), vision_config=VISION, projection_dim=64,
                              image_token_index=98)
COMPOSITE["aya_vision"] = dict(text_config=dict(TEXT, model_type="cohere2"),
                               vision_config=dict(VISION, model_type="siglip_vision_model"), downsample_factor=1,
                               image_token_index=98)
COMPOSITE["vipllava"] = dict(text_config=dict(TEXT, model_type="llama"),
                             vision_config=dict(VISION, model_type="clip_vision_model", projection_dim=32,
                                                num_hidden_layers=3),
                             vision_feature_layers=[-2, -1], image_token_index=98)
COMPOSITE["mistral3"] = dict(text_config=dict(TEXT, model_type="mistral"),
                             vision_config=dict(model_type="pixtral", hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=40, image_size=28,
                                                patch_size=14, head_dim=16),
                             spatial_merge_size=1, image_token_index=98)
# LLaVA-NeXT (Llama, CLIP) and LLaVA-OneVision (Qwen2, SigLIP): each image as its base view and one 28-pixel crop
# (image_grid_pinpoints [[28, 28]]), 10 image tokens with the row-end tokens.
COMPOSITE["llava_next"] = dict(text_config=dict(TEXT, model_type="llama"),
                               vision_config=dict(VISION, model_type="clip_vision_model", projection_dim=32),
                               image_token_index=98, image_grid_pinpoints=[[28, 28]])
COMPOSITE["llava_onevision"] = dict(text_config=dict(TEXT, model_type="qwen2"),
                                    vision_config=dict(VISION, model_type="siglip_vision_model"), image_token_index=98,
                                    image_grid_pinpoints=[[28, 28]], vision_feature_layer=-1)
# InternVL (Qwen2 beside its own tower, q/k norms over all heads' features, 4 patches pixel-shuffled to 1 token),
# LFM2-VL (LFM2's hybrid text decoder, attention in layers 1 and 2, beside SigLIP 2) and Command A Vision (Cohere 2,
# SigLIP).
COMPOSITE["internvl"] = dict(text_config=dict(TEXT, model_type="qwen2"),
                             vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=40, image_size=[28, 28], patch_size=[14, 14],
                                                use_qk_norm=True, use_mask_token=False, initializer_range=0.2),
                             image_token_id=98, downsample_ratio=0.5)
COMPOSITE["lfm2_vl"] = dict(text_config=dict(TEXT, model_type="lfm2", layer_types=["conv", "full_attention",
                                                                                    "full_attention"]),
                            vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                               intermediate_size=40, patch_size=14, num_patches=4),
                            downsample_factor=1, image_token_id=98)
COMPOSITE["cohere2_vision"] = dict(text_config=dict(TEXT, model_type="cohere2"),
                                   vision_config=dict(VISION, model_type="siglip_vision_model"), downsample_factor=1,
                                   image_token_id=98)
# Idefics3 and SmolVLM: a Llama text decoder beside a SigLIP-like tower; scale_factor 1 keeps the 4 patches as 4 image tokens.
for _name in ("idefics3", "smolvlm"):
    COMPOSITE[_name] = dict(text_config=dict(TEXT, model_type="llama"), vision_config=dict(VISION, initializer_range=0.2),
                            scale_factor=1, image_token_id=98)
# Qwen2-VL: qwen2_5_vl's text decoder beside a windowless packed tower of width embed_dim (its hidden_size: the text's).
COMPOSITE["qwen2_vl"] = dict(text_config=dict(TEXT, model_type="qwen2_vl_text",
                                              rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
                             vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                                                patch_size=14, initializer_range=0.2),
                             image_token_id=98, video_token_id=97)
# GLM-4V: GLM-4's text attention (q/k/v biases, half of each head rotated on interleaved pairs, by three axes) beside
# a windowless packed tower of Qwen2-VL's kind.
COMPOSITE["glm4v"] = dict(text_config=dict(TEXT, model_type="glm4v_text",
                                           rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                mrope_section=[1, 1, 2], partial_rotary_factor=0.5)),
                          vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=40,
                                             out_hidden_size=64, patch_size=14, image_size=28, spatial_merge_size=2,
                                             temporal_patch_size=2, initializer_range=0.2),
                          image_token_id=98, video_token_id=97)
# GLM-4.5V: the same tower beside a MoE text decoder whose partial rotary takes rotate-half pairs.
COMPOSITE["glm4v_moe"] = dict(COMPOSITE["glm4v"], text_config=dict(COMPOSITE["glm4v"]["text_config"],
                                                                   model_type="glm4v_moe_text", n_routed_experts=4,
                                                                   num_experts_per_tok=2, moe_intermediate_size=16,
                                                                   first_k_dense_replace=1, n_group=1, topk_group=1))
# Qwen3-VL: a Qwen3 text decoder (q/k norms, multimodal rotary) beside Qwen3.5's kind of tower, whose layer 0
# features also join the text's first layer (deepstack).
QWEN3_VL_VISION = dict(QWEN3_5_VISION, deepstack_visual_indexes=[0])
COMPOSITE["qwen3_vl"] = dict(text_config=dict(TEXT, model_type="qwen3_vl_text"), vision_config=QWEN3_VL_VISION,
                             image_token_id=98, video_token_id=97)
COMPOSITE["qwen3_vl_moe"] = dict(text_config=dict(TEXT, model_type="qwen3_vl_moe_text", num_experts=2,
                                                  num_experts_per_tok=1, moe_intermediate_size=16),
                                 vision_config=QWEN3_VL_VISION, image_token_id=98, video_token_id=97)
# Gemma 4: its text decoder's last layer full attention (heads of 24, one key/value head: EXTRA's), SigLIP-like tower.
COMPOSITE["gemma4"] = dict(text_config={**TEXT, **EXTRA["gemma4_text"], "model_type": "gemma4_text",
                                        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
                           vision_config=dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                              num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=14,
                                              position_embedding_size=64),
                           audio_config=None, image_token_id=98, video_token_id=97, boi_token_id=96, eoi_token_id=95,
                           audio_token_id=94, boa_token_id=93, eoa_token_index=92)
COMPOSITE_FAMILIES = tuple(COMPOSITE)
# The text layers that attend, where not all of them (a hybrid text decoder).
COMPOSITE_ATTENTION = {"qwen3_5": (1, 2), "qwen3_5_moe": (1, 2), "lfm2_vl": (1, 2)}
# Their text decoders have adapters (gemma3_text, llama, qwen2_5_vl_text, qwen3_5_text, qwen3_5_moe_text,
# qwen3_vl_text, qwen3_vl_moe_text, gemma4_text).
VERIFIED_COMPOSITES = ("gemma3", "llava", "llava_next", "llava_onevision", "internvl", "lfm2_vl", "cohere2_vision",
                       "paligemma", "aya_vision", "vipllava", "mistral3", "idefics3", "smolvlm", "qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_5_moe",
                       "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe", "gemma4")
# Adapters' rows for text decoders that exist only inside a vision-language model, tested there.
TEXT_DECODERS = {"qwen2_5_vl_text": "qwen2_5_vl", "qwen2_vl_text": "qwen2_vl", "qwen3_vl_text": "qwen3_vl",
                 "qwen3_vl_moe_text": "qwen3_vl_moe", "glm4v_text": "glm4v", "glm4v_moe_text": "glm4v_moe"}


SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, dropout=0.0,
               attention_dropout=0.0, activation_dropout=0.0, init_std=0.2)  # weights large enough for heads to matter
ENCODER_DECODER = {
    "bart": SEQ2SEQ,
    "whisper": dict(SEQ2SEQ, num_mel_bins=8, max_source_positions=6, max_target_positions=32),
    "marian": SEQ2SEQ,
    "mbart": SEQ2SEQ,
    "m2m_100": SEQ2SEQ,
    "pegasus": SEQ2SEQ,
    "blenderbot": SEQ2SEQ,
    "blenderbot-small": SEQ2SEQ,
    "plbart": SEQ2SEQ,
    "t5": dict(EXTRA["t5"], vocab_size=VOCAB, num_decoder_layers=2, pad_token_id=0, eos_token_id=2,
               decoder_start_token_id=0),
    "mt5": dict(EXTRA["mt5"], vocab_size=VOCAB, num_decoder_layers=2, pad_token_id=0, eos_token_id=2,
                decoder_start_token_id=0),
    # UMT5: a relative position bias of its own in every layer, not only the first.
    "umt5": dict(EXTRA["mt5"], vocab_size=VOCAB, num_decoder_layers=2, pad_token_id=0, eos_token_id=2,
                 decoder_start_token_id=0),
}
ENCODER_DECODER_FAMILIES = tuple(ENCODER_DECODER)


def tiny_config(family: str, kind: str = "odd", positions: int = 64):
    """The family's config of the given kind (`positions`: the odd kind's position table only)."""
    if kind == "interface":
        return _interface_config(family)
    if kind == "encoder_decoder":
        from transformers import AutoConfig

        return AutoConfig.for_model(family, **ENCODER_DECODER[family])
    if kind in ("hybrid", "composite"):
        from transformers import AutoConfig

        if kind == "composite":
            return AutoConfig.for_model(family, **COMPOSITE[family])
        known = AutoConfig.for_model(family)
        common = {k: v for k, v in COMMON.items() if hasattr(known, k)}
        return AutoConfig.for_model(family, **{**common, **HYBRID[family][0]})
    if kind != "odd":
        raise ValueError(kind)
    return _odd_config(family, positions)


def tiny_model(family: str, seed: int = 0, kind: str = "odd", positions: int = 64):
    """The family's model in eval mode with its default attention (SDPA where it has one).

    Args:
        family: a name of `ODD_FAMILIES` or `INTERFACE_FAMILIES` (by `kind`).
        seed: torch seed of the random init.
        kind: "odd" (a fresh model each call; bert is a `BertModel`, the rest causal LMs),
            "interface" (shared, see the module docstring; encoders as base models, T5 its
            encoder alone), "hybrid", "composite" or "encoder_decoder" (fresh each call).
        positions: the odd kind's position table.
    """
    if kind == "interface":
        return _interface_model(family, seed)
    import transformers as tf

    if kind == "encoder_decoder":
        torch.manual_seed(seed)
        cls = tf.AutoModelForSpeechSeq2Seq if family == "whisper" else tf.AutoModelForSeq2SeqLM
        return cls.from_config(tiny_config(family, kind)).eval()

    if kind in ("hybrid", "composite"):
        torch.manual_seed(seed)
        cls = tf.AutoModelForCausalLM if kind == "hybrid" else tf.AutoModelForImageTextToText
        model = cls.from_config(tiny_config(family, kind)).eval()
        return _image_reaches_text(model) if kind == "composite" else model

    torch.manual_seed(seed)
    config = tiny_config(family, kind, positions)
    cls = tf.BertModel if family == "bert" else tf.AutoModelForCausalLM
    model = cls.from_config(config) if cls is tf.AutoModelForCausalLM else cls(config)
    return model.eval()


DECODER_LAYERS, DECODER_HEADS = 3, 2  # tiny_decoder_alone's, unlike its encoder's 2 layers of 4 heads


def tiny_decoder_alone(family: str = "bart", seed: int = 0):
    """A bart-like family's ForCausalLM: its decoder without the encoder (self-attention and
    cross-attention in every layer), with depth and head count unlike the encoder's config side."""
    import transformers as tf

    config = tf.AutoConfig.for_model(
        family, vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=DECODER_LAYERS,
        encoder_attention_heads=4, decoder_attention_heads=DECODER_HEADS, encoder_ffn_dim=37, decoder_ffn_dim=37,
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        use_cache=False)  # transformers sizes the KV cache by num_hidden_layers, the encoder's depth
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def tiny_mllama(full: bool = False, seed: int = 0):
    import transformers as tf

    text = dict(COMMON, num_hidden_layers=3, cross_attention_layers=[1])
    torch.manual_seed(seed)
    if not full:
        return tf.MllamaForCausalLM(tf.MllamaTextConfig(**text)).eval()
    vision = dict(hidden_size=32, num_hidden_layers=2, num_global_layers=1, attention_heads=2, intermediate_size=40,
                  image_size=28, patch_size=14, vision_output_dim=64, intermediate_layers_indices=[0], max_num_tiles=1,
                  supported_aspect_ratios=[[1, 1]])
    config = tf.AutoConfig.for_model("mllama", text_config=text, vision_config=vision, image_token_index=98)
    return _image_reaches_text(tf.AutoModelForImageTextToText.from_config(config).eval())


def zamba2_with_lora(num_mem_blocks: int = 1, seed: int = 0):
    """Tiny zamba2 with per-layer LoRA on q, k, v and rotary. `num_mem_blocks` 1: layers 1 and 3
    share one block (its adapter list holds both layers' LoRA); 2: each has its own block, whose
    list holds only its own LoRA (an Identity in the other's slot). The model's own head size
    (2 * hidden / heads) and as many key/value heads as heads, which its adapters (2 * hidden
    rows) need; LoRA weights drawn at scale 0.3 from their own seed (their init is close to 0)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config("zamba2", "hybrid")
    config.use_shared_attention_adapter, config.use_mem_rope = True, True
    config.attention_head_dim = 2 * config.hidden_size // config.num_attention_heads  # tiny.py sets 16
    config.num_key_value_heads = config.num_attention_heads
    config.adapter_rank, config.num_mem_blocks = 6, num_mem_blocks
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "_adapter_list" in name and "gate_up" not in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


# Parameters that vision-language models initialise to zero or nearly, so that a fresh model's logits
# ignore the image or parts of its tower: gemma3's image projection, mllama's cross-attention gates
# (tanh(0) = 0) and the gates of its global vision layers (N(0, 0.02)).
_IMAGE_GATES = ("mm_input_projection_weight", "cross_attn_attn_gate", "cross_attn_mlp_gate", "gate_attn", "gate_ffn")


def _image_reaches_text(model):
    """Fill the zero-initialised `_IMAGE_GATES` (from their own seed, so the other weights are
    unchanged), so that the image, and what headscope does in the vision tower, reaches the logits.
    Text-only inputs never pass through them."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1] in _IMAGE_GATES:
                param.copy_(torch.randn(param.shape, generator=g) * 0.5 + 1.0)
    return model


def tiny_inputs(batch: int = 2, length: int = 11, seed: int = 1, pad: bool = True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if pad and batch > 1:
        mask[1, -3:] = 0  # right padding on the second example
    return {"input_ids": ids, "attention_mask": mask}


def tiny_seq2seq_inputs(family: str, seed: int = 1) -> dict:
    """An encoder-decoder's inputs: the encoder's (whisper: `input_features` `[2, 8, 12]`; the
    others: 11 token ids, the second example right-padded by 3) and 7 `decoder_input_ids`."""
    g = torch.Generator().manual_seed(seed + 1)
    decoder_ids = torch.randint(3, VOCAB, (2, 7), generator=g)
    if family == "whisper":
        return {"input_features": torch.randn(2, 8, 12, generator=g), "decoder_input_ids": decoder_ids}
    return {**tiny_inputs(seed=seed), "decoder_input_ids": decoder_ids}


def tiny_image_inputs(family: str, seed: int = 1) -> dict:
    """Token ids with image tokens (id 98) at positions 2.., one 28-pixel image per example."""
    x = tiny_inputs(seed=seed)
    ids = x["input_ids"].clone()
    g = torch.Generator().manual_seed(seed + 2)
    if family == "mllama":
        ids[:, 1] = 98  # one image token; the image reaches the text through cross-attention
        return dict(x, input_ids=ids, pixel_values=torch.randn(2, 1, 1, 3, 28, 28, generator=g),
                    aspect_ratio_ids=torch.ones(2, 1, dtype=torch.long),
                    aspect_ratio_mask=torch.ones(2, 1, 1, dtype=torch.long),
                    cross_attention_mask=torch.ones(2, 11, 1, 1, dtype=torch.long))
    if family in ("qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe"):  # 4 x 6 patches of 14 pixels, merged 2 x 2: 6 image tokens
        ids[:, 2:8] = 98
        images = dict(pixel_values=torch.randn(2 * 24, 3 * 2 * 14 * 14, generator=g),
                      image_grid_thw=torch.tensor([[1, 4, 6], [1, 4, 6]]))
        if family != "qwen2_5_vl":  # the others' multimodal rotary needs to be told which tokens are the image's
            images["mm_token_type_ids"] = (ids == 98).long()
        return dict(x, input_ids=ids, **images)
    if family == "gemma4":  # patches of 14 pixels on a 6 x 3 grid (x, y), pooled 3 x 3: 2 image tokens
        ids[:, 2:4] = 98
        across, down = torch.meshgrid(torch.arange(6), torch.arange(3), indexing="xy")  # (3, 6) each
        positions = torch.stack([across.flatten(), down.flatten()], dim=-1)  # (18, 2), row by row
        return dict(x, input_ids=ids, pixel_values=torch.rand(2, 18, 3 * 14 * 14, generator=g),
                    image_position_ids=positions.expand(2, -1, -1).clone())
    ids[:, 2:6] = 98  # (28 / 14) ** 2 = 4 patches: gemma3's mm_tokens_per_image, llava's patches
    if family == "gemma3":
        ids[:, 1], ids[:, 6] = 97, 96  # begin and end of image
    if family in ("idefics3", "smolvlm"):  # [batch, image, channel, height, width]: one image each
        return dict(x, input_ids=ids, pixel_values=torch.randn(2, 1, 3, 28, 28, generator=g))
    if family in ("llava_next", "llava_onevision"):  # the base view and one crop per image: 10 image tokens
        x = tiny_inputs(length=21, seed=seed)
        ids = x["input_ids"].clone()
        ids[:, 2:12] = 98
        return dict(x, input_ids=ids, pixel_values=torch.randn(2, 2, 3, 28, 28, generator=g),
                    image_sizes=torch.tensor([[28, 28], [28, 28]]))
    if family == "internvl":  # 4 patches, pixel-shuffled by downsample_ratio 0.5 to one image token
        ids = x["input_ids"].clone()
        ids[:, 2] = 98
        return dict(x, input_ids=ids, pixel_values=torch.randn(2, 3, 28, 28, generator=g))
    if family == "lfm2_vl":  # SigLIP 2: 4 flattened patches of 14 pixels on a 2 x 2 grid
        return dict(x, input_ids=ids, pixel_values=torch.randn(2, 4, 3 * 14 * 14, generator=g),
                    spatial_shapes=torch.tensor([[2, 2], [2, 2]]), pixel_attention_mask=torch.ones(2, 4, dtype=torch.bool))
    if family == "mistral3":  # Pixtral is told each image's size
        return dict(x, input_ids=ids, pixel_values=torch.randn(2, 3, 28, 28, generator=g),
                    image_sizes=torch.tensor([[28, 28], [28, 28]]))
    return dict(x, input_ids=ids, pixel_values=torch.randn(2, 3, 28, 28, generator=g))


def output_of(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _odd_config(family: str, positions: int):
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


def _interface_config(family: str):
    """The family's config with COMMON's sizes where the family has them (GPT-2 has no KV heads)."""
    from transformers import AutoConfig

    known = AutoConfig.for_model(family)
    known.allow_global_per_layer_attribute_access = True  # gemma4_text's head_dim is per layer: asked only here
    common = {k: v for k, v in COMMON.items() if hasattr(known, k)}
    kwargs = {k: v for k, v in {**common, **EXTRA[family]}.items() if v is not None}
    return AutoConfig.for_model(family, **kwargs)


@functools.cache
def _interface_model(family: str, seed: int = 0):
    """Logits for decoders, the last hidden state for encoders (T5, mT5, UMT5: the encoder alone)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = _interface_config(family)
    if family in ("t5", "mt5", "umt5"):
        model = {"t5": tf.T5EncoderModel, "mt5": tf.MT5EncoderModel, "umt5": tf.UMT5EncoderModel}[family](config)
    elif family in ENCODERS:
        model = tf.AutoModel.from_config(config)
    else:
        model = tf.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
                module.sinks.copy_(torch.randn(module.sinks.shape) * 2)  # sinks that take real mass
    return model.eval()
