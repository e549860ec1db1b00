"""The fault-injection table for the command line: each case is a bad input or a fault, the
command it is given to, the exit code and a fragment of the one line the user reads, and the
invariant that every file the user had is byte-identical afterwards (and nothing was added:
no output folder, no temporary folder). Built on the planted model (tests/support/planted.py)
and the fake analysis (tests/support/fake_analysis.py), so the table runs in seconds.

Real signals at five moments of a real run are tests/cli/test_interrupts.py (slow: a process
each); here an interrupt is raised inside the command, while it writes.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from headscope import cli
from headscope.analysis import Analysis
from headscope.atomic import MANIFEST, MARKER, atomic_dir
from headscope.cli import app
from headscope.errors import HeadscopeError
from tests.support.fake_analysis import fake_analysis
from tests.support.file_tree import snapshot

FAST = ["--device", "cpu", "--detectors", "induction,duplicate_token", "--n-examples", "4", "--repeat-len", "8",
        "--repeats", "3", "--seq-len", "24", "--control", "none"]


# ---------------------------------------------------------------- the user's files, damaged

def model_copy(work: Path, planted: Path) -> Path:
    shutil.copytree(planted, work / "model")
    return work / "model"


def edit_config(**changes):
    def edit(work, planted):
        folder = model_copy(work, planted)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return edit


def truncate_weights(work, planted):
    path = model_copy(work, planted) / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def nan_weights(work, planted):
    path = model_copy(work, planted) / "model.safetensors"
    tensors = load_file(path)
    name = next(n for n in tensors if "h.1.attn.c_attn.weight" in n)
    tensors[name][0, :5] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})


def overwrite_weights(work, planted):
    """0xFF bytes over the middle of the weights file, the size unchanged (0xFFFFFFFF is a NaN)."""
    path = model_copy(work, planted) / "model.safetensors"
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))


def analysis_folder(work: Path, name: str = "run") -> Path:
    fake_analysis(n_layers=2, n_heads=3).save(work / name)
    return work / name


def as_old_folder(folder: Path) -> None:
    """As an analysis from before manifests and markers, edited by hand (one with the marker but no
    manifest is damaged: tests/faults/test_newer_surfaces.py)."""
    (folder / MANIFEST).unlink()
    (folder / MARKER).unlink()


def cut_scores(work, planted):
    path = analysis_folder(work) / "scores.csv"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def empty_meta(keep_manifest: bool):
    def edit(work, planted):
        folder = analysis_folder(work)
        (folder / "meta.json").write_text("{}")
        if not keep_manifest:
            as_old_folder(folder)
    return edit


def meta_edit(**changes):
    def edit(work, planted):
        folder = analysis_folder(work)
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, **changes}))
        as_old_folder(folder)
    return edit


def missing_file(name: str):
    def edit(work, planted):
        (analysis_folder(work) / name).unlink()
    return edit


def damaged_examples(work, planted):
    folder = analysis_folder(work)
    (folder / "examples.json").write_text('[{"tokens": ["a"]}]')
    as_old_folder(folder)


def two_analyses(work, planted):
    analysis_folder(work, "a")
    cut_scores_in = analysis_folder(work, "b") / "scores.csv"
    cut_scores_in.write_bytes(cut_scores_in.read_bytes()[:100])


def users_folder(work, planted):
    model_copy(work, planted)
    (work / "out").mkdir()
    (work / "out" / "thesis.txt").write_text("three years of work\n")


def detector_module(source: str):
    """A module of the user's, importable as `hs_fault_module`, whose import fails."""
    def setup(work, planted):
        model_copy(work, planted)
        (work / "hs_fault_module.py").write_text(source)
    return setup


def nothing(work, planted):
    model_copy(work, planted)


@dataclass(frozen=True)
class Fault:
    """One row of the table: `setup(work, planted_dir)` makes the user's files, `args` the command
    line ("{model}" is the model copy), and what must come back."""

    id: str
    setup: Callable
    args: tuple
    exit_code: int
    message: str


