"""The fault table of tasks, attribution and circuit folders, the Python API beside the command
line. Each API case: the user's files, a call, the one-line `HeadscopeError` it must raise, and
afterwards every file the user had byte-identical and nothing added. Each CLI case: the same
through `headscope attribute` / `headscope circuit`, with the exit code. Built on fake circuits
(tests/support/fake_circuit.py), small hand-made tasks and the planted model, so the table takes
seconds."""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from headscope.analysis import Analysis
from headscope.circuits.attribution_run import read_attribution, run_attribution
from headscope.circuits.circuit import Circuit
from headscope.circuits.circuit_run import read_circuit, write_circuit
from headscope.circuits.tasks import Task
from headscope.errors import HeadscopeError, HeadscopeWarning
from headscope.folders import MANIFEST, MARKER, write_manifest
from tests.faults.test_cli_faults import snapshot
from tests.support.fake_analysis import fake_analysis
from tests.support.fake_circuit import fake_circuit


# ---------------------------------------------------------------- the user's files

def small_task(**changes) -> Task:
    fields = dict(clean=[[5, 6, 7], [5, 8, 7]], corrupted=[[5, 9, 7], [5, 10, 7]], answer=[11, 12], wrong=[13, 14],
                  name="small")
    fields.update(changes)
    return Task(**fields)


def a_circuit(evaluated: bool = True) -> Circuit:
    found = fake_circuit(2, 3, evaluated=evaluated)
    found.task = small_task()
    return found


def circuit_folder(work: Path, name: str = "c") -> Path:
    return a_circuit().save(work / name)


def users_folder(work: Path, name: str = "mine") -> Path:
    """A folder of the user's own, with a meta.json of theirs."""
    (work / name).mkdir()
    (work / name / "meta.json").write_text('{"my": "notes"}\n')
    return work / name


def analysis_folder(work: Path, name: str = "run") -> Path:
    return fake_analysis(n_layers=2, n_heads=3).save(work / name)


def users_file(work: Path, name: str = "task.json") -> Path:
    (work / name).write_text('{"my": "notes"}\n')
    return work / name


def without_manifest(folder: Path) -> None:
    (folder / MANIFEST).unlink()
    (folder / MARKER).unlink()  # as the previous Circuit.save wrote it: neither


# ---------------------------------------------------------------- the API table

@dataclass(frozen=True)
class ApiCase:
    """`setup(work)` makes the user's files; `call(work)` must raise a HeadscopeError holding
    `message` in one line, and warn nothing."""

    id: str
    setup: Callable
    call: Callable
    message: str


def nothing(work):
    pass


API_CASES = [
    # one rule for every writer: never into a folder headscope did not write; force as the CLI's
    ApiCase("circuit-save-into-users-folder", users_folder, lambda w: a_circuit().save(w / "mine"),
            "mine already exists; pass --force (force=True) to replace it"),
    ApiCase("circuit-save-force-into-users-folder", users_folder, lambda w: a_circuit().save(w / "mine", force=True),
            "mine holds files headscope did not write; --force replaces only folders headscope wrote"),
    ApiCase("circuit-save-into-an-analysis", analysis_folder, lambda w: a_circuit().save(w / "run"),
            "run already exists; pass --force (force=True) to replace it"),
    ApiCase("circuit-save-into-a-circuit", circuit_folder, lambda w: a_circuit().save(w / "c"),
            "c already exists; pass --force (force=True)"),
    ApiCase("circuit-save-over-a-file", users_file, lambda w: a_circuit().save(w / "task.json", force=True),
            "task.json exists and is not a folder"),
    ApiCase("circuit-save-none", nothing, lambda w: a_circuit().save(None), "Circuit.save needs a folder to write, got None"),
    ApiCase("task-save-over-users-file", users_file, lambda w: small_task().save(w / "task.json"),
            "task.json already exists; pass --force (force=True) to replace it"),
    ApiCase("task-save-force-over-users-file", users_file, lambda w: small_task().save(w / "task.json", force=True),
            "task.json is not a file headscope wrote (or it was edited since)"),
    ApiCase("task-save-into-a-folder", users_folder, lambda w: small_task().save(w / "mine", force=True),
            "mine is a folder; name a file to write"),
    # every read checks the manifest; unverified=True reads with a warning
    ApiCase("circuit-load-no-manifest", lambda w: without_manifest(circuit_folder(w)), lambda w: Circuit.load(w / "c"),
            "c is damaged: it has no manifest.json, so its files cannot be checked"),
    ApiCase("circuit-load-changed-edges",
            lambda w: (w / "c" / "edges.csv").write_text((circuit_folder(w) / "edges.csv").read_text()[:-40] + "\n"),
            lambda w: Circuit.load(w / "c"), "c is damaged: edges.csv has"),
    ApiCase("circuit-load-task-cut", lambda w: (circuit_folder(w) / "task.json").write_text("{}"),
            lambda w: Circuit.load(w / "c"), "c is damaged: task.json has 2 of the"),
    ApiCase("read-circuit-no-manifest", lambda w: without_manifest(circuit_folder(w)), lambda w: read_circuit(w / "c"),
            "it has no manifest.json"),
    ApiCase("circuit-load-not-a-folder", nothing, lambda w: Circuit.load(w / "nowhere"),
            "nowhere is not a circuit folder (no edges.csv)"),
    ApiCase("circuit-load-none", nothing, lambda w: Circuit.load(None),
            "Circuit.load needs the folder a circuit was saved in, got None"),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c.id for c in API_CASES])
