"""The table of adapters: one `Adapter` row per architecture family, and the vision towers' rows.

- `ADAPTERS`: the text (and encoder-decoder) families, each row naming where its layers and attention
  blocks are, its q/k/v layout and what its attention adds to softmax attention (`Adapter`'s fields,
  `headscope.hf.adapter_spec`), with its line for the family table.
- `VISION_ADAPTERS`: vision-language models' vision towers, keyed by `config.vision_config.model_type`.

Data only: `headscope.hf.adapters` reads the table (`adapter_for`, `attention_blocks`, ...) and
re-exports it; shared code never branches on a family's name.
"""
from __future__ import annotations

from .adapter_spec import Adapter, AudioEncoder, Latent, LoRA, QKNorm, Rotary, SiteGroup, Temperature
from .layouts import (FusedConv1D, FusedGroups, FusedMultiQuery, FusedPerHead, FusedRows, GatedQuery, HeadGate,
                      KeysAsValues, Separate, SeparateGate)

__all__ = ["ADAPTERS", "VISION_ADAPTERS"]

_QKV = Separate("q_proj", "k_proj", "v_proj")
_HYBRID = "hybrid: only its attention layers ({}) are captured, under the model's own layer numbers"
_BERT_QKV = Separate("self.query", "self.key", "self.value")
# An encoder-decoder's decoder: causal self-attention and cross-attention over the encoder's output.
_BART_DECODER = (SiteGroup("decoder", "self", "decoder.layers", "self_attn", heads="decoder_attention_heads"),
                 SiteGroup("decoder", "cross", "decoder.layers", "encoder_attn", heads="decoder_attention_heads"))
_T5_DECODER = (SiteGroup("decoder", "self", "decoder.block", "layer.0.SelfAttention"),
               SiteGroup("decoder", "cross", "decoder.block", "layer.1.EncDecAttention"))
_MLA = ("multi-head latent attention (MLA): q from a low-rank latent, keys and values of every head from one "
        "latent per token and a rotary key shared by all heads; q/k heads larger than v's; from_hf builds "
        "MultiHeadAttention(latent=...)")
_ENCODER_DECODER = ("sites: encoder (self, bidirectional; the default), decoder.self (causal), decoder.cross "
                    "(queries from the decoder, keys from the encoder's output)")