FAULTS = [
    # damaged model files
    Fault("truncated-safetensors", truncate_weights, ("analyze", "{model}", "--out", "out", *FAST), 1,
          "copy or download the model again if a file is cut or damaged"),
    Fault("cut-gguf", lambda work, planted: (work / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64)),
          ("verify", "model.gguf", "--no-cache"), 1, "the file may be cut or damaged: download or copy it again"),
    Fault("config-more-layers", edit_config(n_layer=4), ("analyze", "{model}", "--out", "out", *FAST), 1,
          "do not match its config"),
    Fault("config-zero-heads", edit_config(n_head=0), ("analyze", "{model}", "--out", "out", *FAST), 1,
          "config.json declares 0 attention heads; a model needs at least 1, so fix config.json"),
    Fault("config-zero-layers", edit_config(n_layer=0), ("analyze", "{model}", "--out", "out", *FAST), 1,
          "config.json declares 0 layers"),
    Fault("nan-weights", nan_weights, ("analyze", "{model}", "--out", "out", *FAST), 1, "h.1.attn.c_attn.weight"),
    Fault("0xff-in-weights", overwrite_weights, ("analyze", "{model}", "--out", "out", *FAST), 1, "NaN or infinite values"),
    Fault("verify-nan-weights", nan_weights, ("verify", "{model}"), 1, "FAIL: largest difference nan"),
    # damaged analysis folders
    Fault("scores-cut-mid-row", cut_scores, ("report", "run"), 1, "scores.csv"),
    Fault("meta-empty-with-manifest", empty_meta(True), ("report", "run"), 1,
          "meta.json has 2 of the"),
    Fault("meta-empty-no-manifest", empty_meta(False), ("report", "run"), 1,
          "run/meta.json is damaged: it lacks n_layers, n_heads, causal"),
    Fault("meta-zero-layers", meta_edit(n_layers=0), ("report", "run"), 1, "n_layers is 0, expected a positive integer"),
    Fault("meta-detectors-a-list", meta_edit(detectors=[]), ("report", "run"), 1, "detectors is [], expected a dict"),
    Fault("meta-fewer-layers-than-scores", meta_edit(n_layers=1), ("report", "run"), 1, "a layer outside 0-0"),
    Fault("missing-labels", missing_file("labels.csv"), ("report", "run"), 1, "missing labels.csv"),
    Fault("missing-scores", missing_file("scores.csv"), ("report", "run"), 1, "missing scores.csv"),
    Fault("damaged-examples", damaged_examples, ("report", "run"), 1,
          "examples.json is damaged: an example lacks the field 'patterns_uint8_base64'"),
    Fault("compare-with-a-cut-one", two_analyses, ("compare", "a", "b", "--out", "c"), 1, "scores.csv"),
    Fault("kv-policy-from-cut-scores", cut_scores, ("kv-policy", "run", "--out", "policy"), 1, "scores.csv"),
    # output folders that are not headscope's to replace
    Fault("out-is-users-folder", users_folder, ("analyze", "{model}", "--out", "out", *FAST), 1, "already exists"),
    Fault("force-on-users-folder", users_folder, ("analyze", "{model}", "--out", "out", "--force", *FAST), 1,
          "holds files headscope did not write"),
    Fault("out-is-the-model", nothing, ("analyze", "{model}", "--out", "{model}", "--force", *FAST), 1,
          "which is being read; choose another output folder"),
    # bad numeric options: usage errors (exit 2), refused before any work
    Fault("tolerance-negative", nothing, ("verify", "{model}", "--tolerance", "-1"), 2, "--tolerance must be a positive"),
    Fault("tolerance-nan", nothing, ("verify", "{model}", "--tolerance", "nan"), 2, "--tolerance must be a positive"),
    Fault("tolerance-zero", nothing, ("verify", "{model}", "--tolerance", "0"), 2, "--tolerance must be a positive"),
    Fault("seed-beyond-64-bits", nothing, ("analyze", "{model}", "--seed", "99999999999999999999999", "--out", "out"),
          2, "Invalid value for '--seed'"),
    Fault("seed-negative", nothing, ("analyze", "{model}", "--seed", "-1", "--out", "out"), 2, "Invalid value for '--seed'"),
    Fault("batch-size-zero", nothing, ("analyze", "{model}", "--out", "out", *FAST, "--batch-size", "0"), 2,
          "batch_size must be an integer of at least 1"),
    Fault("n-examples-zero", nothing, ("analyze", "{model}", "--out", "out", *FAST, "--n-examples", "0"), 2,
          "n_examples must be an integer of at least 1, got 0"),
    Fault("geometry-examples-zero", nothing, ("geometry", "{model}", "--out", "g", "--examples", "0"), 2,
          "--examples must be an integer of at least 1, got 0"),
    Fault("geometry-steps-zero", nothing, ("geometry", "{model}", "--out", "g", "--steps", "0"), 2,
          "--steps must be an integer of at least 1, got 0"),
    Fault("kv-keep-zero", analysis_folder_setup := (lambda work, planted: analysis_folder(work)),
          ("kv-policy", "run", "--out", "policy", "--keep", "0"), 2, "keep is the fraction of key/value heads kept full, in (0, 1]"),
    Fault("kv-keep-above-one", analysis_folder_setup, ("kv-policy", "run", "--out", "policy", "--keep", "1.5"), 2,
          "in (0, 1]; got 1.5"),
    Fault("device-mps-absent", nothing, ("analyze", "{model}", "--out", "out", *FAST, "--device", "mps"), 1,
          "device 'mps' was asked for but this machine or torch build has no MPS"),
    Fault("geometry-out-is-a-file", users_file := (lambda work, planted: (model_copy(work, planted),
                                                                          (work / "notes.txt").write_text("mine\n"))),
          ("geometry", "{model}", "--out", "notes.txt"), 1, "notes.txt exists and is not a folder"),
    Fault("detector-module-raises", detector_module("raise RuntimeError('boom at import')\n"),
          ("analyze", "{model}", "--out", "out", *FAST[:2], "--detectors", "hs_fault_module:x"), 1,
          "importing 'hs_fault_module' for detector 'hs_fault_module:x' failed: RuntimeError: boom at import"),
    Fault("detector-module-syntax-error", detector_module("def broken(:\n"),
          ("detectors", "--detectors", "hs_fault_module:x"), 1, "failed (line 1): SyntaxError"),
    Fault("kv-sink-negative", analysis_folder_setup, ("kv-policy", "run", "--out", "policy", "--sink", "-1"), 2,
          "sink must be an integer of at least 0, got -1"),
    Fault("kv-recent-zero", analysis_folder_setup, ("kv-policy", "run", "--out", "policy", "--recent", "0"), 2,
          "recent must be an integer of at least 1, got 0"),
    Fault("repeats-zero", nothing, ("analyze", "{model}", "--out", "out", *FAST, "--repeats", "0"), 2,
          "repeats must be an integer of at least 2, got 0"),
    Fault("needle-lengths-negative", nothing, ("analyze", "{model}", "--out", "out", "--needle-lengths", "-5"), 2,
          "--needle-lengths takes comma-separated token counts"),
    Fault("typo-in-an-option", nothing, ("analyze", "{model}", "--seq-ln", "5"), 2, "No such option: --seq-ln"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_a_fault_is_one_line_and_leaves_the_users_files_alone(fault, planted_dir, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    fault.setup(work, planted_dir)
    before = snapshot(work)
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    monkeypatch.delitem(sys.modules, "hs_fault_module", raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # Python's own __pycache__ for the user's module
    args = [a.replace("{model}", str(work / "model")) for a in fault.args]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == fault.exit_code, result.output
    assert isinstance(result.exception, SystemExit), f"an exception escaped: {result.exception!r}"
    assert "Traceback" not in result.output
    said = [line for line in result.output.splitlines() if fault.message in line]
    assert len(said) == 1, result.output  # one line says it ...
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) <= 1, result.output  # ... and no second error follows
    assert snapshot(work) == before, "the user's files changed, or something was left behind"


# ---------------------------------------------------------------- faults while a command runs

def test_ctrl_c_while_the_analysis_is_written_leaves_nothing(planted_dir, tmp_path, monkeypatch):
    model_copy(tmp_path, planted_dir)
    before = snapshot(tmp_path)
    real_write = Analysis.write_into

    def interrupted_write(self, directory, *args, **kwargs):
        real_write(self, directory, *args, **kwargs)  # the temporary folder is filled ...
        raise KeyboardInterrupt  # ... and Ctrl-C comes before the rename

    monkeypatch.setattr(Analysis, "write_into", interrupted_write)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "model"), "--out", "out", *FAST])
    assert result.exit_code == 130 and "interrupted" in result.output.splitlines()[-1]
    assert snapshot(tmp_path) == before


