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


GEOMETRY = ["--device", "cpu", "--seq-len", "48", "--no-importance", "--examples", "2"]


def test_geometry_out_follows_the_same_rule(planted_path, tmp_path):
    """geometry --out: written atomically with the marker; an existing folder needs --force, and
    --force never replaces a folder of the user's or an analysis being read."""
    out = tmp_path / "geo"
    first = CliRunner().invoke(app, ["geometry", planted_path, "--out", str(out), *GEOMETRY])
    assert first.exit_code == 0, first.output
    assert (out / MARKER).is_file() and (out / "heads.csv").is_file()
    again = CliRunner().invoke(app, ["geometry", planted_path, "--out", str(out), *GEOMETRY])
    assert again.exit_code == 1 and "already exists" in again.output
    forced = CliRunner().invoke(app, ["geometry", planted_path, "--out", str(out), *GEOMETRY, "--force"])
    assert forced.exit_code == 0, forced.output

    users = tmp_path / "mine"
    users.mkdir()
    (users / "heads.csv").write_text("my own table\n")
    (users / "settings.json").write_text("{}")
    refused = CliRunner().invoke(app, ["geometry", planted_path, "--out", str(users), *GEOMETRY, "--force"])
    assert refused.exit_code == 1 and "did not write" in refused.output
    assert (users / "heads.csv").read_text() == "my own table\n" and (users / "settings.json").read_text() == "{}"

    into_model = CliRunner().invoke(app, ["geometry", planted_path, "--out", planted_path, *GEOMETRY, "--force"])
    assert into_model.exit_code == 1 and "being read" in into_model.output
    assert not list(tmp_path.glob(".*tmp-*"))  # no temporary folder left behind


@pytest.mark.parametrize("option", [["--examples", "0"], ["--steps", "0"], ["--seq-len", "1"]])
def test_geometry_refuses_empty_settings_before_loading(planted_path, tmp_path, option):
    result = CliRunner().invoke(app, ["geometry", planted_path, "--out", str(tmp_path / "g"), "--device", "cpu", *option])
    assert result.exit_code == 2 and "must be an integer of at least" in result.output and "loading" not in result.output
    assert not (tmp_path / "g").exists()


def test_a_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch):
    """Checked with os.access (the tests run as root, which a chmod would not stop)."""
    import os

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path else real_access(path, mode))
    with pytest.raises(HeadscopeError, match=rf"cannot write to {tmp_path} \(permission denied\)"):
        atomic_dir(tmp_path / "new" / "deeper")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spec,expected", [("m/sub/..", "m"), ("m/", "m"), ("smollm2-135m", "smollm2-135m"),
                                           ("org/name", "name"), ("..hidden", "hidden")])
def test_the_default_output_folder_is_named_for_the_real_model(tmp_path, monkeypatch, spec, expected):
    from headscope.cli.shared import default_out

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m" / "sub").mkdir(parents=True)
    assert default_out(spec) == Path("reports") / expected


def test_geometry_into_a_folder_that_cannot_be_written_fails_before_loading(planted_path, tmp_path, monkeypatch):
    import os

    from tests.support.fake_analysis import fake_analysis

    analysis = fake_analysis().save(tmp_path / "run")
    before = {p.name: p.read_bytes() for p in analysis.iterdir() if p.is_file()}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == tmp_path else real_access(path, mode))
    import headscope.cli

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the folder was checked")

    monkeypatch.setattr(headscope.cli.loader, "load", no_load)
    result = CliRunner().invoke(app, ["geometry", planted_path, "--into", str(analysis), *GEOMETRY])
    assert result.exit_code == 1 and "permission denied" in result.output, result.output
    assert {p.name: p.read_bytes() for p in analysis.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
