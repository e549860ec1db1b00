"""`headscope timeline SOURCE... --out DIR`: a Trainer output folder, model folders, hub revisions;
the folder written atomically, the page drawn in Chromium, bad input in one line."""
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from headscope.cli import app
from headscope.training.report import FIGURE_IDS
from headscope.training.toy import repeated_segments, tiny_llama, train_toy


@pytest.fixture(scope="module")
def trainer_folder(tmp_path_factory):
    """A Trainer output folder with checkpoint-4, -8 and -12 of a tiny 2-layer Llama, and its step-0 model."""
    root = tmp_path_factory.mktemp("series")
    torch.manual_seed(0)
    model = tiny_llama(2)
    model.save_pretrained(root / "step-0")
    ids, _ = repeated_segments(12 * 64, torch.Generator().manual_seed(0))
    train_toy(model, ids, 12, root / "run", save_steps=4)
    return root


def _invoke(*args):
    return CliRunner().invoke(app, ["timeline", *map(str, args), "--device", "cpu"])


def test_a_trainer_folder_gives_a_timeline_of_its_checkpoints(trainer_folder, tmp_path):
    out = tmp_path / "tl"
    result = _invoke(trainer_folder / "run", "--out", out)
    assert result.exit_code == 0, result.output
    scores = pd.read_csv(out / "timeline.csv")
    assert list(scores.columns) == ["step", "layer", "head", "detector", "score", "ci_low", "ci_high", "control",
                                    "site"]
    assert sorted(scores.step.unique()) == [4, 8, 12]
    assert set(scores.site) == {f"model.layers.{layer}.self_attn" for layer in set(scores.layer)}  # the Llama's modules
    steps = pd.read_csv(out / "steps.csv")
    assert steps.train_loss.notna().all()  # read from the last checkpoint's log_history
    history = json.loads((trainer_folder / "run" / "checkpoint-12" / "trainer_state.json").read_text())["log_history"]
    assert steps.set_index("step").train_loss[8] == pytest.approx([r["loss"] for r in history if r["step"] == 8][0])
    assert json.loads((out / "meta.json").read_text())["control"].startswith("random-init")  # no step 0 here
    assert (out / ".headscope").is_file() and (out / "index.html").is_file()
    assert not (out / "control").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tl"]  # nothing else left behind


def test_model_folders_with_a_step_0_use_it_as_the_control(trainer_folder, tmp_path):
    run = trainer_folder / "run"
    out = tmp_path / "tl"
    result = _invoke(trainer_folder / "step-0", run / "checkpoint-8", run / "checkpoint-4", "--out", out)
    assert result.exit_code == 0, result.output
    scores = pd.read_csv(out / "timeline.csv")
    assert sorted(scores.step.unique()) == [0, 4, 8]
    assert json.loads((out / "meta.json").read_text())["control"] == "the step-0 model"
    at0 = scores[scores.step == 0]
    assert (at0.score == at0.control).all()  # the control is the step-0 model itself


def _bad(tmp_path, *args):
    out = tmp_path / "never"
    result = _invoke(*args, "--out", out)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert not out.exists()
    return lines[0]


def test_bad_input_gets_one_line(trainer_folder, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no checkpoint-* folders" in _bad(tmp_path, empty)

    mixed = tmp_path / "mixed"
    shutil.copytree(trainer_folder / "run" / "checkpoint-4", mixed / "checkpoint-4")
    torch.manual_seed(0)
    tiny_llama(1).save_pretrained(mixed / "checkpoint-8")
    (mixed / "checkpoint-8" / "trainer_state.json").write_text(json.dumps({"global_step": 8, "log_history": []}))
    assert "checkpoint-8 is not the same model as checkpoint-4: num_hidden_layers 1 vs 2" in _bad(tmp_path, mixed)

    missing = tmp_path / "missing"
    shutil.copytree(trainer_folder / "run" / "checkpoint-4", missing / "checkpoint-4")
    shutil.copytree(trainer_folder / "run" / "checkpoint-8", missing / "checkpoint-8")
    (missing / "checkpoint-8" / "trainer_state.json").unlink()
    assert "checkpoint-8 has no trainer_state.json: its step is unknown" in _bad(tmp_path, missing)

    nameless = tmp_path / "final"
    shutil.copytree(trainer_folder / "step-0", nameless)
    assert "cannot tell the step of" in _bad(tmp_path, nameless)
    assert "both step 4" in _bad(tmp_path, trainer_folder / "run" / "checkpoint-4", missing / "checkpoint-4")


def test_a_hub_revision_is_read_offline_or_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert "is not in the Hugging Face cache" in _bad(tmp_path, "someone/not-cached@step1000")
    assert "cannot tell the step of someone/model@main" in _bad(tmp_path, "someone/model@main")


def test_the_timeline_page_draws_offline_in_chromium(browser, trainer_folder, tmp_path):
    out = tmp_path / "tl"
    assert _invoke(trainer_folder / "run", "--out", out).exit_code == 0
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors, requests = [], []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("request", lambda req: requests.append(req.url) if not req.url.startswith(("file:", "data:")) else None)
    page.goto((out / "index.html").as_uri())
    page.wait_for_function("document.documentElement.dataset.headscope === 'plotted'", timeout=20_000)
    labels = FIGURE_IDS["labels"]
    drawn = page.evaluate("Array.from(document.querySelectorAll('div.figure')).filter(d => d._fullData).length")
    steps = page.evaluate(f"document.getElementById('{labels}')._fullLayout.sliders[0].steps.map(s => s.label)")
    cells = page.evaluate(f"document.getElementById('{labels}')._fullData[0].z.flat().length")
    rail = page.locator(f"#{labels} .slider-rail-rect").bounding_box()
    page.mouse.click(rail["x"] + 2, rail["y"] + rail["height"] / 2)  # drag the slider to its first step
    page.wait_for_function(f"document.getElementById('{labels}')._fullLayout.sliders[0].active === 0",
                           timeout=5_000)
    page.close()
    assert errors == [] and requests == []
    assert drawn == 2 + 5  # ICL, label map, one per default detector
    assert steps == ["4", "8", "12"] and cells == 2 * 4


def test_hub_revisions_are_read_from_the_cache(trainer_folder, tmp_path):
    """A cache laid out as huggingface_hub writes it (refs/<revision> -> snapshots/<commit>),
    read offline in a fresh process (the cache location is read when huggingface_hub loads)."""
    import subprocess
    import sys

    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny"
    for step in (4, 8):
        commit = f"{step:040x}"
        shutil.copytree(trainer_folder / "run" / f"checkpoint-{step}", repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / f"step{step}").write_text(commit)
    out = tmp_path / "tl"
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "headscope", "timeline", "someone/tiny@step8", "someone/tiny@step4",
                           "--out", str(out), "--device", "cpu"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(pd.read_csv(out / "timeline.csv").step.unique()) == [4, 8]
