"""`headscope circuit` end to end on the planted tiny model: EAP-IG finds the planted previous-token ->
induction-head key edge, the folder is complete and atomic, bad input is one line with nothing
written, and an existing folder headscope did not write is never replaced."""
import json

import pytest
from typer.testing import CliRunner

from headscope.circuits.circuit_page import FAITHFULNESS_ID, GRAPH_ID
from headscope.circuits.circuit_run import read_circuit
from headscope.cli import app
from headscope.folders import read_card

ARGS = ["--task", "induction", "--n", "6", "--device", "cpu", "--batch-size", "6", "--steps", "3"]


@pytest.fixture(scope="module")
def found(planted_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("circuit") / "induction"
    result = CliRunner().invoke(app, ["circuit", planted_path, *ARGS, "--sizes", "10,100", "--random", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result


def test_the_planted_circuit_and_its_folder(found):
    out, result = found
    circuit = read_circuit(out)
    keys = circuit.edges[circuit.edges.dst.str.endswith(".k")]
    best = keys.assign(size=keys.score.abs()).nlargest(2, "size")
    # the planted previous-token head feeds the induction keys (tied with embed there: the built-in
    # task leaves the keys' copy uncorrupted, tests/circuits/test_circuit.py)
    assert ("a0.h0", "a1.h0.k") in set(zip(best.src, best.dst))
    assert circuit.meta["method"] == "eap-ig" and circuit.meta["steps"] == 3 and circuit.meta["n"] == 6
    assert circuit.meta["passes"] == {"forward": 5, "backward": 3}
    assert list(circuit.evaluation["size"]) == [10, 100] and len(circuit.random) == 2
    assert float(circuit.evaluation.faithfulness.iloc[-1]) == pytest.approx(1.0, abs=1e-6)
    assert circuit.task.n == 6 and circuit.task.name == "induction"
    assert read_card(out)["kind"] == "circuit"
    page = (out / "index.html").read_text()
    assert GRAPH_ID in page and f"id=\"{FAITHFULNESS_ID}\"" in page
    lines = result.stdout.splitlines()
    assert lines[0] == "task: induction, 6 prompt pairs, metric logit_diff"
    assert lines[1].startswith(f"scored {len(circuit.edges)} edges with eap-ig (3 steps, left rule): 5 forward and "
                               f"3 backward")
    top = circuit.top(1).iloc[0]
    assert lines[2].startswith(f"top edges: {top.src}->{top.dst} ")
    assert lines[3].startswith("stability: top 1% (") and "Jaccard" in lines[3]
    assert circuit.meta["stability"][0]["n_boot"] == 100
    assert lines[4].startswith("faithfulness: CPR ") and "random circuits" in lines[4]
    assert f"report: {out / 'index.html'}" in lines
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    bars = result.stderr  # scoring counts forward/backward passes, the evaluation circuits
    assert ("pass/s" in bars or "s/pass" in bars) and ("circuit/s" in bars or "s/circuit" in bars), bars


def test_without_evaluation(planted_path, tmp_path):
    out = tmp_path / "plain"
    result = CliRunner().invoke(app, ["circuit", planted_path, *ARGS, "--method", "eap", "--no-evaluate",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    circuit = read_circuit(out)
    assert circuit.evaluation is None and not (out / "evaluation.csv").exists()
    assert circuit.meta["passes"] == {"forward": 3, "backward": 1}
    assert "faithfulness" not in result.stdout and FAITHFULNESS_ID not in (out / "index.html").read_text()


@pytest.mark.parametrize("args,message", [
    (["--method", "acdc"], "--method must be eap or eap-ig"),
    (["--steps", "0"], "--steps must be an integer from 1 to 1000, got 0"),
    (["--steps", "1001"], "--steps must be an integer from 1 to 1000, got 1001"),
    (["--sizes", "0,10"], "circuit sizes are percentages of the edges in (0, 100]"),
    (["--sizes", "ten"], "--sizes takes comma-separated numbers"),
    (["--random", "-1"], "--random must be an integer from 0 to 1000, got -1"),
    (["--top", "0"], "--top must be an integer of at least 1"),
    (["--max-memory", "0"], "--max-memory must be a positive number of GiB, got 0.0"),
    (["--task", "iox"], "unknown task 'iox'"),
])
def test_bad_input_is_one_line_and_writes_nothing(planted_path, tmp_path, args, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["circuit", planted_path, "--out", str(out), "--device", "cpu", *args])
    assert result.exit_code == 2, result.output  # usage errors, as the command line promises
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_memory_budget_no_prompt_fits_is_one_line(planted_path, tmp_path):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["circuit", planted_path, *ARGS, "--out", str(out), "--max-memory", "1e-6"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "needs about" in errors[0] and "(max_memory)" in errors[0]
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize("force", [False, True])
def test_an_existing_folder_headscope_did_not_write_is_refused(planted_path, tmp_path, force):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(app, ["circuit", planted_path, *ARGS, "--no-evaluate", "--out", str(mine),
                                      *(["--force"] if force else [])])
    assert result.exit_code == 1
    assert ("did not write" if force else "already exists") in result.output
    assert "loading" not in result.output  # refused before the model loads
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"


def test_an_analysis_labels_the_heads(planted_path, tmp_path):
    from tests.support.fake_analysis import fake_analysis

    analysis = fake_analysis(2, 4, seed=3)
    analysis.meta["family"] = "gpt2"  # the planted model's: an analysis of another family is refused
    analysis.labels.loc[(analysis.labels.layer == 1) & (analysis.labels["head"] == 0), "label"] = "<b>induction</b>"
    analysis.save(tmp_path / "analysis")
    out = tmp_path / "labelled"
    result = CliRunner().invoke(app, ["circuit", planted_path, *ARGS, "--no-evaluate", "--analysis",
                                      str(tmp_path / "analysis"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "index.html").read_text()
    assert "&lt;b&gt;induction&lt;/b&gt;" in page and "<b>induction" not in page  # a1.h0 carries the task: shown


@pytest.mark.parametrize("family, kind, nodes", [
    ("t5", "encoder_decoder", ("c0", "c1")),  # the decoder's cross-attention sends and receives
    ("jamba", "hybrid", ("m0", "m2")),  # Mamba mixers of the layers without attention
])
def test_an_encoder_decoder_and_a_hybrid_end_to_end(family, kind, nodes, tmp_path):
    from tests.support.planted import char_tokenizer
    from tests.support.tiny import tiny_model

    folder = tmp_path / family
    tiny_model(family, kind=kind).save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["circuit", str(folder), *ARGS, "--sizes", "50,100", "--random", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    circuit = read_circuit(out)
    names = set(circuit.edges.src) | set(circuit.edges.dst)
    assert set(nodes) <= names and "logits" in names
    assert float(circuit.evaluation.faithfulness.iloc[-1]) == pytest.approx(1.0, abs=1e-4)
    if family == "t5":
        assert circuit.meta["sites"] == "decoder.self"