def test_an_api_fault_is_one_headscope_error_and_leaves_the_files_alone(case, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    case.setup(work)
    before = snapshot(work)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(HeadscopeError) as err:
            case.call(work)
    message = str(err.value)
    assert case.message in message and "\n" not in message, message
    assert [str(w.message) for w in warned if issubclass(w.category, HeadscopeWarning)] == []
    assert snapshot(work) == before, "the user's files changed, or something was left behind"


# ---------------------------------------------------------------- what is accepted, and said

def test_a_circuit_folder_round_trips_with_its_manifest_and_force_replaces_it(tmp_path):
    found = a_circuit()
    folder = found.save(tmp_path / "c")
    listed = json.loads((folder / MANIFEST).read_text())["files"]
    assert set(listed) == {"edges.csv", "nodes.csv", "meta.json", "task.json", "evaluation.csv"}
    assert (folder / MARKER).is_file()
    back = Circuit.load(folder)
    assert back.edges.equals(found.edges) and torch.equal(back.task.clean, found.task.clean)
    other = fake_circuit(2, 3, seed=4)
    other.save(folder, force=True)  # a folder headscope wrote: replaced whole
    assert Circuit.load(folder).edges.score.tolist() == other.edges.score.tolist()
    assert not (folder / "task.json").exists() and not (folder / "evaluation.csv").exists()
    (tmp_path / "empty").mkdir()
    found.save(tmp_path / "empty", force=True)  # an empty folder: force writes it
    assert Circuit.load(tmp_path / "empty").edges.equals(found.edges)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "empty"]  # nothing temporary left


def test_a_circuit_saved_with_force_over_an_analysis_replaces_it_whole(tmp_path):
    """The analysis was headscope's: `force` replaces the folder whole, never a file inside it
    (the previous save overwrote its meta.json and left a folder no reader accepted)."""
    analysis_folder(tmp_path)
    a_circuit().save(tmp_path / "run", force=True)
    assert Circuit.load(tmp_path / "run").meta["model"] == "fake"
    assert not (tmp_path / "run" / "scores.csv").exists()


def test_unverified_reads_a_circuit_without_its_manifest_with_a_warning(tmp_path):
    folder = circuit_folder(tmp_path)
    without_manifest(folder)
    before = snapshot(tmp_path)
    with pytest.warns(HeadscopeWarning, match="c is damaged: it has no manifest.json.*read anyway"):
        back = Circuit.load(folder, unverified=True)
    assert back.edges.equals(a_circuit().edges)
    assert snapshot(tmp_path) == before


def test_task_save_replaces_a_task_file_with_force_only(tmp_path):
    path = small_task().save(tmp_path / "t.json")
    with pytest.raises(HeadscopeError, match="already exists"):
        small_task(name="again").save(path)
    small_task(name="again").save(path, force=True)
    assert Task.load(path).name == "again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_attribution_folders_follow_the_same_rule(planted, tmp_path):
    import headscope

    task = headscope.task("induction", planted, n=2, length=4)
    run = run_attribution(planted, task, methods=("atp",), n_show=1)
    users_folder(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(HeadscopeError, match="mine already exists"):
        run.save(tmp_path / "mine")
    with pytest.raises(HeadscopeError, match="mine holds files headscope did not write"):
        run.save(tmp_path / "mine", force=True)
    assert snapshot(tmp_path) == before
    folder = run.save(tmp_path / "att")
    assert set(json.loads((folder / MANIFEST).read_text())["files"]) == {"task.json", "dla.csv", "attribution.csv",
                                                                        "meta.json"}
    assert read_attribution(folder)["meta"]["task"] == "induction"
    (folder / MANIFEST).unlink()
    with pytest.raises(HeadscopeError, match="att is damaged: it carries headscope's marker"):
        read_attribution(folder)
    with pytest.warns(HeadscopeWarning, match="read anyway"):
        assert set(read_attribution(folder, unverified=True)["attribution"].method) == {"atp"}
    run.save(folder, force=True)
    read_attribution(folder)
