"""`headscope attribute` end to end on the planted tiny model: the planted induction head carries the
induction task, the folder is complete and atomic, bad input is one line with nothing written."""
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from headscope.cli import app
from headscope.circuits.attribution_run import FILES, read_attribution
from headscope.circuits.tasks import Task

ARGS = ["--n", "6", "--device", "cpu", "--batch-size", "4"]


@pytest.fixture(scope="module")
def attributed(planted_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("attribute") / "induction"
    result = CliRunner().invoke(app, ["attribute", planted_path, "--task", "induction", "--exact", "--out", str(out),
                                      *ARGS])
    assert result.exit_code == 0, result.output
    return out, result


def test_the_planted_induction_head_carries_the_task(attributed):
    out, result = attributed
    found = read_attribution(out)
    table = found["attribution"]
    assert set(table.method) == {"atp", "atp*", "exact"}
    for method, column in (("exact", "effect"), ("atp", "effect"), ("atp*", "magnitude")):
        rows = table[table.method == method]
        best = rows.loc[rows[column].abs().idxmax()]
        assert (best.layer, best["head"]) == (1, 0), method  # the planted induction head
    exact = table[table.method == "exact"].set_index(["layer", "head"]).effect
    assert exact[(1, 0)] == pytest.approx(1.0, abs=0.05)  # it alone recovers the whole gap
    dla = found["dla"]
    heads = dla[dla.kind == "head"].set_index(["layer", "head"]).effect
    assert heads.abs().idxmax() == (1, 0)  # and it writes the answer directly
    assert "top heads (exact, hook_z): 1.0" in result.stdout
    assert f"report: {out / 'index.html'}" in result.stdout


def test_the_folder(attributed):
    out, _ = attributed
    names = {p.name for p in out.iterdir()}
    assert set(FILES.values()) | {"index.html", ".headscope", "manifest.json"} <= names
    meta = json.loads((out / "meta.json").read_text())
    assert meta["task"] == "induction" and meta["n"] == 6 and meta["methods"] == ["atp", "atp*", "exact"]
    assert meta["attrs"]["atp"]["passes"] == {"forward": 2, "backward": 1.0}
    task = Task.load(out / "task.json")
    assert task.n == 6 and task.name == "induction"
    page = (out / "index.html").read_text()
    assert "Head explorer" in page and "hs-explorer-data" in page
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_jsonl_task_and_an_analysis_labels(planted_path, tmp_path):
    lines = [{"clean": "abcab", "corrupted": "xyzab", "answer": "c", "wrong": "z"},
             {"clean": "pqrpq", "corrupted": "stupq", "answer": "r", "wrong": "u"}]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "mine"
    result = CliRunner().invoke(app, ["attribute", planted_path, "--task", str(path), "--out", str(out),
                                      "--device", "cpu", "--methods", "atp", "--n", "2"])
    assert result.exit_code == 0, result.output
    found = read_attribution(out)
    assert found["meta"]["task"] == "mine" and set(found["attribution"].method) == {"atp"}


@pytest.mark.parametrize("args,message", [
    (["--task", "iox"], "unknown task 'iox'"),
    (["--methods", "eap"], "--methods takes atp and atp*"),
    (["--point", "scores"], "--point must be one of"),
    (["--direction", "sideways"], "--direction must be denoising or noising"),
])
def test_bad_input_is_one_line_and_writes_nothing(planted_path, tmp_path, args, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["attribute", planted_path, "--out", str(out), "--device", "cpu", *args])
    assert result.exit_code == 2  # usage errors, as the command line promises
    assert message in result.output
    assert "Traceback" not in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_task_of_another_tokenizer_is_refused(planted_path, tmp_path):
    lines = [{"clean": "abcab", "corrupted": "xyzab", "answer": "c", "wrong": "z"}]
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(lines[0]) + "\n")
    stranger = Task(clean=[[5, 6, 7]], corrupted=[[5, 8, 7]], answer=[9], wrong=[10], tokenizer="58-000000000000")
    saved = stranger.save(tmp_path / "other.json")
    from headscope.circuits.attribution_run import run_attribution
    import headscope

    loaded = headscope.load(planted_path, device="cpu")
    with pytest.raises(headscope.HeadscopeError, match="another tokenizer"):
        run_attribution(loaded, Task.load(saved))
