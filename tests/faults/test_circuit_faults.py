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

import headscope

from headscope.analysis import Analysis
from headscope.circuits.attribution_run import read_attribution, run_attribution
from headscope.circuits.edge_circuit import Circuit, circuit
from headscope.circuits.circuit_run import read_circuit, write_circuit
from headscope.circuits.tasks import Task
from headscope.errors import HeadscopeError, HeadscopeWarning
from headscope.folders import MANIFEST, MARKER, write_manifest
from tests.support.file_tree import snapshot
from tests.support.fake_analysis import fake_analysis
from tests.support.fake_circuit import fake_circuit
from tests.support.word_tokenizer import ioi_tokenizer, word_tokenizer


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


def damaged(edit: Callable[[Path], None]):
    """A circuit folder `c`, edited, its manifest written again: the manifest vouches for the
    edit, so the checks of each file's content alone must catch it."""
    def setup(work):
        folder = circuit_folder(work)
        edit(folder)
        write_manifest(folder)
    return setup


def lines_of(name: str, change: Callable[[list], list]):
    def edit(folder: Path):
        lines = (folder / name).read_text().splitlines(keepends=True)
        (folder / name).write_text("".join(change(lines)))
    return edit


def cell(name: str, line: int, column: int, value: str):
    """`name`'s 1-based `line` with its `column` (0-based) set to `value`."""
    def change(lines):
        cells = lines[line - 1].rstrip("\n").split(",")
        cells[column] = value
        return lines[:line - 1] + [",".join(cells) + "\n"] + lines[line:]
    return lines_of(name, change)


def meta_with(**changes):
    def edit(folder: Path):
        meta = json.loads((folder / "meta.json").read_text())
        meta.update(changes)
        (folder / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if v is not DROP}))
    return edit


DROP = object()


def scored(value) -> Circuit:
    """A circuit in memory whose fourth edge (embed -> a0.h1.q) scores `value`."""
    found = a_circuit()
    scores = found.edges.score.astype(object) if isinstance(value, str) else found.edges.score.copy()
    scores.iloc[3] = value
    found.edges = found.edges.assign(score=scores)
    return found


def load(work):
    return Circuit.load(work / "c")