ADAPTERS = (
    Adapter("llama", ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "gemma", "starcoder2", "ministral", "phimoe",
                      "seed_oss", "arcee", "exaone", "internlm3", "solar_open", "jais2", "cwm"),
            layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj", rotary=Rotary(),
            notes="GQA, rotary, sliding windows where configured; seed_oss and solar_open: q/k/v biases without an "
                  "o_proj bias"),
    Adapter("qwen2_5_vl_text", ("qwen2_5_vl_text", "qwen2_vl_text"), layers="layers", block="self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(),
            notes="qwen2_5_vl's and qwen2_vl's text decoder: GQA, q/k/v biases, multimodal rotary (the model's rotary module "
                  "joins the temporal, height and width tables by mrope_section into one table per position)"),
    Adapter("glm4v_text", ("glm4v_text",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(interleaved=True),
            notes="GLM-4V's text decoder: GQA, q/k/v biases, partial multimodal rotary on interleaved pairs (the "
                  "model's rotary module builds one table per position from its temporal, height and width "
                  "positions)"),
    Adapter("glm4v_moe_text", ("glm4v_moe_text",), layers="layers", block="self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(),
            notes="GLM-4.5V's text decoder: GQA, partial multimodal rotary on rotate-half pairs (not GLM-4V's "
                  "interleaved ones), MoE"),
    Adapter("qwen3_vl_text", ("qwen3_vl_text", "qwen3_vl_moe_text"), layers="layers", block="self_attn", core="",
            qkv=_QKV, out="o_proj", rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm"),
            notes="Qwen3-VL's text decoder: GQA, per-head q/k RMSNorm before rotary, multimodal rotary (the model's "
                  "rotary module builds one table per position from its temporal, height and width positions)"),
    Adapter("granite", ("granite", "granitemoe", "granitemoeshared"), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), notes="attention_multiplier is the score scale"),
    Adapter("granite_swa", ("granite_swa", "granitemoe_swa"), layers="layers", block="self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(theta_per_layer="layer_rope_theta"), sinks="sinks", weights_before_sinks=True,
            notes="attention_multiplier is the score scale; sliding windows; a learned sink logit per head, which "
                  "its eager attention applies by scaling the output by sigmoid(logsumexp(scores) - sink): its eager "
                  "weights leave the sink out (rows sum to 1), headscope's patterns hold it (rows sum to less); "
                  "a rotary base per layer (layer_rope_theta), 0 for a NoPE layer"),
    Adapter("qwen3", ("qwen3", "qwen3_moe", "apertus", "dots1", "mellum", "hy_v3"), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm"), notes="per-head q/k RMSNorm before rotary"),
    Adapter("gemma2", ("gemma2", "vaultgemma"), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), softcap="attn_logit_softcapping",
            notes="tanh soft-capped scores, query_pre_attn_scalar, sliding windows; defaults to eager"),
    Adapter("gemma3", ("gemma3_text",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm"), softcap="attn_logit_softcapping",
            notes="per-head q/k norm, local and global rotary, sliding windows"),
    Adapter("gemma4", ("gemma4_text", "gemma3n_text"), layers="layers", block="self_attn", core="",
            qkv=KeysAsValues("q_proj", "k_proj", "v_proj"), out="o_proj", rotary=Rotary(),
            qk_norm=QKNorm("q_norm", "k_norm"), v_norm="v_norm", sizes_per_layer=True, kv_shared="is_kv_shared_layer",
            notes="per-head q/k RMSNorm and a gainless RMSNorm on each head's values, scores unscaled (scaling 1), "
                  "sliding windows; its full-attention layers with their own head size (global_head_dim), "
                  "proportional rotary (tables as wide as the head, angle 0 past partial_rotary_factor) and, with "
                  "attention_k_eq_v, fewer key/value heads whose values are the key projection's output; from_hf "
                  "and verify refuse the last num_kv_shared_layers layers (they reuse another layer's keys and "
                  "values; analyze then skips the OV table with a note); the OV table leaves out the value norm's "
                  "per-token scale; gemma3n_text: the same attention, every layer's heads alike"),
    Adapter("cohere", ("cohere",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(interleaved=True), qk_norm=QKNorm("q_norm", "k_norm", switch="use_qk_norm"),
            notes="interleaved rotary, optional per-head q/k LayerNorm"),
    Adapter("olmo", ("olmo",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), clip="clip_qkv", notes="clip_qkv clamps q, k, v"),
    Adapter("olmoe", ("olmoe",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm", over="projection"), clip="clip_qkv",
            clip_after_norm=True, notes="q/k RMSNorm over the whole projection; clip_qkv clamps q, k, v after the "
                                        "norms"),
    Adapter("olmo2", ("olmo2", "olmo3", "flex_olmo", "minimax_m2"), layers="layers", block="self_attn", core="",
            qkv=_QKV, out="o_proj", rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm", over="projection"),
            notes="q/k RMSNorm over the whole projection; olmo3: sliding windows in some layers; minimax_m2: "
                  "partial rotary (partial_rotary_factor)"),
    Adapter("glm", ("glm", "glm4", "helium", "ernie4_5", "ernie4_5_moe"), layers="layers", block="self_attn", core="",
            qkv=_QKV, out="o_proj", rotary=Rotary(interleaved=True, tables="halves"),
            notes="interleaved rotary (pairs 2i, 2i + 1) taking its angles from the first half of rotate-half "
                  "tables; partial (the first partial_rotary_factor of each head) where configured: glm and glm4 "
                  "by default 0.5"),
    Adapter("glm4_moe", ("glm4_moe",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm", switch="use_qk_norm"),
            notes="partial rotary (partial_rotary_factor, by default 0.5), optional per-head q/k RMSNorm before it"),
    Adapter("exaone4", ("exaone4", "exaone_moe"), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(switch="is_sliding", switch_if_set="sliding_window"), qk_norm=QKNorm("q_norm", "k_norm"),
            notes="per-head q/k RMSNorm before rotary; with a sliding_window, rotary only in the sliding layers, "
                  "the full-attention layers without positional encoding (NoPE)"),
    Adapter("cohere2", ("cohere2",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(interleaved=True, switch="sliding_window"),
            notes="interleaved rotary in the sliding-window layers only, the full-attention layers without "
                  "positional encoding (NoPE)"),
    Adapter("cohere2_moe", ("cohere2_moe",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(interleaved=True, switch="sliding_window", force="force_rope"),
            notes="cohere2's attention: interleaved rotary in the sliding-window layers, the full-attention layers "
                  "NoPE, except the dense prefix layers (force_rope, with prefix_dense_sliding_window_pattern 1), "
                  "full attention with rotary"),
    Adapter("nemotron", ("nemotron",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), notes="partial rotary (partial_rotary_factor)"),
    Adapter("hunyuan_v1", ("hunyuan_v1_dense", "hunyuan_v1_moe"), layers="layers", block="self_attn", core="",
            qkv=_QKV, out="o_proj", rotary=Rotary(),
            qk_norm=QKNorm("query_layernorm", "key_layernorm", after_rotary=True),
            notes="per-head q/k RMSNorm after rotary"),
    Adapter("nanochat", ("nanochat",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(backwards=True), qk_norm=QKNorm("q_norm", "k_norm", after_rotary=True),
            notes="rotary by minus the angle (its rotate_half flips signs); per-head gainless q/k RMSNorm after it"),
    Adapter("llama4_text", ("llama4_text",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(interleaved=True, tables="complex", switch="use_rope"),
            qk_norm=QKNorm("qk_norm", "qk_norm", where_present=True, after_rotary=True),
            temperature=Temperature("floor_scale", "attn_scale", switch="attn_temperature_tuning"),
            notes="rotary on interleaved pairs, as complex numbers, in the layers no_rope_layers marks, the others "
                  "NoPE with temperature tuning (the query at position t times 1 + attn_scale * log(1 + floor((t + "
                  "1) / floor_scale))); chunked attention (attention_chunk_size) in the rotary layers; use_qk_norm: "
                  "a gainless L2 norm of q and k after rotary, which from_hf takes before it (a rotation keeps the "
                  "norm)"),
    Adapter("smollm3", ("smollm3",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(switch="use_rope"), notes="NoPE layers (no rotary) between rotary ones"),
    Adapter("gpt_oss", ("gpt_oss",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), sinks="sinks",
            notes="learned sink logit per head: pattern rows sum to less than 1; defaults to eager"),
    Adapter("phi", ("phi",), layers="layers", block="self_attn", core="", qkv=_QKV, out="dense",
            rotary=Rotary(dims="rotary_ndims"), qk_norm=QKNorm("q_layernorm", "k_layernorm", switch="qk_layernorm"),
            notes="partial rotary"),
    Adapter("stablelm", ("stablelm",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(dims="rotary_ndims"),
            qk_norm=QKNorm("q_layernorm", "k_layernorm", over="heads_first", switch="qk_layernorm"),
            notes="partial rotary"),
    Adapter("persimmon", ("persimmon",), layers="layers", block="self_attn", core="",
            qkv=FusedPerHead("query_key_value"), out="dense", rotary=Rotary(dims="rotary_ndims"),
            qk_norm=QKNorm("q_layernorm", "k_layernorm", switch="qk_layernorm"),
            notes="fused per-head qkv, partial rotary, optional per-head q/k LayerNorm before it"),
    Adapter("afmoe", ("afmoe",), layers="layers", block="self_attn", core="",
            qkv=SeparateGate("q_proj", "k_proj", "v_proj", "gate_proj"), out="o_proj",
            rotary=Rotary(switch="is_local_attention"), qk_norm=QKNorm("q_norm", "k_norm"), output_gate=True,
            notes="per-head q/k RMSNorm; rotary in the sliding-window layers only, the full-attention layers NoPE; "
                  "a sigmoid output gate (gate_proj, per element, from the layer's input) between attention and "
                  "o_proj: z (hook_z, ablation, patching) is o_proj's input, after the gate; no OV table"),
    Adapter("ministral3", ("ministral3",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(),
            temperature=Temperature("original_max_position_embeddings", "llama_4_scaling_beta", nope_only=False,
                                    offset=0.0, in_rope_parameters=True),
            notes="GQA, rotary, sliding windows where configured; every layer scales the query at position t by "
                  "1 + beta * log(1 + floor(t / original_max_position_embeddings)) (rope_parameters' "
                  "llama_4_scaling_beta), after rotary"),
    Adapter("mimo_v2_flash", ("mimo_v2_flash",), layers="layers", block="self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(by_layer_type="layer_type"), sinks="sinks", sizes_per_layer=True,
            value_size="v_head_dim", value_scale="v_scale",
            notes="sliding-window layers with twice the key/value heads and learned sink logits, full-attention "
                  "layers without sinks; values narrower than q/k (v_head_dim) and scaled by attention_value_scale "
                  "(from_hf folds the scale into W_V); partial rotary per layer type (rope_parameters by "
                  "layer type)"),
    Adapter("biogpt", ("biogpt",), layers="layers", block="self_attn", core="", qkv=_QKV, out="out_proj",
            notes="learned absolute positions, no rotary; q/k/v/o biases"),
    Adapter("dbrx", ("dbrx",), layers="blocks", block="norm_attn_norm.attn", core="", qkv=FusedRows("Wqkv"),
            out="out_proj", rotary=Rotary(), clip="clip_qkv", sizes_per_layer=True,
            notes="fused Wqkv, GQA (attn_config's kv_n_heads), clip_qkv clamps q, k, v"),
    Adapter("laguna", ("laguna",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm"), output_gate=True,
            no_from_hf="from_hf and verify are not available for laguna (its output gate is a softplus, per head "
                       "by default, not MultiHeadAttention's per-element sigmoid); capture, ablate and analyze work",
            notes="per-head q/k RMSNorm before rotary, sliding windows; a softplus output gate (g_proj, per head or "
                  "per element) between attention and o_proj: z (hook_z, ablation, patching) is o_proj's input, "
                  "after the gate; from_hf/verify not available"),
    Adapter("doge", ("doge",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj", rotary=Rotary(),
            no_from_hf="from_hf and verify are not available for doge (its dynamic mask, a per-head score bias from "
                       "the values keeping each query's top keep_window_size keys, is not computed by "
                       "MultiHeadAttention); capture, ablate and analyze work",
            notes="dynamic mask attention: a per-head score bias computed from the values (dt_proj, A), past "
                  "keep_window_size keys only the top ones kept, joins the mask the model passes (captured as "
                  "it is); from_hf/verify not available"),
    Adapter("phi3", ("phi3",), layers="layers", block="self_attn", core="", qkv=FusedRows("qkv_proj"), out="o_proj",
            rotary=Rotary(), notes="fused qkv_proj"),
    Adapter("gptj", ("gptj",), layers="h", block="attn", core="", qkv=_QKV, out="out_proj",
            rotary=Rotary(dims="rotary_dim", interleaved=True, sin_first=True), notes="partial interleaved rotary"),
    Adapter("codegen", ("codegen",), layers="h", block="attn", core="", qkv=FusedGroups("qkv_proj", "mp_num"),
            out="out_proj", rotary=Rotary(dims="rotary_dim", interleaved=True, sin_first=True),
            notes="fused qkv_proj in mp_num (4) groups of heads, each [q, v, k]; partial interleaved rotary "
                  "(rotary_dim), as GPT-J's"),
    Adapter("gpt_neox", ("gpt_neox",), layers="layers", block="attention", core="",
            qkv=FusedPerHead("query_key_value"), out="dense", rotary=Rotary(dims="rotary_ndims"),
            notes="fused per-head qkv, partial rotary"),
    Adapter("gpt2", ("gpt2",), layers="h", block="attn", core="", qkv=FusedConv1D("c_attn"),
            out="c_proj", out_is_conv1d=True, notes="fused Conv1D qkv"),
    Adapter("gpt_bigcode", ("gpt_bigcode",), layers="h", block="attn", core="",
            qkv=FusedMultiQuery("c_attn", "multi_query"), out="c_proj", sizes_per_layer=True,
            notes="StarCoder: fused c_attn, with multi_query (the default) [q | k | v] with one key/value head (MQA), "
                  "else grouped per head; learned absolute positions, no rotary"),
    Adapter("opt", ("opt",), layers="decoder.layers", block="self_attn", core="", qkv=_QKV, out="out_proj",
            query_prescaled=True, notes="queries pre-scaled, kernel scale 1"),
    # Multi-head latent attention: keys and values from one low-rank latent per token, a rotary key shared by all heads.
    Adapter("deepseek_v3", ("deepseek_v3", "glm4_moe_lite", "youtu"), layers="layers", block="self_attn",
            core="", qkv=None, out="o_proj", latent=Latent(regroup="rope_interleave"), rotary=Rotary(),
            notes=_MLA + "; with rope_interleave, the rotary dims' pairs (2i, 2i + 1) regrouped to halves and rotated "
                         "so"),
    Adapter("deepseek_v32", ("deepseek_v32",), layers="layers", block="self_attn", core="", qkv=None, out="o_proj",
            latent=Latent(regroup=True), rotary=Rotary(), selector="indexer",
            notes=_MLA + ", without an indexer; DeepSeek Sparse Attention: an indexer picks each query's top "
                         "index_topk keys, the same for every head, and the others are masked (the patterns are "
                         "sparse); verify hands from_hf's module the model's own selection in the mask; the rotary "
                         "pairs (2i, 2i + 1) regrouped to halves"),
    Adapter("glm_moe_dsa", ("glm_moe_dsa",), layers="layers", block="self_attn", core="", qkv=None, out="o_proj",
            latent=Latent(regroup=True), rotary=Rotary(), returns=("output", "weights", "indices"),
            notes=_MLA + ", without an indexer; DeepSeek Sparse Attention as deepseek_v32's, its 'shared' layers "
                         "(indexer_types) reusing the previous indexer's picks; each layer returns the keys it "
                         "attended to, which verify hands from_hf's module in the mask; the rotary pairs (2i, 2i + 1) "
                         "regrouped to halves"),
    Adapter("hy_v4", ("hy_v4",), layers="layers", block="self_attn", core="", qkv=None, out="o_proj",
            latent=Latent(gate="gate_proj"), rotary=Rotary(), sinks="sinks", output_gate=True,
            returns=("output", "weights", "indices"),
            notes=_MLA + "; DeepSeek Sparse Attention as glm_moe_dsa's ('shared' layers, indexer_types, reuse the "
                         "previous indexer's picks; each layer returns the keys it attended to, which verify hands "
                         "from_hf's module in the mask), learned sink logits and a sigmoid output gate (gate_proj, "
                         "per element of each head's values; z is o_proj's input, after it)"),
    Adapter("deepseek_v2", ("deepseek_v2",), layers="layers", block="self_attn", core="", qkv=None, out="o_proj",
            latent=Latent(), rotary=Rotary(interleaved=True, tables="complex"),
            notes=_MLA + "; rotary on interleaved pairs, as complex numbers"),
    Adapter("minicpm3", ("minicpm3",), layers="layers", block="self_attn", core="", qkv=None, out="o_proj",
            latent=Latent(), rotary=Rotary(), notes=_MLA + "; rotate-half rotary"),
    Adapter("bitnet", ("bitnet",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), mixes_heads="attn_sub_norm",
            notes="attn_sub_norm (an RMSNorm over all heads) mixes heads before o_proj: z (hook_z, ablation, "
                  "patching) is o_proj's input, after it, and from_hf copies it (`pre_out_norm`); the OV table folds "
                  "its gain into W_O and leaves out its per-token scale; a quantized checkpoint (BitLinear, "
                  "AutoBitLinear layers) is refused by from_hf and verify"),
    # Hybrids: attention in some layers only, beside Mamba, convolutions or linear attention.
    Adapter("jamba", ("jamba",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj", hybrid=True,
            notes=_HYBRID.format("beside Mamba layers") + "; no positional encoding in attention"),
    Adapter("nemotron_h", ("nemotron_h",), layers="layers", block="mixer", core="", qkv=_QKV, out="o_proj",
            hybrid=True, notes=_HYBRID.format("beside Mamba 2 and MLP layers, all under `mixer`") + "; no rotary"),
    Adapter("bamba", ("bamba",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj", rotary=Rotary(),
            hybrid=True, notes=_HYBRID.format("beside Mamba 2 layers")),
    Adapter("granitemoehybrid", ("granitemoehybrid",), layers="layers", block="self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(config_switch=("position_embedding_type", "rope")), hybrid=True,
            notes=_HYBRID.format("beside Mamba 2 layers") + "; attention_multiplier is the score scale; rotary "
                                                              "only with position_embedding_type 'rope'"),
    Adapter("falcon_h1", ("falcon_h1",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), hybrid=True, notes="hybrid: attention and Mamba 2 side by side in every layer; the attention is captured"),
    Adapter("minimax", ("minimax",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), hybrid=True, notes=_HYBRID.format("beside lightning (linear) attention layers")),
    Adapter("lfm2", ("lfm2", "lfm2_moe"), layers="layers", block="self_attn", core="", qkv=_QKV, out="out_proj",
            rotary=Rotary(), qk_norm=QKNorm("q_layernorm", "k_layernorm"), hybrid=True,
            notes=_HYBRID.format("beside short convolutions") + "; per-head q/k norm"),
    Adapter("olmo_hybrid", ("olmo_hybrid",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(needs_base=True), qk_norm=QKNorm("q_norm", "k_norm", over="projection"), hybrid=True,
            notes=_HYBRID.format("beside Gated DeltaNet linear attention") + "; olmo2's attention (q/k RMSNorm over "
                  "the whole projection); rotary only where rope_parameters names a rope_theta (the released "
                  "checkpoints have none: NoPE)"),
    Adapter("lfm3", ("lfm3",), layers="layers", block="self_attn", core="",
            qkv=HeadGate("q_proj", "k_proj", "v_proj", "g_proj"), out="o_proj", rotary=Rotary(),
            qk_norm=QKNorm("q_norm", "k_norm"), output_gate=True, hybrid=True,
            notes=_HYBRID.format("beside short convolutions") + "; per-head q/k RMSNorm, sliding windows in its "
                  "sliding layers, proportional rotary in its full-attention ones; with use_attention_gate, a "
                  "sigmoid gate per head (g_proj, from the layer's input) between attention and o_proj: z is "
                  "o_proj's input, after the gate; no OV table where gated"),
    Adapter("kimi_linear", ("kimi_linear",), layers="layers", block="self_attn", core="", qkv=None, out="o_proj",
            latent=Latent(), hybrid=True,
            notes=_HYBRID.format("beside Kimi Delta Attention (linear) layers, both under `self_attn`") + "; " + _MLA
                  + " without rotary: no positional encoding in attention, the shared key part unrotated"),
    Adapter("qwen3_next", ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"), layers="layers", block="self_attn", core="",
            qkv=GatedQuery("q_proj", "k_proj", "v_proj"), out="o_proj", rotary=Rotary(),
            qk_norm=QKNorm("q_norm", "k_norm"), output_gate=True, hybrid=True,
            notes=_HYBRID.format("beside Gated DeltaNet linear attention") + "; per-head q/k RMSNorm, partial "
                  "rotary; a sigmoid output gate (per element, from the layer's input) between attention and o_proj: "
                  "z (hook_z, ablation, patching) is o_proj's input, after the gate; no OV table (the gate, "
                  "which depends on the input, sits inside the OV circuit); qwen3_5_text and qwen3_5_moe_text (Qwen3.5's "
                  "text decoders): the same attention, their multimodal rotary tables plain ones for text"),
    Adapter("zamba2", ("zamba2",), layers="layers", block="shared_transformer.self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(config_switch=("use_mem_rope", True)), hybrid=True,
            lora=LoRA("linear_q_adapter_list", "linear_k_adapter_list", "linear_v_adapter_list", index="layer_dic",
                      switch="use_shared_attention_adapter"),
            no_ov="OV copying is not available for zamba2: a head's output reaches the residual stream only through "
                  "the shared block's MLP, a linear layer and the next Mamba mixer, so there is no W_O W_U path to "
                  "score (from_hf, verify, capture, ablate, geometry and the other detectors work)",
            notes=_HYBRID.format("the shared transformer blocks, beside Mamba 2 layers") + "; one attention block "
                  "shared by several layers reads the hidden state joined to the embeddings (q, k, v read 2 * "
                  "hidden_size, `MultiHeadAttention`'s d_in), each layer's LoRA on q, k, v folded into its own "
                  "module (from_hf needs layer=); rotary with use_mem_rope; scores scaled by (head_dim / 2) ** -0.5; "
                  "no OV table (the attention output reaches the residual only through the block's MLP and the "
                  "next Mamba mixer)"),
    Adapter("mllama_text", ("mllama_text_model",), layers="layers", block="self_attn", core="", qkv=_QKV,
            out="o_proj", rotary=Rotary(), qk_norm=QKNorm("q_norm", "k_norm", where_present=True), hybrid=True,
            groups=(SiteGroup("text", "cross", "layers", "cross_attn"),),
            notes="mllama's text model (MllamaForCausalLM, and MllamaForConditionalGeneration's language model): "
                  "self-attention layers (rotary, GQA) and cross-attention layers (per-head q/k RMSNorm, keys and "
                  "values from cross_attention_states, the image's features; no rotary); sites: text (both, the "
                  "default), text.self, text.cross; its cross-attention layers never run without an image: "
                  "capture reports them as not run, analyze skips them with a note, ablating, hooking or "
                  "verifying them is an error"),
    Adapter("bert", ("bert", "roberta", "electra", "xlm-roberta", "camembert", "data2vec-text", "xlm-roberta-xl",
                     "ernie", "roc_bert", "xmod"), layers="encoder.layer", block="attention", core="self",
            qkv=_BERT_QKV, out="output.dense", causal=False,
            notes="encoder; xlm-roberta-xl (and xmod with pre_norm): a LayerNorm before the attention, inside the "
                  "block, whose output is what q, k and v read; xmod: per-language adapters in the MLP, the "
                  "language from lang_ids or config.default_language (the model refuses to run without one)"),
    Adapter("nomic_bert", ("nomic_bert",), layers="layers", block="self_attn", core="", qkv=_QKV, out="o_proj",
            rotary=Rotary(), causal=False, notes="encoder, rotary, no q/k/v/o biases"),
    Adapter("distilbert", ("distilbert",), layers="transformer.layer", block="attention", core="",
            qkv=Separate("q_lin", "k_lin", "v_lin"), out="out_lin", causal=False, notes="encoder"),
    Adapter("modernbert", ("modernbert",), layers="layers", block="attn", core="", qkv=FusedRows("Wqkv"), out="Wo",
            rotary=Rotary(), causal=False, notes="encoder, fused Wqkv, local and global attention"),
    Adapter("t5", ("t5", "mt5"), layers="encoder.block", block="layer.0.SelfAttention", core="", qkv=Separate("q", "k", "v"),
            out="o", causal=False, body="encoder", stack="encoder", groups=_T5_DECODER, heads="n_heads",
            returns=("output", "position_bias", "weights"),
            notes=_ENCODER_DECODER + "; analyze runs the encoder, with --sites decoder.self or decoder.cross "
                                     "the decoder's (teacher-forced copies; T5EncoderModel: the encoder alone); "
                                     "scores unscaled, the relative position bias of each stack's first layer "
                                     "joins every layer's mask"),
    Adapter("umt5", ("umt5",), layers="encoder.block", block="layer.0.SelfAttention", core="",
            qkv=Separate("q", "k", "v"), out="o", causal=False, body="encoder", stack="encoder", groups=_T5_DECODER,
            heads="n_heads", bias_in_call=True,
            notes=_ENCODER_DECODER + "; analyze runs the encoder, with --sites decoder.self or decoder.cross "
                                     "the decoder's (teacher-forced copies; UMT5EncoderModel: the encoder alone); "
                                     "scores unscaled, every self-attention layer with a relative position bias of "
                                     "its own, which verify reads from the layer's call"),
    Adapter("bart", ("bart", "marian", "pegasus", "m2m_100", "blenderbot", "blenderbot-small"),
            layers="encoder.layers", block="self_attn", core="", qkv=_QKV, out="out_proj", causal=False,
            body="encoder", stack="encoder", groups=_BART_DECODER, heads="num_heads",
            notes=_ENCODER_DECODER + "; analyze runs the encoder, with --sites decoder.self or decoder.cross "
                                     "the decoder's (teacher-forced copies from decoder_start_token_id); m2m_100 "
                                     "(NLLB's dense checkpoints) too"),
    # mBART and PLBart: bart's attention, but the decoder starts from the target language's code, which their
    # shift_tokens_right rotates from the end of the labels to the front; no single decoder_start_token_id.
    Adapter("mbart", ("mbart", "plbart"), layers="encoder.layers", block="self_attn", core="", qkv=_QKV,
            out="out_proj", causal=False, body="encoder", stack="encoder", groups=_BART_DECODER, heads="num_heads",
            notes=_ENCODER_DECODER + "; analyze runs the encoder, with --sites decoder.self or decoder.cross the "
                                     "decoder's, teacher-forced from the config's decoder_start_token_id; where "
                                     "the config has none (the default: the model starts its decoder from the "
                                     "language code at the end of the labels) analyze at the decoder's sites and "
                                     "`headscope verify` refuse in one line, and headscope.verify on token ids "
                                     "alone runs the model's own shift"),
    Adapter("bart_causal_lm", ("bart", "marian", "pegasus", "blenderbot", "blenderbot-small", "mbart", "plbart"),
            layers="decoder.layers", block="self_attn", core="", qkv=_QKV, out="out_proj", body="decoder",
            groups=(SiteGroup("text", "cross", "decoder.layers", "encoder_attn", heads="decoder_attention_heads"),),
            heads="num_heads", decoder_only=True, default_sites="text.self",
            counts=("decoder_layers", "decoder_attention_heads"),
            notes="BartForCausalLM: bart's decoder alone, a causal LM (and the ForCausalLM of marian, pegasus, "
                  "blenderbot, blenderbot-small, mbart and plbart); sites: text.self (the default), text.cross "
                  "(over encoder_hidden_states, which a causal LM's forward rarely gets: without them capture "
                  "reports it as not run, analyze skips it with a note, ablating or hooking it is an error)"),
    Adapter("whisper", ("whisper",), layers="encoder.layers", block="self_attn", core="", qkv=_QKV, out="out_proj",
            causal=False, body="encoder", stack="encoder", groups=_BART_DECODER, heads="num_heads",
            query_prescaled=True,
            no_analyze="analyze of whisper's encoder is not available (it takes log-mel input_features, not token "
                       "ids); use sites='decoder.self' or 'decoder.cross' (--sites in the CLI): the decoder on the "
                       "text probes, the encoder fed silence",
            audio_encoder=AudioEncoder("num_mel_bins", "max_source_positions", frames_per_position=2),
            notes=_ENCODER_DECODER + "; the encoder takes log-mel input_features: analyze runs at decoder.self and "
                                     "decoder.cross only, the encoder fed the log-mel features of silence; queries "
                                     "pre-scaled, k_proj without bias"),
)


# ---- Vision towers -------------------------------------------------------------------------------------------------
# A vision-language model's vision tower, keyed by `config.vision_config.model_type`. Its attention modules are found
# in the tower by what they do (`headscope.hf.sites`), so `layers`, `block` and `core` are empty: each module is its
# own block and core, and the paths below start at it. Sizes come from the vision config (`hidden_size`) and the
# module (`heads`: its head count attribute); all are bidirectional.
_VISION = dict(layers="", block="", core="", causal=False, stack="vision", heads="num_heads")

VISION_ADAPTERS = (
    Adapter("siglip", ("siglip_vision_model", "siglip2_vision_model", "idefics3_vision", "smolvlm_vision"), qkv=_QKV,
            out="out_proj", scale="scale", **_VISION,
            notes="gemma3's SigLIP tower, and SigLIP 2's (LFM2-VL), Idefics3's and SmolVLM's (SigLIP's attention)"),
    Adapter("internvl_vision", ("internvl_vision",), qkv=_QKV, out="projection_layer", scale="scale",
            qk_norm=QKNorm("q_norm", "k_norm", over="projection"), **_VISION,
            notes="InternVL's tower: with use_qk_norm an RMSNorm over all heads' q (and k) features before the "
                  "heads are split, which from_hf copies"),
    Adapter("pixtral", ("pixtral",), qkv=_QKV, out="o_proj", rotary=Rotary(), **_VISION,
            notes="Mistral 3's Pixtral tower: every image's patches in one sequence, a block-diagonal mask keeping "
                  "each image's to itself; 2-D rotary tables, no biases"),
    Adapter("clip", ("clip_vision_model",), qkv=_QKV, out="out_proj", scale="scale", **_VISION,
            notes="llava's CLIP tower"),
    Adapter("mllama_vision", ("mllama_vision_model",), qkv=_QKV, out="o_proj", **_VISION,
            notes="mllama's local then global vision layers, no biases"),
    # One packed sequence `[patch, d_model]` per forward pass, attention within the pieces cu_seqlens bounds.
    Adapter("qwen2_5_vl_vision", ("qwen2_5_vl_vision",), qkv=FusedRows("qkv"), out="proj", rotary=Rotary(),
            returns=("output",), **_VISION, notes="qwen2_5_vl's windowed tower: fused qkv, 2-D rotary tables"),
    Adapter("qwen2_vl_vision", ("qwen2_vl_vision",), qkv=FusedRows("qkv"), out="proj", rotary=Rotary(), returns=("output",),
            **dict(_VISION, width="embed_dim"),
            notes="Qwen2-VL's packed tower without windows: fused qkv, 2-D rotary tables, its width embed_dim"),
    Adapter("glm4v_vision", ("glm4v_vision", "glm4v_moe_vision"), qkv=FusedRows("qkv"), out="proj", rotary=Rotary(),
            returns=("output",), **_VISION,
            notes="GLM-4V's and GLM-4.5V's packed tower without windows: fused qkv, 2-D rotary tables"),
    Adapter("qwen3_5_vision", ("qwen3_5_vision", "qwen3_5_moe_vision", "qwen3_vl_vision", "qwen3_vl_moe_vision"),
            qkv=FusedRows("qkv"), out="proj", rotary=Rotary(), returns=("output",), **_VISION,
            notes="Qwen3.5's and Qwen3-VL's packed tower without windows: fused qkv, 2-D rotary tables (height and "
                  "width angles in one rotate-half table)"),
    # Gemma 4's projections are Gemma4ClippableLinear: a Linear (`linear`) between optional clamps of input and output.
    Adapter("gemma4_vision", ("gemma4_vision",), qkv=Separate("q_proj.linear", "k_proj.linear", "v_proj.linear"),
            out="o_proj.linear", rotary=Rotary(axes=2), qk_norm=QKNorm("q_norm", "k_norm"), v_norm="v_norm",
            sizes_per_layer=True, **dict(_VISION, heads=None),  # its module names no head count: the config's
            no_from_hf_when=("use_clipped_linears", "from_hf and verify are not available for Gemma 4's vision tower "
                             "with use_clipped_linears: its projections clamp their inputs and outputs to bounds "
                             "from the checkpoint, which MultiHeadAttention does not hold; capture, ablate and hooks "
                             "work"),
            notes="Gemma 4's tower: per-head q/k RMSNorm and a gainless RMSNorm on each head's values, scores "
                  "unscaled (scaling 1), 2-D rotary over two halves of each head (the patch's x angles, then its "
                  "y's), which from_hf turns into one rotate-half layout by reordering each head's q and k dims "
                  "(scores unchanged; hook_q and hook_k hold the reordered dims); refused with use_clipped_linears "
                  "(clamped projections)"),
)