def test_the_output_parent_read_only_is_refused_before_the_model_loads(planted_dir, tmp_path, monkeypatch):
    """Simulated with os.access: the tests run as root, whom a chmod would not stop."""
    model_copy(tmp_path, planted_dir)
    (tmp_path / "locked").mkdir()
    before = snapshot(tmp_path)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == tmp_path / "locked"
                        else real_access(path, mode, **kw))
    loads = []
    monkeypatch.setattr(cli.loader, "load", lambda *a, **k: loads.append(a))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "model"), "--out", "locked/run", *FAST])
    assert result.exit_code == 1 and "permission denied" in result.output and not loads
    assert snapshot(tmp_path) == before


def test_concurrent_writers_the_later_one_never_replaces_the_first(tmp_path):
    """Two writers of one target: the first to rename wins; the other is refused at its rename
    (no --force) and its temporary folder is removed."""
    target = tmp_path / "conc"
    entered, first_done = threading.Event(), threading.Event()
    errors = []

    def slow_writer():
        try:
            with atomic_dir(target) as tmp:
                (tmp / "scores.csv").write_text("slow\n")
                entered.set()
                first_done.wait(10)
        except HeadscopeError as err:
            errors.append(str(err))

    thread = threading.Thread(target=slow_writer)
    thread.start()
    entered.wait(10)
    with atomic_dir(target) as tmp:
        (tmp / "scores.csv").write_text("fast\n")
    first_done.set()
    thread.join(10)
    assert (target / "scores.csv").read_text() == "fast\n"
    assert len(errors) == 1 and "appeared while this ran" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conc"]  # no temporary folder left
