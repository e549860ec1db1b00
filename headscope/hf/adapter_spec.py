"""What an adapter says about one family's attention: the `Adapter` record and its parts.

- `Adapter`: where a family keeps its layers and attention blocks, the q/k/v/o layout and what its
  attention adds to plain softmax attention (rotary, q/k norms, clipping, soft-capping, sinks, an
  output gate, a norm mixing heads, per-layer LoRA), its other site groups and its family-table line.
- `Rotary`, `QKNorm`, `Temperature`, `LoRA`, `Latent`, `SiteGroup`, `AudioEncoder`: the parts an `Adapter` names.

Data only: the table of adapters is `headscope.hf.adapter_table`, the functions reading it `headscope.hf.adapters`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

__all__ = ["Adapter", "AudioEncoder", "SiteGroup", "Rotary", "QKNorm", "Temperature", "LoRA", "Latent"]


@dataclass(frozen=True)
class Rotary:
    """How a family applies rotary embedding.

    Attributes:
        dims: attribute of the core module holding the number of rotated dims (None: d_head
            times the config's `partial_rotary_factor`, 1 if absent).
        interleaved: pairs are dims (2i, 2i + 1) (GPT-J, Cohere), not (i, i + dims / 2).
        sin_first: the model passes `position_embeddings` as (sin, cos) (GPT-J).
        backwards: the model rotates each pair by minus its angle (nanochat's rotate_half is
            `[x2, -x1]`, not `[-x2, x1]`): its tables are read with sin negated.
        switch: attribute of the core module that is False in layers without rotary (NoPE).
        force: attribute of the core module that, where True, gives the layer rotary whatever
            `switch` says (cohere2_moe's `force_rope`: its dense prefix layers, full attention with
            rotary beside sliding layers that have it and full-attention ones that do not).
        switch_if_set: attribute of the core module: the switch decides only where this one is
            set (not None), and every layer has rotary elsewhere (exaone4: `is_sliding`, with a
            `sliding_window` configured; its full-attention layers are then NoPE).
        config_switch: `(config attribute, value)`: rotary only when the config's attribute has
            that value (granitemoehybrid: `position_embedding_type` "rope"; otherwise no
            positional encoding at all).
        needs_base: rotary only where the config's rotary parameters name a base (`rope_theta`):
            OLMo Hybrid builds no rotary module without one, and its released checkpoints have none
            (NoPE in every layer).
        tables: how the model passes its tables: "layout" (cos and sin in the layout the pairs
            use), "halves" (rotate-half tables, `[a_0 .. a_{r/2-1}]` twice, whose first half gives
            interleaved pair i its angle a_i: GLM, ERNIE 4.5, Helium) or "complex" (one tensor of
            e^(i angle) per pair, its magnitude the rotary's attention scaling: DeepSeek-V2's
            `freqs_cis`).
        by_layer_type: attribute of the core module holding its layer's type, the key under which
            `config.rope_parameters` holds that layer's rotary parameters (mimo_v2_flash: a
            `partial_rotary_factor` per layer type; the factor and base are read there).
        theta_per_layer: config attribute listing every layer's rotary base, 0 in a layer without
            rotary (granite_swa's `layer_rope_theta`: its NoPE layers, which the model passes no
            tables), read at the core's `layer_idx`.
        axes: each head's dims are `axes` equal parts, each rotated "rotate half" within itself
            by its own slice of the tables (Gemma 4's vision tower: a part for the patch's x,
            one for its y; transformers' `apply_multidimensional_rope`). from_hf reorders
            each head's q and k dims (W_q's and W_k's rows, the per-head q/k norms' gains) to
            the parts' first halves, then their second halves, and `rotary_tables` the tables
            alike: the pairs are then one rotate-half layout over the head, and q . k, the
            scores and all after them are unchanged; hook_q and hook_k hold the reordered dims.
    """

    dims: Optional[str] = None
    interleaved: bool = False
    sin_first: bool = False
    backwards: bool = False
    switch: Optional[str] = None
    force: Optional[str] = None
    switch_if_set: Optional[str] = None
    config_switch: Optional[tuple[str, object]] = None
    needs_base: bool = False
    tables: str = "layout"
    by_layer_type: Optional[str] = None
    theta_per_layer: Optional[str] = None
    axes: int = 1


@dataclass(frozen=True)
class QKNorm:
    """Norms on q and k, before rotary unless `after_rotary`.

    Attributes:
        q, k: paths from the core module to the two norm modules.
        over: what they normalise: "head" (`[batch, pos, head, d_head]`), "heads_first"
            (`[batch, head, pos, d_head]`) or "projection" (`[batch, pos, head * d_head]`).
        switch: attribute of the core module that says whether the norms are used.
        where_present: the norms are used by the cores that have them, in a family whose
            cores differ (mllama's cross-attention has them, its self-attention not).
        after_rotary: the model norms after rotary (HunYuan's RMSNorm, Llama 4's L2 norm);
            from_hf's module does too (`MultiHeadAttention(qk_norm_after_rotary=True)`).
    """

    q: str
    k: str
    over: str = "head"
    switch: Optional[str] = None
    where_present: bool = False
    after_rotary: bool = False


@dataclass(frozen=True)
class Temperature:
    """A position-dependent query scale, 1 + attn_scale * log(1 + floor((t + offset) / floor_scale))
    for the query at position t (`MultiHeadAttention(query_temperature=)`): Llama 4's temperature
    tuning in its layers without rotary (offset 1), Ministral 3's in every layer (offset 0).

    Attributes:
        floor, scale: core attributes holding floor_scale and attn_scale, or with
            `in_rope_parameters` keys of the config's `rope_parameters` (Ministral 3's
            original_max_position_embeddings and llama_4_scaling_beta).
        switch: core attribute that is True where the temperature is used (None: wherever it
            applies).
        nope_only: it applies in the layers without rotary only (Llama 4).
        offset: added to the position before the floor division.
        in_rope_parameters: `floor` and `scale` are read from `config.rope_parameters`.
    """

    floor: str
    scale: str
    switch: Optional[str] = None
    nope_only: bool = True
    offset: float = 1.0
    in_rope_parameters: bool = False


@dataclass(frozen=True)
class LoRA:
    """Low-rank adapters one attention block shared by several layers adds to q, k and v, one
    set per layer it serves (zamba2): `q = W_q x + B (A x)`, so each layer's effective weight is
    `W_q + B A`, which `from_hf` folds in for the layer it is given.

    Attributes:
        q, k, v: paths from the core module to the lists of adapters (bias-free linear modules
            `d_in -> rows`), one entry per layer the block may serve.
        index: core attribute mapping the model's layer number to its entry (zamba2's
            `layer_dic`: the layer's position among the attention layers).
        switch: config attribute that is True when the adapters are used.
    """

    q: str
    k: str
    v: str
    index: str
    switch: str


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2 and V3, `headscope.attention.latent`): q from a
    full-rank projection or a low-rank latent with its own RMSNorm, keys and values from one latent
    per token beside a rotary key shared by all heads.

    Attributes:
        q: path from the core to the full-rank query projection (used where `q_rank` is None).
        q_down, q_norm, q_up: the query latent's down projection, norm and up projection.
        kv_down: the down projection `[latent | shared rotary key]` (`kv_a_proj_with_mqa`).
        kv_norm, kv_up: the key/value latent's norm and up projection (per head `[key | value]`).
        q_rank, kv_rank, nope, rope, value: core attributes holding the query latent's width
            (None: no query latent), the key/value latent's, and the per-head sizes of the parts
            without and with rotary and of the values.
        regroup: config attribute that, when True, says the rotary part's pairs (2i, 2i + 1) are
            regrouped to `[evens | odds]` and rotated "rotate half" (DeepSeek-V3's
            `rope_interleave`; `LatentRanks.regroup`), or True: always (DeepSeek-V3.2).
        gate: path from the core to the output gate's projection (`Adapter.output_gate`: hy_v4's
            `gate_proj`, one row per value dim of each head; None: no gate).
    """

    q: str = "q_proj"
    q_down: str = "q_a_proj"
    q_norm: str = "q_a_layernorm"
    q_up: str = "q_b_proj"
    kv_down: str = "kv_a_proj_with_mqa"
    kv_norm: str = "kv_a_layernorm"
    kv_up: str = "kv_b_proj"
    q_rank: str = "q_lora_rank"
    kv_rank: str = "kv_lora_rank"
    nope: str = "qk_nope_head_dim"
    rope: str = "qk_rope_head_dim"
    value: str = "v_head_dim"
    regroup: Union[str, bool, None] = None
    gate: Optional[str] = None