EDGES = "c/edges.csv is damaged: "
NODES = "c/nodes.csv is damaged: "
META = "c/meta.json is damaged: "


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
    # every file read defensively, whatever the manifest says: the file, the line and the field named
    ApiCase("meta-cut", damaged(lambda f: (f / "meta.json").write_text('{"model": "fa')), load,
            META + "it is not valid JSON (JSONDecodeError); write it again with headscope"),
    ApiCase("meta-a-list", damaged(lambda f: (f / "meta.json").write_text("[1]")), load,
            META + "it holds a list, not an object"),
    ApiCase("meta-without-method", damaged(meta_with(method=DROP)), load, META + "it lacks method"),
    ApiCase("meta-method-unknown", damaged(meta_with(method="acdc")), load,
            META + "method is 'acdc', expected one of eap, eap-ig"),
    ApiCase("meta-edges-text", damaged(meta_with(n_edges="75")), load, META + "n_edges is '75', expected a whole number"),
    ApiCase("meta-metric-infinite", damaged(meta_with(clean_metric=float("inf"))), load,
            META + "clean_metric is inf, expected a finite number"),
    ApiCase("meta-evaluation-without-cpr", damaged(meta_with(evaluation={"cmd": 0.1})), load,
            META + "its evaluation lacks finite cpr and cmd, which evaluation.csv needs"),
    ApiCase("nodes-renamed", damaged(cell("nodes.csv", 4, 0, "a0.h7")), load,
            NODES + "line 4: node 'a0.h7' is a head of layer 0, which the graph names 'a0.h1'"),
    ApiCase("nodes-kind-unknown", damaged(cell("nodes.csv", 6, 1, "ffn")), load,
            NODES + "line 6: kind is 'ffn', expected one of embed, head, mlp, mixer, attn, logits"),
    ApiCase("nodes-layer-text", damaged(cell("nodes.csv", 3, 2, "zero")), load,
            NODES + "line 3: node 'a0.h0' (head) has layer 'zero' and head '0', expected whole numbers"),
    ApiCase("nodes-twice", damaged(lines_of("nodes.csv", lambda l: l[:3] + l[2:])), load,
            NODES + "line 4: node 'a0.h0' is listed twice"),
    ApiCase("nodes-without-logits", damaged(lines_of("nodes.csv", lambda l: l[:-1])), load,
            NODES + "the embed node must come first and the logits node last, each once"),
    ApiCase("edges-empty", damaged(lines_of("edges.csv", lambda l: l[:1])), load, EDGES + "it holds no edges"),
    ApiCase("edges-score-text", damaged(cell("edges.csv", 5, 2, "high")), load,
            EDGES + "line 5: score is 'high', expected a finite number"),
    ApiCase("edges-score-inf", damaged(cell("edges.csv", 5, 2, "inf")), load, EDGES + "line 5: score is 'inf'"),
    ApiCase("edges-score-nan", damaged(cell("edges.csv", 5, 2, "nan")), load, EDGES + "line 5: score is 'nan'"),
    ApiCase("edges-score-empty", damaged(cell("edges.csv", 5, 2, "")), load, EDGES + "line 5: score is ''"),
    ApiCase("edges-src-renamed", damaged(cell("edges.csv", 20, 0, "a0.h7")), load,
            EDGES + "line 20: src 'a0.h7' is not a sender of nodes.csv"),
    ApiCase("edges-dst-renamed", damaged(cell("edges.csv", 3, 1, "a0.h0.z")), load,
            EDGES + "line 3: dst 'a0.h0.z' is not a receiver of nodes.csv's graph"),
    ApiCase("edges-backwards", damaged(cell("edges.csv", 3, 0, "m1")), load,
            EDGES + "line 3: the edge m1 -> a0.h0.k runs backwards: a0.h0.k reads the residual stream before m1 "
                    "writes to it"),
    ApiCase("edges-same-layer-heads", damaged(cell("edges.csv", 3, 0, "a0.h2")), load,
            EDGES + "line 3: the edge a0.h2 -> a0.h0.k runs backwards"),
    ApiCase("edges-row-twice", damaged(lines_of("edges.csv", lambda l: l[:-1] + l[5:6])), load,
            EDGES + "line 76: the edge embed -> a0.h1.k is listed twice (first on line 6)"),
    ApiCase("edges-row-deleted", damaged(lines_of("edges.csv", lambda l: l[:9] + l[10:])), load,
            EDGES + "it holds 74 edges, meta.json says 75 (n_edges)"),
    ApiCase("edges-extra-column", damaged(lines_of("edges.csv", lambda l: [x.rstrip("\n") + ",0\n" for x in l])), load,
            EDGES + "its columns are src, dst, score, 0, expected src, dst, score"),
    ApiCase("edges-cut-mid-row", damaged(lines_of("edges.csv", lambda l: ["".join(l)[:-5]])), load,
            EDGES + "its last line is cut"),
    ApiCase("evaluation-text", damaged(cell("evaluation.csv", 3, 2, "good")), load,
            "c/evaluation.csv is damaged: line 3: faithfulness is 'good', expected a finite number"),
    ApiCase("evaluation-size-zero", damaged(cell("evaluation.csv", 2, 0, "0")), load,
            "c/evaluation.csv is damaged: its sizes must be percentages in (0, 100], each once, smallest first"),
    ApiCase("evaluation-edges-fraction", damaged(cell("evaluation.csv", 2, 1, "1.5")), load,
            "c/evaluation.csv is damaged: line 2: n_edges is '1.5', expected a whole number"),
    ApiCase("task-of-another-shape", damaged(lambda f: (f / "task.json").write_text(
        (f / "task.json").read_text().replace('"corrupted":[[5,9,7],[5,10,7]]', '"corrupted":[[5,9],[5,10]]'))), load,
        "c/task.json: Task corrupted has shape [2, 2], clean [2, 3]"),
    ApiCase("task-not-json", damaged(lambda f: (f / "task.json").write_text("{")), load,
            "c/task.json is not a task file (invalid JSON"),
    # arguments checked at the API as at the command line
    ApiCase("top-negative", nothing, lambda w: a_circuit().top(-1), "n must be an integer of at least 1, got -1"),
    ApiCase("top-zero", nothing, lambda w: a_circuit().top(0), "n must be an integer of at least 1, got 0"),
    ApiCase("top-fraction", nothing, lambda w: a_circuit().top(2.5), "n must be an integer of at least 1, got 2.5"),
    ApiCase("top-text", nothing, lambda w: a_circuit().top("5"), "n must be an integer of at least 1, got '5'"),
    ApiCase("top-bool", nothing, lambda w: a_circuit().top(True), "n must be an integer of at least 1, got True"),
    *[ApiCase(f"{name}-score-{label}", nothing, call(value),
              f"{what}: the score of edge embed -> a0.h1.q is {shown}; a circuit ranks finite numbers only")
      for label, value, shown in (("nan", float("nan"), "nan"), ("inf", float("inf"), "inf"), ("text", "high", "'high'"))
      for name, what, call in (("top", "Circuit.top", lambda v: lambda w: scored(v).top(5)),
                               ("evaluate", "Circuit.evaluate", lambda v: lambda w: scored(v).evaluate()),
                               ("save", "Circuit.save", lambda v: lambda w: scored(v).save(w / "c")),
                               ("write-circuit", "Circuit.save", lambda v: lambda w: write_circuit(scored(v), w / "c")))],
    ApiCase("evaluate-seed-huge", nothing, lambda w: a_circuit().evaluate(seed=2**70),
            "seed must be an integer from 0 to 2**63-1, got 1180591620717411303424"),
    ApiCase("evaluate-seed-negative", nothing, lambda w: a_circuit().evaluate(seed=-1),
            "seed must be an integer from 0 to 2**63-1, got -1"),
    ApiCase("evaluate-random-huge", nothing, lambda w: a_circuit().evaluate(n_random=10**9),
            "n_random must be an integer from 0 to 1000, got 1000000000"),
    ApiCase("circuit-steps-huge", nothing, lambda w: circuit(None, small_task(), steps=10**9),
            "steps must be an integer from 1 to 1000, got 1000000000"),
    ApiCase("circuit-steps-zero", nothing, lambda w: circuit(None, small_task(), steps=0),
            "steps must be an integer from 1 to 1000, got 0"),
    ApiCase("evaluate-without-task", damaged(lambda f: (f / "task.json").unlink()), lambda w: load(w).evaluate(),
            "evaluate runs the circuit's task, and this circuit has none (a circuit folder without task.json)"),
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


