"""Composition scores: the planted previous-token -> induction pair found by K-composition, every score
equal to a reference computed here from the model's parameters (four families, GQA and q/k norms
among them, the rotary-aware variant too), refusals, and the table attached to an analysis and drawn."""
import math

import numpy as np
import pytest
import torch

import headscope
from headscope.analysis import Analysis
from headscope.errors import HeadscopeError, UsageError
from headscope.loading.loader import Loaded
from headscope.report import render_html
from headscope.report.composition_data import composition_data

from tests.support.fake_analysis import fake_analysis
from tests.support.planted import VOCAB
from tests.support.tiny import tiny_config, tiny_model

SAMPLES = 40  # baseline draws in these tests: enough for a spread, cheap at the planted model's width


def test_the_planted_previous_token_head_is_the_top_k_composition_pair(planted):
    table = headscope.composition(planted, "k", baseline_samples=SAMPLES)
    assert len(table) == 4 * 4 and set(table.kind) == {"k"}
    best = table.sort_values("z", ascending=False).iloc[0]  # NaN (heads that write nothing) sort last
    assert (best.src_layer, best.src_head, best.dst_layer, best.dst_head) == (0, 0, 1, 0)
    # 0.0 writes token t's previous-token direction, 1.0's keys read exactly those 99 directions, each
    # with the same weight: W_OV = S, W_QK^T = S^T with S the one-hot map token t -> previous-token
    # dim t, so ||W_OV W_QK^T|| / (||W_OV|| ||W_QK||) = sqrt(99) / 99 before the layer norms; GPT-2's
    # norms remove the mean, so the circuits are P S P and P S^T P (P = I - 11^T / 600).
    S = torch.zeros(600, 600, dtype=torch.float64)
    S[torch.arange(VOCAB), 147 + torch.arange(VOCAB)] = 1.0
    P = torch.eye(600, dtype=torch.float64) - 1 / 600
    A, B = P @ S @ P, P @ S.T @ P
    assert best.score == pytest.approx(float((A @ B).norm() / (A.norm() * B.norm())), rel=1e-5)
    assert best.score == pytest.approx(1 / math.sqrt(VOCAB), rel=1e-3)
    assert best.baseline == pytest.approx(1 / math.sqrt(600), rel=0.1)  # random: about 1 / sqrt(d_model)
    assert best.z > 50
    others = table[(table.src_head == 0) & (table.dst_head != 0)]
    # the other heads' keys read nothing 0.0 writes but the mean its write moves (1/600 per dim)
    assert (others.score.fillna(0) < 0.002).all()
    queries = headscope.composition(planted, "q", baseline_samples=SAMPLES)
    pair = queries[(queries.src_head == 0) & (queries.dst_head == 0)].iloc[0]
    assert pair.score < 0.002  # 1.0's queries read the token block, not 0.0's output (but the mean it moves)


# --- the reference: plain torch on each family's own parameters ------------------------------------

def _llama_like(model, layer):
    """(g_in or None, W_q, W_k, W_v, W_o, q gain or None, k gain or None) of a Llama-style layer, Linear layouts."""
    block = model.model.layers[layer]
    attn = block.self_attn
    norm = getattr(block, "input_layernorm", None)  # OLMo 2 norms after attention, not before
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    return (None if norm is None else norm.weight, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
            attn.o_proj.weight, None if q_norm is None else q_norm.weight, None if k_norm is None else k_norm.weight)


def _gpt2(model, layer):
    block = model.transformer.h[layer]
    d = model.config.n_embd
    w = block.attn.c_attn.weight.T  # Conv1D (d, 3d) as x @ W: Linear layout (3d, d)
    return block.ln_1.weight, w[:d], w[d:2 * d], w[2 * d:], block.attn.c_proj.weight.T, None, None


def _gemma(model, layer):
    """Gemma's norms multiply by 1 + weight; its post-attention norm sits between W_O and the stream."""
    block = model.model.layers[layer]
    attn = block.self_attn
    return (1 + block.input_layernorm.weight, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
            attn.o_proj.weight, 1 + attn.q_norm.weight, 1 + attn.k_norm.weight)


# What each family's layers do besides: (LayerNorm's mean removal, the post-attention norm's gain or None).
def _no_extras(model, layer):
    return False, None


def _layer_norm(model, layer):
    return True, None


def _olmo_post(model, layer):
    return False, model.model.layers[layer].post_attention_layernorm.weight.detach().double()


def _gemma_post(model, layer):
    return False, 1 + model.model.layers[layer].post_attention_layernorm.weight.detach().double()


