"""Output folders never eat a user's files (`headscope.atomic`): `--force` replaces only a folder
headscope wrote, never the model or the analyses being read, never the working directory, and a
folder that appears while a run works is left alone. Each case checks the user's files are
byte-identical afterwards and that no temporary folder is left."""
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope.atomic import MARKER, atomic_dir
from headscope.cli import app
from headscope.errors import HeadscopeError

ARGS = ["--n-examples", "2", "--seq-len", "24", "--device", "cpu", "--detectors", "sink", "--control", "none",
        "--plotlyjs", "cdn"]


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _analyze(model, out, *extra):
    return CliRunner().invoke(app, ["analyze", str(model), "--out", str(out), *ARGS, *extra])


@pytest.fixture(scope="module")
def written(planted_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("written") / "analysis"
    result = _analyze(planted_path, out)
    assert result.exit_code == 0, result.output
    return out


def test_every_folder_headscope_writes_carries_the_marker_and_force_replaces_it(written, planted_path):
    assert (written / MARKER).is_file()
    result = _analyze(planted_path, written, "--force")
    assert result.exit_code == 0, result.output
    assert (written / MARKER).is_file() and (written / "scores.csv").is_file()


def test_force_refuses_a_folder_of_the_users(planted_path, tmp_path):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.txt").write_text("three years of work\n")
    before = _snapshot(mine)
    result = _analyze(planted_path, mine, "--force")
    assert result.exit_code == 1 and "headscope did not write" in result.output
    assert _snapshot(mine) == before and sorted(p.name for p in tmp_path.iterdir()) == ["thesis"]


def test_force_replaces_an_empty_folder(planted_path, tmp_path):
    (tmp_path / "empty").mkdir()
    result = _analyze(planted_path, tmp_path / "empty", "--force")
    assert result.exit_code == 0, result.output


def test_the_model_folder_is_never_the_output(planted_path, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(planted_path, model)
    before = _snapshot(model)
    for out in (model, tmp_path):  # the model folder itself, and a folder holding it
        result = _analyze(model, out, "--force")
        assert result.exit_code == 1 and "which is being read" in result.output, result.output
    assert _snapshot(model) == before and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_compare_never_replaces_an_analysis_it_reads(written, tmp_path):
    before = _snapshot(written)
    result = CliRunner().invoke(app, ["compare", str(written), str(written), "--out", str(written), "--force"])
    assert result.exit_code == 1 and "which is being read" in result.output
    assert _snapshot(written) == before


def test_the_working_directory_and_its_parents_are_refused(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for target in (".", "..", str(work), str(tmp_path)):
        with pytest.raises(HeadscopeError, match="working directory"):
            atomic_dir(target, force=True)
    assert list(work.iterdir()) == []


def test_a_folder_that_appears_while_a_run_works_is_left_alone(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(HeadscopeError, match="appeared while this ran"):
        with atomic_dir(target) as tmp:
            (tmp / "scores.csv").write_text("new\n")
            target.mkdir()  # another run, or the user, got there first
            (target / "theirs.txt").write_text("theirs\n")
    assert _snapshot(target) == {"theirs.txt": b"theirs\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left
