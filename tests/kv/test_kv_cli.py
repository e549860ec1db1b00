"""`headscope kv-policy` and `headscope kv-eval`: files written, and bad input as one line, no traceback."""
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from headscope.cli import app
from headscope.kv import read_duo, read_headkv
from headscope.kv.formats import DUO_TSV
from tests.support.fake_analysis import fake_analysis, fake_analysis_with_retrieval

N_LAYERS, N_HEADS = 4, 6  # fake_analysis: n_kv_heads = n_heads // 3 = 2


@pytest.fixture(scope="module")
def analysis_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv-cli") / "analysis"
    fake_analysis_with_retrieval(np.random.default_rng(0).random((N_LAYERS, N_HEADS))).save(folder)
    return folder


def _one_line_error(result, match: str, code: int = 1):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]  # progress lines of loading may come first
    assert len(errors) == 1 and lines[-1] == errors[0] and match in errors[0], result.output


def test_kv_policy_writes_both_formats(analysis_dir, tmp_path):
    result = CliRunner().invoke(app, ["kv-policy", str(analysis_dir), "--keep", "0.25", "--out", str(tmp_path / "duo"),
                                      "--sink", "4", "--recent", "32"])
    assert result.exit_code == 0, result.output
    table = np.loadtxt(tmp_path / "duo" / DUO_TSV, delimiter="\t")
    assert table.shape == (N_LAYERS, 2)
    duo = read_duo(tmp_path / "duo")
    assert (duo.sink, duo.recent, duo.full.sum()) == (4, 32, 2)
    result = CliRunner().invoke(app, ["kv-policy", str(analysis_dir), "--keep", "0.25", "--out",
                                      str(tmp_path / "p.json"), "--format", "headkv", "--sink", "4", "--recent", "32"])
    assert result.exit_code == 0, result.output
    assert all(k.count("-") == 1 for k in json.loads((tmp_path / "p.json").read_text()))
    assert read_headkv(tmp_path / "p.json", keep=0.25, n_kv_heads=2, sink=4, recent=32) == duo


@pytest.mark.parametrize("args, match", [
    (["--keep", "0"], "in (0, 1]"),
    (["--keep", "1.5"], "in (0, 1]"),
    (["--format", "csv"], "--format must be one of"),
    (["--rank-by", "loudest"], "unknown ranking"),
])
def test_kv_policy_bad_options_are_one_line_errors(analysis_dir, tmp_path, args, match):
    result = CliRunner().invoke(app, ["kv-policy", str(analysis_dir), "--out", str(tmp_path / "o"), *args])
    _one_line_error(result, match, code=2)  # usage errors: a value out of range or unknown


def test_kv_policy_without_the_ranking_detector_is_a_one_line_error(tmp_path):
    fake_analysis(N_LAYERS, N_HEADS, with_syntax=False).save(tmp_path / "plain")
    result = CliRunner().invoke(app, ["kv-policy", str(tmp_path / "plain"), "--out", str(tmp_path / "o")])
    _one_line_error(result, "no 'retrieval' scores")


def test_kv_policy_refuses_to_overwrite_a_file(analysis_dir, tmp_path):
    (tmp_path / "mine.json").write_text("{}")
    result = CliRunner().invoke(app, ["kv-policy", str(analysis_dir), "--out", str(tmp_path / "mine.json"),
                                      "--format", "headkv"])
    _one_line_error(result, "exists")
    assert (tmp_path / "mine.json").read_text() == "{}"


def test_kv_eval_with_a_policy_of_another_model_is_a_one_line_error(analysis_dir, planted_path, tmp_path):
    CliRunner().invoke(app, ["kv-policy", str(analysis_dir), "--out", str(tmp_path / "duo")])
    result = CliRunner().invoke(app, ["kv-eval", planted_path, str(tmp_path / "duo"), "--out", str(tmp_path / "eval"),
                                      "--lengths", "40"])
    _one_line_error(result, "another model")
    assert not (tmp_path / "eval").exists()


def test_kv_eval_bad_input_is_a_one_line_error(planted_path, tmp_path):
    result = CliRunner().invoke(app, ["kv-eval", planted_path, str(tmp_path / "none"), "--out", str(tmp_path / "e")])
    _one_line_error(result, "no policy")
    result = CliRunner().invoke(app, ["kv-eval", planted_path, str(tmp_path / "none"), "--lengths", "4k",
                                      "--out", str(tmp_path / "e")])
    _one_line_error(result, "--lengths takes comma-separated numbers", code=2)


def test_kv_eval_writes_the_csv_and_the_page(tmp_path):
    import torch
    import transformers as tf

    import headscope
    from headscope.kv import write_duo
    from headscope.kv.policy import policy_from_values
    from tests.support.tiny import tiny_config

    tokenizer = headscope.load("smollm2-135m").tokenizer
    config = tiny_config("llama", positions=512)
    config.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    write_duo(policy_from_values(np.random.default_rng(1).random((2, 2)), 0.5, 6, 4, 16), tmp_path / "duo")
    result = CliRunner().invoke(app, ["kv-eval", str(tmp_path / "model"), str(tmp_path / "duo"), "--out",
                                      str(tmp_path / "eval"), "--lengths", "160", "--keeps", "0.25,0.5"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "eval").iterdir())
    assert names == [".headscope", "examples.csv", "index.html", "meta.json", "results.csv", "summary.csv"]
    import pandas as pd

    table = pd.read_csv(tmp_path / "eval" / "results.csv")
    assert len(table) == 2 + 2 * (2 + 5)  # full, streaming; per keep headscope, reverse, 5 random draws