def test_reordered_edges_come_back_in_the_graphs_order(tmp_path):
    folder = circuit_folder(tmp_path)
    edges = (folder / "edges.csv").read_text().splitlines(keepends=True)
    (folder / "edges.csv").write_text("".join(edges[:1] + edges[1:][::-1]))
    write_manifest(folder)
    assert Circuit.load(folder).edges.equals(a_circuit().edges)


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


# ---------------------------------------------------------------- tasks, where they are made

GOOD = {"clean": "When Mary and John went to the store, John gave a drink to",
        "corrupted": "When Alice and Bob went to the store, Tom gave a drink to", "answer": " Mary", "wrong": " John"}
SHORT = {"clean": "abcab", "corrupted": "xyzab", "answer": "c", "wrong": "z"}  # the planted model's characters


def jsonl(*lines, name: str = "mine.jsonl"):
    """A JSONL task file of `lines` (dicts, or text as it is)."""
    def setup(work):
        (work / name).write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return setup



def saved_task(task: Task, name: str = "t.json"):
    def setup(work):
        task.save(work / name)
    return setup


def long_task() -> Task:
    """One prompt of 60 tokens: more than the planted model's 48 positions."""
    return Task(clean=[[5] * 60], corrupted=[[6] * 60], answer=[7], wrong=[8])


@dataclass(frozen=True)
class TaskCase:
    """`setup(work)`; `call(work, planted)` must raise a HeadscopeError holding `message` in one line."""

    id: str
    setup: Callable
    call: Callable
    message: str


def words():
    return ioi_tokenizer()


