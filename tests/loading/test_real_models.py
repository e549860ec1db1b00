"""The two real pretrained reference models (installed from the package index): slow, run by CI."""
import pytest
import torch

import headscope

pytestmark = pytest.mark.slow

TEXT = ["The cat sat on the mat because it was warm.", "Numbers like 42 and 7 appear here."]


def _batch(loaded):
    tok = loaded.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return dict(tok(TEXT, return_tensors="pt", padding=True))


@pytest.mark.parametrize("name,layers,heads,family", [("smollm2-135m", 30, 9, "llama"), ("minilm-l6", 6, 12, "bert")])
@torch.no_grad()
def test_real_model_capture_and_verify_parity(name, layers, heads, family, request):
    loaded = request.getfixturevalue(name.split("-")[0])
    assert (loaded.n_layers, loaded.n_heads, loaded.family) == (layers, heads, family)
    model, x = loaded.model, _batch(loaded)
    out = lambda o: o.logits if hasattr(o, "logits") else o.last_hidden_state
    default = out(model(**x))
    with headscope.capture(model, layers=[0, layers - 1]) as cap:
        captured = out(model(**x))
    valid = x["attention_mask"].bool()
    assert (default - captured).abs()[valid].max() <= 1e-4
    model.set_attn_implementation("eager")
    eager = model(**x, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    for layer in (0, layers - 1):
        diff = (cap.patterns[layer] - eager[layer]).abs().permute(0, 2, 1, 3)[valid]
        assert diff.max() <= 1e-5
    table = headscope.verify(model, x)
    assert len(table) == layers
    assert table.max_abs_diff_output.max() <= 1e-4
    assert table.max_abs_diff_pattern.max() <= 1e-5


def test_smollm2_is_gqa(smollm2):
    assert smollm2.model.config.num_key_value_heads == 3 and smollm2.causal