@dataclass(frozen=True)
class SiteGroup:
    """Attention sites of a family beside its default ones (an encoder-decoder's decoder).

    Attributes:
        stack: the stack they belong to ("decoder"; `headscope.hf.sites.STACKS`).
        kind: "self" or "cross" (queries from this stack, keys and values from the encoder's output).
        layers: path from `model.base_model` to the stack's list of layers.
        block: path from a layer to the attention block (its `core`, `qkv` and `out` as the family's).
        heads: config attribute holding the group's head count (None: `head_sizes`).
    """

    stack: str
    kind: str
    layers: str
    block: str
    heads: Optional[str] = None


@dataclass(frozen=True)
class AudioEncoder:
    """An encoder that reads log-mel features `[batch, mel bin, frame]`, not token ids.

    Attributes:
        mel_bins: config attribute holding the number of mel bins.
        positions: config attribute holding the encoder's output positions (cross-attention's keys).
        frames_per_position: input frames per output position (Whisper: 2, its second
            convolution has stride 2; the encoder refuses any other number of frames).
    """

    mel_bins: str
    positions: str
    frames_per_position: int

    def sizes(self, config) -> tuple[int, int, int]:
        """(mel bins, frames, positions) of the features a model of `config` takes."""
        positions = int(getattr(config, self.positions))
        return int(getattr(config, self.mel_bins)), positions * self.frames_per_position, positions