def build(name: str = "mine.jsonl", with_model: bool = False, **kwargs):
    """`headscope.task(work/name, ...)` with the IOI word tokenizer (`with_model`: the planted model)."""
    def call(work, planted):
        return headscope.task(work / name, planted if with_model else words(), **kwargs)
    return call


def builtin(name: str, tokenizer=None, **kwargs):
    """`headscope.task(name, ...)` with `tokenizer()` (default: the planted model)."""
    def call(work, planted):
        return headscope.task(name, planted if tokenizer is None else tokenizer(), **kwargs)
    return call


def missing_word(word: str):
    """The IOI word tokenizer without `word`."""
    def make():
        from headscope.circuits.task_builders import IOI_TEMPLATES
        from tests.support.word_tokenizer import IOI_NAMES, IOI_OBJECTS, IOI_PLACES, template_words, word_tokenizer

        return word_tokenizer([w for w in template_words(*IOI_TEMPLATES) if w != word] + IOI_NAMES + IOI_PLACES
                              + IOI_OBJECTS)
    return make


TASK_CASES = [
    TaskCase("prompt-unknown-word", jsonl(GOOD, dict(GOOD, clean=GOOD["clean"].replace("store", "shop"))), build(),
             "mine.jsonl:2: clean holds 'shop', which this tokenizer does not know (it reads it as [UNK])"),
    TaskCase("corrupted-unknown-word", jsonl(dict(GOOD, corrupted=GOOD["corrupted"].replace("Tom", "Zed"))), build(),
             "mine.jsonl:1: corrupted holds 'Zed', which this tokenizer does not know"),
    TaskCase("builtin-prompt-unknown-word", nothing, builtin("ioi", tokenizer=missing_word("gave"), n=8),
             "the prompt holds 'gave', which this tokenizer does not know (it reads it as [UNK])"),
    TaskCase("prompt-only-whitespace", jsonl(dict(GOOD, clean="   ")), build(),
             "mine.jsonl:1: 'clean' is only whitespace ('   '); it needs at least one word"),
    TaskCase("answers-twice", jsonl(dict(GOOD, answer=[" Mary", " Mary"])), build(),
             "mine.jsonl:1: answer ' Mary' and ' Mary' are the same token 'Mary'; list each once"),
    TaskCase("answer-only-whitespace", jsonl(dict(GOOD, answer=[" Mary", " "])), build(),
             "mine.jsonl:1: 'answer' must be a string or a non-empty list of strings, each more than whitespace"),
    TaskCase("prompt-a-long-list", jsonl(dict(GOOD, clean=list(range(500)))), build(),
             "mine.jsonl:1: 'clean' must be a non-empty string, got [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16..."),
    TaskCase("prompt-beyond-the-positions", jsonl(SHORT, dict(SHORT, clean="ab" * 30, corrupted="xy" * 30)),
             build(with_model=True), "mine.jsonl:2: clean is 60 tokens; this model takes at most 48 positions"),
    TaskCase("induction-beyond-the-positions", nothing, builtin("induction", length=25),
             "induction needs prompts of 49 tokens; this model takes at most 48 positions (use a smaller length)"),
    TaskCase("induction-small-vocabulary", nothing, builtin("induction", tokenizer=lambda: word_tokenizer(["a", "b", "c"])),
             "induction with length 20 needs 40 distinct tokens from the middle of the vocabulary; this tokenizer has "
             "1 there: its vocabulary is too small for induction"),
    TaskCase("seed-huge", nothing, builtin("ioi", tokenizer=words, seed=2**70),
             "seed must be an integer from 0 to 2**63-1, got 1180591620717411303424"),
    TaskCase("seed-negative", nothing, builtin("ioi", tokenizer=words, seed=-1), "seed must be an integer from 0 to 2**63-1"),
    TaskCase("metric-typo", nothing, builtin("ioi", tokenizer=words, metric="acc"), "unknown metric 'acc'"),
    TaskCase("missing-file", nothing, build("nope.jsonl"), "cannot read task file"),
    TaskCase("a-folder", lambda w: (w / "tasks").mkdir(), build("tasks"), "tasks is a folder; a task file is a JSONL file"),
    TaskCase("saved-of-another-tokenizer", saved_task(small_task(tokenizer="58-000000000000")), build("t.json"),
             "t.json is a saved task built for another tokenizer (58-000000000000; this one is"),
    TaskCase("saved-fewer-than-n", saved_task(small_task()), build("t.json", n=5),
             "t.json is a saved task of 2 examples, fewer than n=5"),
    TaskCase("saved-beyond-the-positions", saved_task(long_task()), build("t.json", with_model=True),
             "t.json is a saved task of prompts of 60 tokens; this model takes at most 48 positions"),
    TaskCase("saved-damaged", lambda w: (w / "t.json").write_text('{"format": "headscope-task", "version": 1}'),
             build("t.json"), "t.json is not a complete task file: no 'clean'"),
    TaskCase("set-lists-a-token-twice", nothing, lambda w, p: small_task(answer=[[11, 11], [12, -1]]),
             "Task answer row 0 lists token id 11 twice; a set holds each token once"),
    TaskCase("too-many-positions", nothing, lambda w, p: Task(clean=torch.zeros(2, 2**19 + 1, dtype=torch.long),
                                                                corrupted=torch.zeros(2, 2**19 + 1, dtype=torch.long),
                                                                answer=[1, 1], wrong=[2, 2]),
             "Task clean holds 2 x 524289 = 1,048,578 prompt positions; a task holds at most 1,048,576 (MAX_TASK_TOKENS)"),
    TaskCase("attribute-beyond-the-positions", nothing, lambda w, p: headscope.attribute(p, long_task()),
             "task 'custom' has prompts of 60 positions (row 0: 60 tokens); this model takes at most 48: use shorter prompts"),
    TaskCase("circuit-beyond-the-positions", nothing, lambda w, p: circuit(p, long_task(), method="eap"),
             "task 'custom' has prompts of 60 positions"),
]