def _reference(model, parts, kind, rotation=None, extras=_no_extras):
    """{(src layer, src head, dst layer, dst head): score} from full d_model x d_model circuits.
    A LayerNorm layer reads x P diag(g) W (P = I - 11^T / d, its mean removal) and, every reader
    removing the mean, its output W_O is read as W_O P; a post-attention norm's gain is
    W_O diag(g_post) (the rule TransformerLens's fold_ln and center_writing_weights follow)."""
    cfg = model.config
    H = cfg.num_attention_heads
    Hkv = getattr(cfg, "num_key_value_heads", None) or H
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    circuits = []
    for layer in range(cfg.num_hidden_layers):
        g, wq, wk, wv, wo, gq, gk = (None if t is None else t.detach().double() for t in parts(model, layer))
        g = torch.ones(wq.shape[1], dtype=torch.float64) if g is None else g
        centre, post = extras(model, layer)
        d = wq.shape[1]
        P = torch.eye(d, dtype=torch.float64) - (torch.ones(d, d, dtype=torch.float64) / d if centre else 0)
        heads = []
        for h in range(H):
            kv = h // (H // Hkv)
            q = P @ (g[:, None] * wq[h * D:(h + 1) * D].T)  # (d, D)
            k = P @ (g[:, None] * wk[kv * D:(kv + 1) * D].T)
            if gq is not None:  # a gain per head dim, or over the whole projection
                q = q * (gq if gq.numel() == D else gq[h * D:(h + 1) * D])
                k = k * (gk if gk.numel() == D else gk[kv * D:(kv + 1) * D])
            qk = q @ (torch.eye(D, dtype=torch.float64) if rotation is None else rotation) @ k.T
            ov = P @ (g[:, None] * wv[kv * D:(kv + 1) * D].T) @ wo[:, h * D:(h + 1) * D].T @ P  # (d, d)
            if post is not None:
                ov = ov * post[None, :]
            heads.append((qk, ov))
        circuits.append(heads)
    out = {}
    for la, src in enumerate(circuits):
        for lb in range(la + 1, len(circuits)):
            for a, (_, ov_a) in enumerate(src):
                for b, (qk_b, ov_b) in enumerate(circuits[lb]):
                    w_b = {"q": qk_b, "k": qk_b.T, "v": ov_b}[kind]
                    out[(la, a, lb, b)] = float((ov_a @ w_b).norm() / (ov_a.norm() * w_b.norm()))
    return out


def _fresh(family, kind):
    """A fresh model of the family with every norm's weight random, so that a gain left unfolded shows."""
    import transformers as tf

    torch.manual_seed(3)
    model = (tf.AutoModelForCausalLM.from_config(tiny_config(family, "interface")) if kind == "interface"
             else tiny_model(family, seed=3, kind=kind))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 and "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                if family.startswith("gemma"):  # multiplies by 1 + weight: gains in [-1, 3]
                    param.copy_(-2 + 4 * torch.rand(param.shape))
                else:
                    param.copy_(0.5 + torch.rand(param.shape))
    return model.eval()


FAMILIES = [  # (family, kind, parts, extras): GQA 6/2 with rotary; GPT-2's fused Conv1D and LayerNorm
    # (centred); per-head q/k norms with GQA 4/2; q/k norms over the whole projection, no norm in front
    # of attention but one after it (OLMo 2); Gemma 3's (1 + weight) norms and post-attention norm, gains drawn in [-1, 3]
    ("llama", "odd", _llama_like, _no_extras), ("gpt2", "odd", _gpt2, _layer_norm),
    ("qwen3", "interface", _llama_like, _no_extras), ("olmo2", "interface", _llama_like, _olmo_post),
    ("gemma3_text", "interface", _gemma, _gemma_post),
]


