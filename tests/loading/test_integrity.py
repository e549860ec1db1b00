"""Damaged models are refused with one line, never analysed as if whole: a config that does not
match its weights, NaN in the weights (set, or bytes overwritten in the file), activations that
overflow. On copies of the planted model folder (GPT-2, 2 layers)."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import headscope
from headscope.cli import app
from headscope.errors import HeadscopeError
from headscope.probes.kinds import RepeatedProbe

SMALL = dict(detectors=["induction", "duplicate_token"], probes=[RepeatedProbe(4, 8, 3)], explorer_examples=0,
             control="none")


@pytest.fixture
def folder(planted_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(planted_dir, copy)
    return copy


def _set_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _edit_weights(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_config_declaring_more_layers_than_the_weights_hold_is_refused(folder):
    _set_config(folder, n_layer=3)
    with pytest.raises(HeadscopeError, match=r"do not match its config: \d+ tensors the config declares are missing "
                                             r"\(transformer\.h\.2\."):
        headscope.load(str(folder), device="cpu")


def test_a_config_declaring_fewer_layers_than_the_weights_hold_is_refused(folder):
    _set_config(folder, n_layer=1)
    with pytest.raises(HeadscopeError, match=r"tensors are not in the model the config describes \(transformer\.h\.1\."):
        headscope.load(str(folder), device="cpu")


def test_a_missing_task_head_is_accepted(folder):
    """A checkpoint without a pooler or LM head still loads: the analysis never reads them."""
    from headscope.loading.integrity import check_loading_info

    check_loading_info({"missing_keys": ["pooler.dense.weight", "lm_head.weight"], "unexpected_keys": []}, "m")
    check_loading_info({"missing_keys": [], "unexpected_keys": ["embeddings.position_ids"]}, "m")
    with pytest.raises(HeadscopeError):
        check_loading_info({"missing_keys": ["encoder.layer.0.attention.self.query.weight"]}, "m")


def test_nan_in_the_weights_stops_the_analysis_naming_the_tensor(folder):
    _edit_weights(folder, lambda t: t["transformer.h.1.attn.c_attn.weight"].view(-1)[:5].fill_(float("nan")))
    loaded = headscope.load(str(folder), device="cpu")
    with pytest.raises(HeadscopeError, match=r"h\.1\.attn\.c_attn\.weight holds 5 NaN or infinite values"):
        headscope.analyze(loaded, **SMALL)


def test_bytes_overwritten_in_the_weights_file_are_caught(folder):
    """0xFF bytes written into the middle of model.safetensors read as NaN: refused, not scored."""
    path = folder / "model.safetensors"
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xff" * 80_000)
    loaded = headscope.load(str(folder), device="cpu")
    with pytest.raises(HeadscopeError, match="are damaged: .* holds 20000 NaN or infinite values"):
        headscope.analyze(loaded, **SMALL)


def test_activations_that_overflow_name_the_layer(folder):
    """Finite weights whose product overflows: the first layer whose output is not finite is named."""
    def overflow(tensors):
        tensors["transformer.h.1.attn.c_proj.weight"].fill_(3e38)  # finite, but a sum of several overflows

    _edit_weights(folder, overflow)
    loaded = headscope.load(str(folder), device="cpu")
    with pytest.raises(HeadscopeError, match=r"non-finite activations \(NaN or inf\) in the output of layer 1 on "
                                             r"probe repeated, batch 1 of 1"):
        headscope.analyze(loaded, **SMALL)


def test_the_command_line_says_it_in_one_line_and_writes_nothing(folder, tmp_path):
    _edit_weights(folder, lambda t: t["transformer.h.0.attn.c_proj.weight"].view(-1)[:1].fill_(float("inf")))
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["analyze", str(folder), "--out", str(out), "--n-examples", "4",
                                      "--seq-len", "40", "--device", "cpu"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "h.0.attn.c_proj.weight holds 1 NaN or infinite values" in lines[0]
    assert "Traceback" not in result.output and not out.exists()


def test_an_analysis_takes_a_loaded_model(planted):
    with pytest.raises(HeadscopeError, match=r"analyze takes a loaded model .*headscope.load\('minilm-l6'\)"):
        headscope.analyze("minilm-l6")
    assert torch.isfinite(next(planted.model.parameters())).all()


def test_check_weights_counts_exactly_when_a_sum_overflows():
    from headscope.loading.integrity import check_weights

    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.fill_(3e38)  # finite, but their sum is inf
    check_weights(model, "big")  # every value is finite: no error
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
        model.bias[1] = float("nan")
    with pytest.raises(HeadscopeError, match="weight holds 1 NaN or infinite values of 16"):
        check_weights(model, "big")