@dataclass(frozen=True)
class Adapter:
    """How one architecture family names its attention.

    Attributes:
        family: canonical family name.
        model_types: `config.model_type` values it covers.
        layers: path from `model.base_model` to the list of layers.
        block: path from a layer to the attention block (holds q/k/v and the output projection).
        core: path from the block to the module that calls the attention interface ("" = block).
        qkv: layout of the q/k/v weights inside the block (`headscope.hf.layouts`; None with `latent`).
        out: path from the block to the output projection.
        out_is_conv1d: the output projection is a transformers Conv1D (x @ W).
        rotary: how rotary embedding is applied (None: no rotary).
        qk_norm: norms on q and k before rotary (None: none).
        clip: attribute clamping q, k and v after the projections: the core's where it has one
            (DBRX keeps it in its nested attn_config, copied onto the core), else the config's.
        clip_after_norm: the clamp comes after the q/k norms (OLMoE), not right after the projections.
        v_norm: path from the core to a norm on each head's values `[batch, pos, head, d_head]` (Gemma 4).
        temperature: a per-position query temperature in the layers without rotary (`Temperature`).
        sizes_per_layer: head size and key/value heads differ by layer (Gemma 4's full-attention
            layers), or the config does not hold them (GPT-BigCode's one key/value head with
            multi_query; Gemma 4's vision tower, whose modules name no head count of their own): read
            from the core's `head_dim` and `num_key_value_groups`, the query heads from the config.
        value_size: core attribute holding the values' head size where it differs from q's and k's
            (mimo_v2_flash's `v_head_dim`; `MultiHeadAttention(d_value=)`).
        value_scale: core attribute multiplying the values after their projection (mimo_v2_flash's
            `v_scale`): from_hf folds it into W_V's rows and bias, s (W_V x + b) = (s W_V) x + s b,
            so hook_v holds the scaled values the model attends with.
        kv_shared: core attribute that is True in layers reusing the keys and values another
            layer computed (Gemma 4's last num_kv_shared_layers): from_hf refuses those layers.
        softcap: core attribute holding the score soft-cap.
        sinks: core attribute holding the per-head sink logits (None there: a layer without).
        weights_before_sinks: the model's eager attention returns softmax weights over the keys
            alone and scales its output by the sink's share, sigmoid(logsumexp(scores) - sink)
            (granite_swa): the same attention as a sink logit in the softmax, whose weights (headscope's
            patterns) are the eager ones times that share, so rows sum to less than 1. verify then
            compares the module's pattern with the eager weights times the module's row sums, the
            share the module gives the keys (its sink is checked by the output).
        query_prescaled: the model multiplies q by `core.scaling` and asks for scale 1.
        causal: decoder (True) or encoder (False).
        body: path from the text stack to the module that runs the captured layers on token ids
            alone ("" = the stack; T5: "encoder", so an encoder-decoder is analysed as its encoder).
        stack: the stack the default sites (`layers`, `block`) belong to: "text", or "encoder"
            for an encoder-decoder (`headscope.hf.sites.STACKS`).
        groups: the family's other attention sites (`SiteGroup`: an encoder-decoder's decoder
            self- and cross-attention), addressed with `sites=` ("decoder.cross"); a group whose
            layers the model lacks (T5EncoderModel has no decoder) is skipped.
        no_analyze: why `analyze` is refused ("" when it works); with `audio_encoder`, at the
            default sites only.
        audio_encoder: the encoder reads log-mel features (`AudioEncoder`), not tokens (None:
            tokens): `analyze` runs at the decoder's sites only, with the encoder fed silence
            (`headscope.probes.audio`).
        hybrid: only some layers hold the attention block (the others a Mamba mixer, a
            convolution or linear attention, possibly under the same path, as nemotron_h's
            `mixer`): a layer counts when its block's core calls the attention interface.
        mixes_heads: path from the block to a module between the attention function and the
            output projection that mixes the heads' outputs (bitnet's `attn_sub_norm`, an
            RMSNorm over all heads together); z is then read and edited at the output
            projection's input, after the mixing (`z_at_out`), so removing a head removes
            its slice there.
        output_gate: z is multiplied per element by sigmoid(gate(x)) between the attention
            function and the output projection (Qwen3-Next), the gate's rows read by the layout's
            `gate` (`GatedQuery`), or under latent attention by `Latent.gate` (hy_v4). The gate keeps heads apart, but z is still read and edited at
            the output projection's input, after it (`z_at_out`), as where a norm mixes heads:
            hook_z, patching and mean ablation see the gated z, and zero ablation is the same
            either side of the gate. `MultiHeadAttention` takes it as `output_gate`.
        heads: core attribute holding its query head count, where the stacks of a model have
            their own (bart's encoder and decoder; None: the config's, `head_sizes`); the head
            size is then the query projection's rows over it (T5's `d_kv`).
        returns: what the core's forward returns, in order: ("output", "weights"), or T5's
            ("output", "position_bias", "weights"), the additive score bias it used (its relative
            positions, computed by the first layer of each stack and handed on), which `verify`
            adds to the mask, or GLM-5's and hy_v4's ("output", "weights", "indices"), the keys each query
            attended to (its own indexer's picks or, in a "shared" layer, the previous one's),
            which `verify` joins to the mask.
        bias_in_call: the core computes an additive score bias itself and hands it to the
            attention function (`position_bias`) without returning it (UMT5: every layer its own
            relative position bias); `verify` reads it from that call and adds it to the mask.
        no_from_hf: why `from_hf` and `verify` are not available ("" when they are).
        no_from_hf_when: `(config attribute, why)`: from_hf and verify refuse, giving why,
            where the config holding the block's sizes sets that attribute (Gemma 4's vision
            tower with `use_clipped_linears`: its projections clamp their inputs and outputs
            to bounds read from the checkpoint, which `MultiHeadAttention` does not hold).
        decoder_only: the adapter of a family's decoder alone (BartForCausalLM: the decoder
            without its encoder, `config.is_encoder_decoder` False), chosen over the family's
            encoder-decoder adapter for such a config; its table row is named `family`.
        default_sites: the default group where it is not the whole `stack` (a decoder alone
            has self- and cross-attention in every layer: "text.self").
        counts: config attributes holding the default stack's layer and head counts, where
            they are not `num_hidden_layers` and `num_attention_heads` (a BART config maps
            those to its encoder's).
        scale: core attribute holding the score scale (absent there: d_head ** -0.5).
        width: config attribute holding the width the block reads and writes, where the adapter
            names the module's own head count (`heads`) or `sizes_per_layer` (Qwen2-VL's vision
            tower: `embed_dim`, its `hidden_size` being the text decoder's).
        lora: per-layer low-rank adapters on q, k, v of a block shared by several layers
            (`LoRA`; `from_hf` then needs the layer's number).
        no_ov: why the OV table is not available ("" when it is).
        latent: the block is multi-head latent attention (`Latent`): from_hf builds a
            `LatentAttention`, its rotary part last in each head's q and k.
        selector: path from the core to a module whose output is each query's selected keys
            `[batch, query, k]`, the same for every head (DeepSeek-V3.2's DSA indexer): the model
            attends to those keys only. from_hf's module has no such module; `verify` hands it the
            selection the model's own module made, joined to the mask (`with_selected_keys`).
        notes: one line for the family table.
    """

    family: str
    model_types: tuple[str, ...]
    layers: str
    block: str
    core: str
    qkv: object
    out: str
    out_is_conv1d: bool = False
    rotary: Optional[Rotary] = None
    qk_norm: Optional[QKNorm] = None
    clip: Optional[str] = None
    clip_after_norm: bool = False
    v_norm: Optional[str] = None
    temperature: Optional[Temperature] = None
    sizes_per_layer: bool = False
    kv_shared: Optional[str] = None
    softcap: Optional[str] = None
    sinks: Optional[str] = None
    weights_before_sinks: bool = False
    value_size: Optional[str] = None
    value_scale: Optional[str] = None
    query_prescaled: bool = False
    causal: bool = True
    body: str = ""
    mixes_heads: Optional[str] = None
    output_gate: bool = False
    stack: str = "text"
    groups: tuple[SiteGroup, ...] = ()
    no_from_hf: str = ""
    no_from_hf_when: tuple[str, str] = ()
    no_analyze: str = ""
    audio_encoder: Optional[AudioEncoder] = None
    hybrid: bool = False
    heads: Optional[str] = None
    returns: tuple[str, ...] = ("output", "weights")
    bias_in_call: bool = False
    decoder_only: bool = False
    default_sites: str = ""
    counts: tuple[str, ...] = ()
    scale: str = "scaling"
    width: str = "hidden_size"
    lora: Optional[LoRA] = None
    no_ov: str = ""
    latent: Optional[Latent] = None
    selector: Optional[str] = None
    notes: str = ""