@pytest.mark.parametrize("family,kind,parts,extras", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_scores_equal_a_reference_from_the_weights(family, kind, parts, extras):
    model = _fresh(family, kind)
    loaded = Loaded.from_model(model, None, family)
    for which in ("q", "k", "v"):
        table = headscope.composition(loaded, which, baseline_samples=8)
        reference = _reference(model, parts, which, extras=extras)
        assert len(table) == len(reference)
        mine = {(r.src_layer, r.src_head, r.dst_layer, r.dst_head): r.score for r in table.itertuples()}
        assert mine == pytest.approx(reference, abs=1e-5), which
        assert np.allclose(table.z, (table.score - table.baseline) / table.baseline_std)


def _rotate_half_mean(D: int, base: float, offsets) -> torch.Tensor:
    """mean over d of R_d, the row-convention rotation q -> q R_d of a "rotate half" rotary at position d."""
    inv = base ** -(torch.arange(0, D, 2, dtype=torch.float64) / D)
    C = torch.zeros(D, D, dtype=torch.float64)
    half = D // 2
    for d in offsets:
        cos, sin = torch.cos(d * inv), torch.sin(d * inv)
        i = torch.arange(half)
        C[i, i] += cos
        C[i + half, i + half] += cos
        C[i, i + half] += sin  # q'_(i+half) = q_(i+half) cos + q_i sin
        C[i + half, i] -= sin  # q'_i = q_i cos - q_(i+half) sin
    return C / len(offsets)


def test_the_rotary_variant_equals_a_reference_and_is_a_no_op_without_rotary():
    model = _fresh("llama", "odd")
    loaded = Loaded.from_model(model, None, "llama")
    D = model.config.head_dim
    rotation = _rotate_half_mean(D, model.config.rope_parameters["rope_theta"], range(1, 9))
    for which in ("q", "k"):
        table = headscope.composition(loaded, which, rotary_offsets=8, baseline_samples=8)
        assert table.attrs["rotary_offsets"] == list(range(1, 9)) and table.attrs["rotary_layers"] == [0, 1]
        mine = {(r.src_layer, r.src_head, r.dst_layer, r.dst_head): r.score for r in table.itertuples()}
        assert mine == pytest.approx(_reference(model, _llama_like, which, rotation), abs=1e-5), which
    plain = headscope.composition(loaded, "k", baseline_samples=8)
    assert not np.allclose(plain.score, table.score)  # averaging over offsets changed the circuit

    gpt2 = Loaded.from_model(_fresh("gpt2", "odd"), None, "gpt2")
    turned = headscope.composition(gpt2, "k", rotary_offsets=[0, 3, 5], baseline_samples=8)
    assert turned.attrs["rotary_layers"] == []
    assert turned.score.tolist() == headscope.composition(gpt2, "k", baseline_samples=8).score.tolist()


def test_refusals_are_one_line():
    gated = Loaded.from_model(tiny_model("qwen3_next", kind="hybrid"), None, "qwen3_next")
    with pytest.raises(HeadscopeError, match="sigmoid output gate") as err:
        headscope.composition(gated, "k")
    assert "\n" not in str(err.value)
    loaded = Loaded.from_model(tiny_model("llama"), None, "llama")
    for kwargs, error in (({"kind": "o"}, UsageError), ({"rotary_offsets": -1}, UsageError),
                          ({"rotary_offsets": [1, -2]}, UsageError), ({"baseline_samples": 1}, UsageError)):
        with pytest.raises(error):
            headscope.composition(loaded, **kwargs)
    with pytest.raises(HeadscopeError, match="takes a loaded model"):
        headscope.composition("smollm2-135m")


def test_add_composition_round_trip_and_the_report_section(planted, tmp_path):
    analysis = fake_analysis(n_layers=2, n_heads=4, n_examples=1)
    analysis.labels.loc[(analysis.labels.layer == 0) & (analysis.labels["head"] == 0), "label"] = "<b>&"
    attached = headscope.add_composition(analysis, planted, kinds=("k", "v"), baseline_samples=10)
    assert "composition" not in analysis.tables  # a copy
    table = attached.tables["composition"]
    assert list(dict.fromkeys(table.kind)) == ["k", "v"] and len(table) == 2 * 16
    assert attached.meta["composition"]["kinds"] == ["k", "v"]

    data = composition_data(attached)
    top = data.top[0]
    assert (top.kind, top.src_layer, top.src_head, top.dst_layer, top.dst_head) == ("k", 0, 0, 1, 0)
    assert top.src_label == "<b>&"
    k_map = data.maps[0]
    assert k_map.z.shape == (8, 8) and np.isnan(k_map.z[4:, :]).all()  # layer 1 reads, never writes

    page = render_html(attached, plotlyjs="cdn")
    section = page[page.index('<section id="composition">'):]
    section = section[:section.index("</section>")]
    assert "hs-composition-k" in section and "hs-composition-v" in section and "Top pairs" in section
    assert "<b>&" not in section and "&lt;b&gt;&amp;" in section
    assert 'id="composition"' not in render_html(analysis, plotlyjs="cdn")  # no table, no section

    folder = tmp_path / "analysis"
    analysis.save(folder)
    (folder / "notes.txt").write_text("kept")
    again = headscope.add_composition(folder, planted, kinds="k", baseline_samples=10)
    back = Analysis.load(folder)  # the manifest checks out
    assert back.tables["composition"].score.tolist() == pytest.approx(again.tables["composition"].score.tolist(),
                                                                      nan_ok=True)
    assert back.meta["composition"]["kinds"] == ["k"]
    assert (folder / "notes.txt").read_text() == "kept"
    assert 'id="composition"' in (folder / "index.html").read_text()
    with pytest.raises(HeadscopeError, match="analysis"):
        headscope.add_composition(fake_analysis(n_layers=3, n_heads=4), planted)