@pytest.mark.parametrize("case", TASK_CASES, ids=[c.id for c in TASK_CASES])
def test_a_bad_task_is_refused_where_it_is_made(case, planted, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    case.setup(work)
    before = snapshot(work)
    with pytest.raises(HeadscopeError) as err:
        case.call(work, planted)
    message = str(err.value)
    assert case.message in message and "\n" not in message, message
    assert snapshot(work) == before


def test_an_answer_without_its_leading_space_is_said(tmp_path):
    """In GPT-2's layout 'Mary' and ' Mary' are two tokens: an answer written without the space is
    accepted (it may be meant) and a warning names the line and both tokens."""
    from headscope.circuits.task_builders import IOI_TEMPLATES
    from tests.support.word_tokenizer import IOI_NAMES, IOI_OBJECTS, IOI_PLACES, byte_level_tokenizer, template_words

    tokenizer = byte_level_tokenizer(template_words(*IOI_TEMPLATES) + IOI_NAMES + IOI_PLACES + IOI_OBJECTS)
    jsonl(GOOD, dict(GOOD, answer="Mary"))(tmp_path)
    with pytest.warns(HeadscopeWarning) as warned:
        task = headscope.task(tmp_path / "mine.jsonl", tokenizer)
    assert [str(w.message).split("mine.jsonl")[1] for w in warned] == [
        ":2: answer 'Mary' has no leading space, so it is the token 'Mary', not ' Mary': the word after the prompt "
        "usually starts with a space; write ' Mary' if that is the word meant"]
    assert task.answer.tolist() == [tokenizer.get_vocab()["\u0120Mary"], tokenizer.get_vocab()["Mary"]]
    jsonl(dict(GOOD, clean=GOOD["clean"] + " ", corrupted=GOOD["corrupted"] + " ", answer="Mary"),
          name="spaced.jsonl")(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the prompt ends with a space: the answer without one is the next word
        headscope.task(tmp_path / "spaced.jsonl", tokenizer)


def test_an_existing_file_beats_a_built_in_name_and_says_so(tmp_path, monkeypatch):
    jsonl(GOOD, name="induction")(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(HeadscopeWarning, match="induction is a file in this folder, so it is read as the task; the "
                                              "built-in task 'induction' is not used"):
        task = headscope.task("induction", words())
    assert task.n == 1 and task.texts[0]["clean"] == GOOD["clean"]


def test_a_saved_task_is_read_as_what_it_is(planted, tmp_path):
    built = headscope.task("induction", planted, n=4, length=5, seed=3)
    path = built.save(tmp_path / "t.json")
    again = headscope.task(path, planted, n=2, metric="prob")
    assert torch.equal(again.clean, built.clean[:2]) and (again.name, again.metric) == ("induction", "prob")
    named = built.save(tmp_path / "t.jsonl")  # its name says JSONL: its content says a saved task
    assert torch.equal(headscope.task(named, planted).answer, built.answer)


# ---------------------------------------------------------------- the command line

@dataclass(frozen=True)
class CliCase:
    """`setup(work)` makes the user's files; `args` follow `headscope` ("{model}": the planted
    model folder, read only); `before_load`: refused before the model would load."""

    id: str
    setup: Callable
    args: tuple
    exit_code: int
    message: str
    before_load: bool = False


def other_analysis(work):
    fake_analysis(n_layers=2, n_heads=3).save(work / "run")  # the planted model has 4 heads a layer


def another_family(work):
    analysis = fake_analysis(n_layers=2, n_heads=4)
    analysis.save(work / "run")  # the fake analysis is a Llama's; the planted model a GPT-2


ATTRIBUTE = ("attribute", "{model}", "--device", "cpu", "--methods", "atp", "--out", "out")
CIRCUIT = ("circuit", "{model}", "--device", "cpu", "--method", "eap", "--no-evaluate", "--out", "out")

CLI_CASES = [
    CliCase("task-typo", nothing, (*CIRCUIT, "--task", "iox"), 2, "unknown task 'iox'", before_load=True),
    CliCase("metric-typo", nothing, (*ATTRIBUTE, "--metric", "acc"), 2, "unknown metric 'acc'", before_load=True),
    CliCase("task-file-missing", nothing, (*CIRCUIT, "--task", "nope.jsonl"), 1,
            "cannot read task file nope.jsonl: no such file", before_load=True),
    CliCase("task-a-folder", lambda w: (w / "tasks").mkdir(), (*ATTRIBUTE, "--task", "tasks/"), 1,
            "tasks is a folder; a task file is a JSONL file or a task saved with Task.save", before_load=True),
    CliCase("prompt-unknown-character", jsonl(SHORT, dict(SHORT, clean="abcé", corrupted="xyzé")),
            (*ATTRIBUTE, "--task", "mine.jsonl", "--n", "2"), 1,
            "mine.jsonl:2: clean holds 'é', which this tokenizer does not know (it reads it as [UNK])"),
    CliCase("prompt-beyond-the-positions", jsonl(dict(SHORT, clean="ab" * 30, corrupted="xy" * 30)),
            (*CIRCUIT, "--task", "mine.jsonl", "--n", "1"), 1,
            "mine.jsonl:1: clean is 60 tokens; this model takes at most 48 positions"),
    CliCase("prompt-only-whitespace", jsonl(dict(SHORT, clean=" \t ")), (*ATTRIBUTE, "--task", "mine.jsonl", "--n", "1"),
            1, "mine.jsonl:1: 'clean' is only whitespace"),
    CliCase("answers-twice", jsonl(dict(SHORT, answer=["c", "c"])), (*CIRCUIT, "--task", "mine.jsonl", "--n", "1"), 1,
            "mine.jsonl:1: answer 'c' and 'c' are the same token 'c'; list each once"),
    CliCase("saved-task-of-another-tokenizer", saved_task(small_task(tokenizer="58-000000000000")),
            (*ATTRIBUTE, "--task", "t.json", "--n", "2"), 1, "t.json is a saved task built for another tokenizer"),
    CliCase("saved-task-fewer-than-n", saved_task(small_task()), (*CIRCUIT, "--task", "t.json"), 1,
            "t.json is a saved task of 2 examples, fewer than n=32"),
    CliCase("analysis-of-other-heads", other_analysis, (*CIRCUIT, "--task", "induction", "--n", "2", "--analysis", "run"),
            1, "--analysis run is of fake/tiny-2x3 (llama, 2 layers x 3 heads), not of a model like"),
    CliCase("analysis-of-another-family", another_family,
            (*ATTRIBUTE, "--task", "induction", "--n", "2", "--analysis", "run"), 1,
            "--analysis run is of fake/tiny-2x4 (llama, 2 layers x 4 heads), not of a model like"),
    CliCase("steps-beyond-the-bound", nothing, (*CIRCUIT, "--steps", "5000"), 2,
            "--steps must be an integer from 1 to 1000, got 5000", before_load=True),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_a_cli_fault_is_one_line_and_leaves_the_files_alone(case, planted_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from headscope import cli
    from headscope.cli import app

    work = tmp_path / "work"
    work.mkdir()
    case.setup(work)
    before = snapshot(work)
    monkeypatch.chdir(work)
    if case.before_load:
        def load(*args, **kwargs):
            raise AssertionError("the model was loaded before the fault was found")
        monkeypatch.setattr(cli.loader, "load", load)
    result = CliRunner().invoke(app, [a.replace("{model}", str(planted_dir)) for a in case.args])
    monkeypatch.undo()
    assert result.exit_code == case.exit_code, result.output
    assert isinstance(result.exception, SystemExit), f"an exception escaped: {result.exception!r}"
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and case.message in errors[0], result.output
    assert snapshot(work) == before, "the user's files changed, or something was left behind"


def test_the_cli_reads_a_file_named_like_a_built_in_and_a_saved_task(planted, planted_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from headscope.cli import app

    monkeypatch.chdir(tmp_path)
    jsonl(SHORT, dict(SHORT, clean="pqrpq", corrupted="stupq", answer="r", wrong="u"), name="induction")(tmp_path)
    result = CliRunner().invoke(app, ["attribute", str(planted_dir), "--device", "cpu", "--methods", "atp",
                                      "--task", "induction", "--n", "2", "--out", "a"])
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("warning: ")] == [
        "warning: induction is a file in this folder, so it is read as the task; the built-in task 'induction' is "
        "not used (rename the file to run the built-in)"]
    assert Task.load(tmp_path / "a" / "task.json").texts[1]["clean"] == "pqrpq"
    saved = headscope.task("induction-keys", planted, n=3, length=4).save(tmp_path / "t.json")
    result = CliRunner().invoke(app, ["circuit", str(planted_dir), "--device", "cpu", "--method", "eap",
                                      "--no-evaluate", "--task", str(saved), "--n", "3", "--out", "c"])
    assert result.exit_code == 0, result.output
    assert "task: induction-keys, 3 prompt pairs" in result.output
    assert torch.equal(Circuit.load(tmp_path / "c").task.clean, Task.load(saved).clean)


# ---------------------------------------------------------------- a circuit edited in memory

def test_a_circuit_edited_in_memory_is_aligned_or_named(planted):
    task = headscope.task("induction", planted.tokenizer, n=4, seed=0)
    found = circuit(planted, task, method="eap")
    reference = found.evaluate(sizes=[10], n_random=0, batch_size=4)
    shuffled = Circuit(found.edges.sample(frac=1.0, random_state=0).reset_index(drop=True), found.nodes,
                       dict(found.meta), task, loaded=planted)
    again = shuffled.evaluate(sizes=[10], n_random=0, batch_size=4)  # rows in any order: the same circuit
    assert list(again.faithfulness) == pytest.approx(list(reference.faithfulness), abs=1e-9)
    cases = [(found.edges.iloc[:0], "has no edges"),
             (found.edges.iloc[1:], f"lacks {found.edges.src[0]}->{found.edges.dst[0]}"),
             (found.edges.iloc[[0, *range(len(found.edges))]].reset_index(drop=True), "twice (rows 0 and 1)")]
    for edges, words in cases:
        edited = Circuit(edges, found.nodes, dict(found.meta), task, loaded=planted)
        with pytest.raises(HeadscopeError, match=words.replace("(", r"\(").replace(")", r"\)")):
            edited.evaluate(sizes=[10], n_random=0)
