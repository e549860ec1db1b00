"""The fault table of the newer surfaces (issue 41): kv-policy, kv-eval, timeline, report, compare,
geometry --into, under the rule every writing command shares (`headscope.atomic`,
docs/reliability.md). Each case: the user's files, a command line, the exit code, the one line
that says what is wrong (naming the file and, for a field, the field), and afterwards every file
the user had byte-identical and nothing added (no output, no temporary file or folder). Built
from fake analyses, hand-written policy files and a 1-layer Llama saved as checkpoints, run in
process (CliRunner), so the table takes seconds.

`usage` cases: every command's bad values exit 2, as the README promises for usage errors.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from headscope import cli
from headscope.atomic import MANIFEST, MARKER, atomic_dir, atomic_file
from headscope.cli import app
from headscope.errors import HeadscopeError, HeadscopeWarning, UsageError
from headscope.kv import read_duo, write_duo, write_headkv
from headscope.kv.formats import DUO_CONFIG, DUO_TSV, written_by_headscope
from headscope.kv.policy import policy_from_values
from headscope.training.toy import tiny_llama
from tests.support.file_tree import snapshot
from tests.support.fake_analysis import fake_analysis
from tests.support.planted import N_HEADS


# ---------------------------------------------------------------- the user's files

def analysis(work: Path, name: str = "run") -> Path:
    fake_analysis(n_layers=2, n_heads=3).save(work / name)
    return work / name


def policy(work: Path, name: str = "duo") -> Path:
    """A DuoAttention folder headscope wrote: 2 layers x 1 key/value head, 3 query heads."""
    write_duo(policy_from_values(np.array([[0.9], [0.2]]), 0.5, 3, 4, 16), work / name)
    return work / name


def their_policy(tsv: str, config: Optional[dict] = None):
    """A DuoAttention folder another tool wrote (no marker): `tsv` as given, config.json."""
    def setup(work, series):
        folder = work / "duo"
        folder.mkdir()
        (folder / DUO_TSV).write_text(tsv)
        (folder / DUO_CONFIG).write_text(json.dumps(config or {"sink_size": 4, "recent_size": 16, "full_fraction": 0.5,
                                                              "n_heads": 3}))
    return setup


def edited_config(text: Callable[[str], str]):
    def setup(work, series):
        path = policy(work) / DUO_CONFIG
        path.write_text(text(path.read_text()))
    return setup


def config_field(**fields):
    return edited_config(lambda text: json.dumps({**json.loads(text), **fields}))


def headkv(text: str):
    def setup(work, series):
        (work / "p.json").write_text(text)
    return setup


def checkpoints(work: Path, series: Path) -> Path:
    shutil.copytree(series, work / "series")
    return work / "series"


def in_checkpoint(edit: Callable[[Path], None]):
    """The series with checkpoint-8 edited."""
    def setup(work, series):
        edit(checkpoints(work, series) / "checkpoint-8")
    return setup


def edit_json(name: str, change: Callable[[str], str]):
    def edit(folder: Path):
        (folder / name).write_text(change((folder / name).read_text()))
    return edit


def cut_weights(folder: Path):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def wrong_shape(folder: Path):
    tensors = load_file(folder / "model.safetensors")
    name = next(n for n in tensors if "q_proj" in n)
    tensors[name] = tensors[name][:-1].clone()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def damaged(edit: Callable[[Path], None], keep_manifest: bool = False):
    """A fake analysis `run`, edited, its manifest deleted (the marker stays, as it would)."""
    def setup(work, series):
        folder = analysis(work)
        analysis(work, "other")
        edit(folder)
        if not keep_manifest:
            (folder / MANIFEST).unlink()
    return setup


def scores_lines(change: Callable[[list], list]):
    def edit(folder: Path):
        lines = (folder / "scores.csv").read_text().splitlines(keepends=True)
        (folder / "scores.csv").write_text("".join(change(lines)))
    return edit


def set_score(value: str):
    def change(lines):
        cells = lines[3].split(",")
        cells[3] = value
        return lines[:3] + [",".join(cells)] + lines[4:]
    return scores_lines(change)


def symlinked_scores(folder: Path):
    outside = folder.parent / "elsewhere.csv"
    shutil.move(folder / "scores.csv", outside)
    os.symlink(outside, folder / "scores.csv")


def examples_of_another_grid(folder: Path):
    fake_analysis(n_layers=3, n_heads=3).save(folder.parent / "x")
    shutil.move(folder.parent / "x" / "examples.json", folder / "examples.json")
    shutil.rmtree(folder.parent / "x")


def users_file(work, series):
    analysis(work)
    (work / "user").mkdir()
    (work / "user" / "p.json").write_text('{"my": "notes"}\n')


def edited_headkv(work, series):
    """A HeadKV file headscope wrote, then re-indented by the user: no longer recognised as headscope's."""
    folder = analysis(work)
    result = CliRunner().invoke(app, ["kv-policy", str(folder), "--out", str(work / "p.json"), "--format", "headkv",
                                      "--rank-by", "razor"])
    assert result.exit_code == 0, result.output
    (work / "p.json").write_text(json.dumps(json.loads((work / "p.json").read_text()), indent=2))


def locked(work: Path):
    (work / "locked").mkdir()


def deny_writes_to(name: str):
    """os.access says `work/name` is not writable (the tests run as root, whom a chmod would not stop)."""
    def patch(monkeypatch, work):
        real, denied = os.access, (work / name).resolve()
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode & os.W_OK and Path(path).resolve()
                            == denied else real(path, mode, **kw))
    return patch


def refuse_renames(monkeypatch, work):
    """The system refuses to rename a temporary file or folder into place (a sticky /tmp, a
    read-only mount): os.replace and os.rename raise for a source named .*.tmp-*."""
    for name in ("replace", "rename"):
        real = getattr(os, name)

        def refusing(src, dst, *args, real=real, **kwargs):
            if ".tmp-" in Path(src).name:
                raise PermissionError(13, "Permission denied", str(dst))
            return real(src, dst, *args, **kwargs)
        monkeypatch.setattr(os, name, refusing)


def not_root(monkeypatch, work):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # another user than root, who owns the folders


def sticky_analysis(work, series):
    (work / "shared").mkdir()
    os.chmod(work / "shared", 0o1777 | stat.S_IRWXU)
    analysis(work, "shared/run")


def stop_at_the_model(monkeypatch, work):
    def load(*args, **kwargs):
        raise HeadscopeError("stopped where the model would load")
    monkeypatch.setattr(cli.loader, "load", load)


# ---------------------------------------------------------------- the table

@dataclass(frozen=True)
class Case:
    """`setup(work, series)` makes the user's files; `args` the command line ("{model}": the
    planted model folder, read only); `patch(monkeypatch, work)` a fault of the system."""

    id: str
    setup: Callable
    args: tuple
    exit_code: int
    message: str
    warning: Optional[str] = None
    patch: Optional[Callable] = None


def nothing(work, series):
    pass


KV_EVAL = ("kv-eval", "smollm2-135m", "duo", "--out", "eval")  # refused before the model would load
TIMELINE = ("timeline", "series", "--out", "tl", "--device", "cpu", "--detectors", "induction")
RAZOR = ("--rank-by", "razor")
UNVERIFIED_READS = [("report", "run", "--unverified"), ("compare", "run", "other", "--out", "cmp", "--unverified"),
                    ("kv-policy", "run", "--out", "pol", *RAZOR, "--unverified")]
UNVERIFIED = "run is damaged: it carries headscope's marker (.headscope) but no manifest.json"

CASES = [
    # --out / --into never is, holds or lies inside an input being read
    Case("kv-policy-out-is-the-analysis", lambda w, s: analysis(w), ("kv-policy", "run", "--out", "run", "--force", *RAZOR),
         1, "run is or holds run, which is being read"),
    Case("kv-policy-out-inside-the-analysis", lambda w, s: analysis(w), ("kv-policy", "run", "--out", "run/pol", *RAZOR),
         1, "run/pol lies inside run, which is being read"),
    Case("kv-policy-headkv-inside-the-analysis", lambda w, s: analysis(w),
         ("kv-policy", "run", "--out", "run/p.json", "--format", "headkv", *RAZOR), 1, "lies inside run"),
    Case("kv-eval-out-is-the-policy", lambda w, s: policy(w), (*KV_EVAL[:3], "--out", "duo", "--force"), 1,
         "duo is or holds duo, which is being read"),
    Case("kv-eval-out-inside-the-policy", lambda w, s: policy(w), (*KV_EVAL[:3], "--out", "duo/eval"), 1,
         "duo/eval lies inside duo"),
    Case("compare-out-inside-an-input", damaged(lambda f: None, keep_manifest=True),
         ("compare", "run", "other", "--out", "other/cmp"), 1, "other/cmp lies inside other"),
    Case("timeline-out-inside-the-series", checkpoints, ("timeline", "series", "--out", "series/tl", "--device", "cpu"),
         1, "series/tl lies inside series"),
    Case("geometry-out-inside-the-model", nothing, ("geometry", "{model}", "--out", "{model}/g"), 1, "lies inside"),
    Case("analyze-out-inside-the-model", nothing, ("analyze", "{model}", "--out", "{model}/run"), 1, "lies inside"),
    # --force replaces only what headscope wrote
    Case("kv-policy-force-over-users-file", users_file,
         ("kv-policy", "run", "--out", "user/p.json", "--format", "headkv", "--force", *RAZOR), 1,
         "user/p.json is not a file headscope wrote (or it was edited since); --force replaces only files"),
    Case("kv-policy-force-over-edited-policy", edited_headkv,
         ("kv-policy", "run", "--out", "p.json", "--format", "headkv", "--force", *RAZOR), 1,
         "p.json is not a file headscope wrote"),
    Case("kv-policy-headkv-out-is-a-folder", lambda w, s: (analysis(w), (w / "pol").mkdir()),
         ("kv-policy", "run", "--out", "pol", "--format", "headkv", "--force", *RAZOR), 1, "pol is a folder; name a file"),
    Case("kv-policy-out-is-a-symlink", lambda w, s: (users_file(w, s), os.symlink(w / "user" / "p.json", w / "link.json")),
         ("kv-policy", "run", "--out", "link.json", "--format", "headkv", "--force", *RAZOR), 1,
         "link.json is a symbolic link; name the file to write itself"),
    Case("kv-policy-duo-over-users-folder", lambda w, s: (analysis(w), (w / "pol").mkdir(), (w / "pol" / "a.txt").write_text("mine")),
         ("kv-policy", "run", "--out", "pol", "--force", *RAZOR), 1, "pol holds files headscope did not write"),
    # unwritable targets: refused before any work
    Case("kv-policy-headkv-read-only", lambda w, s: (analysis(w), locked(w)),
         ("kv-policy", "run", "--out", "locked/p.json", "--format", "headkv", *RAZOR), 1, "locked (permission denied)",
         patch=deny_writes_to("locked")),
    Case("report-read-only-folder", lambda w, s: analysis(w), ("report", "run"), 1,
         "cannot write to", patch=deny_writes_to("run")),
    Case("timeline-read-only", lambda w, s: (checkpoints(w, s), locked(w)),
         (*TIMELINE[:2], "--out", "locked/tl", "--device", "cpu"), 1, "locked (permission denied)",
         patch=deny_writes_to("locked")),
    Case("compare-read-only", lambda w, s: (analysis(w), analysis(w, "other"), locked(w)),
         ("compare", "run", "other", "--out", "locked/cmp"), 1, "locked (permission denied)",
         patch=deny_writes_to("locked")),
    Case("kv-eval-read-only", lambda w, s: (policy(w), locked(w)), (*KV_EVAL[:3], "--out", "locked/eval"), 1,
         "locked (permission denied)", patch=deny_writes_to("locked")),
    Case("geometry-into-read-only-subfolder", lambda w, s: (analysis(w), (w / "run" / "notes").mkdir()),
         ("geometry", "{model}", "--into", "run"), 1, "run/notes is read-only, so the old files could not be removed",
         patch=deny_writes_to("run/notes")),
    Case("geometry-into-sticky-folder-of-another-user", sticky_analysis, ("geometry", "{model}", "--into", "shared/run"),
         1, "cannot replace shared/run: shared is a sticky folder (as /tmp is) and neither it nor run is yours", patch=not_root),
    # a rename the system refuses: the old target stays, nothing temporary is left
    Case("report-rename-refused", lambda w, s: analysis(w), ("report", "run"), 1,
         "could not put run/index.html in place (Permission denied); it was left as it was", patch=refuse_renames),
    Case("kv-policy-headkv-rename-refused", lambda w, s: analysis(w),
         ("kv-policy", "run", "--out", "p.json", "--format", "headkv", *RAZOR), 1, "could not put p.json in place",
         patch=refuse_renames),
    Case("kv-policy-duo-replace-refused", lambda w, s: (analysis(w), policy(w, "pol")),
         ("kv-policy", "run", "--out", "pol", "--force", *RAZOR), 1, "could not put pol in place", patch=refuse_renames),
    Case("compare-rename-refused", lambda w, s: (analysis(w), analysis(w, "other")),
         ("compare", "run", "other", "--out", "deep/cmp"), 1, "could not put deep/cmp in place", patch=refuse_renames),
    # analysis folders: a marker without a manifest is damage; symlinks; shape and numbers whatever the manifest
    *[Case(f"{args[0]}-marker-without-manifest", damaged(lambda f: None), args[:-1], 1,
           f"{UNVERIFIED}, so its files cannot be checked; write it again with headscope, or pass --unverified")
      for args in UNVERIFIED_READS],
    Case("geometry-into-marker-without-manifest", damaged(lambda f: None), ("geometry", "{model}", "--into", "run"), 1,
         UNVERIFIED),
    *[Case(f"{args[0]}-symlinked-scores", damaged(symlinked_scores, keep_manifest=True), args, 1,
           "run/scores.csv is a symbolic link (to ") for args in UNVERIFIED_READS],
    Case("manifest-without-scores", damaged(lambda f: (f / MANIFEST).write_text(json.dumps({"files": {}})), True),
         ("report", "run"), 1, "run is damaged: manifest.json does not list scores.csv"),
    *[Case(f"{args[0]}-unverified-{name}", damaged(edit), args, 1, message, warning=UNVERIFIED)
      for args in UNVERIFIED_READS for name, edit, message in [
          ("cut-mid-row", scores_lines(lambda lines: ["".join(lines)[:-7]]), "run/scores.csv is damaged: its last line is cut"),
          ("cut-at-a-line", scores_lines(lambda lines: lines[:-2]), "scores 5 of the 6 heads the others score"),
          ("labels-cut", lambda f: (f / "labels.csv").write_text("".join((f / "labels.csv").read_text().splitlines(True)[:4])),
           "run/labels.csv is damaged: labels.csv lists 3 heads, scores.csv scores 6"),
          ("score-nan", set_score("nan"), "run/scores.csv is damaged: the score of head 0.0 (duplicate_token) is NaN beside a finite CI"),
          ("score-inf", set_score("-inf"), "run/scores.csv is damaged: a score is infinite"),
          ("score-text", set_score("high"), "its score column holds text where numbers belong"),
          ("detector-deleted", scores_lines(lambda lines: [l for l in lines if ",sink," not in l]),
           "it has no rows for detector 'sink', which meta.json lists"),
          ("row-twice", scores_lines(lambda lines: lines + lines[1:2]), "scores a head twice"),
          ("extra-field", scores_lines(lambda lines: lines[:2] + [lines[2].rstrip("\n") + ",9\n"] + lines[3:]),
           "run/scores.csv is damaged: line 3 has 11 fields, the header 10"),
          ("layer-outside", scores_lines(lambda lines: lines[:1] + ["7" + lines[1][1:]] + lines[2:]), "a layer outside 0-1"),
          ("examples-of-another-grid", examples_of_another_grid, "examples.json is damaged: example text #0 holds maps of 3 x 3 heads, meta.json says 2 x 3"),
      ]],
    # policy files: every field, one line naming the file and the field (kv-eval reads them before the model loads)
    Case("tsv-nan", their_policy("0.9\n0.2\tnan\n"), KV_EVAL, 1, "duo/full_attention_heads.tsv: line 2, column 2 is 'nan'"),
    Case("tsv-text", their_policy("0.9\nhigh\n"), KV_EVAL, 1, "line 2, column 1 is 'high'; expected a finite number"),
    Case("tsv-ragged", their_policy("0.9\t0.1\n0.2\n"), KV_EVAL, 1, "line 2 has 1 values, line 1 has 2"),
    Case("tsv-extra-column", their_policy("0.9\t0.5\n0.2\t0.5\n"), KV_EVAL, 1,
         "duo/full_attention_heads.tsv has 2 values per row (one per key/value head), which the 3 query heads "
         "duo/config.json gives (n_heads) cannot share evenly"),
    Case("tsv-empty", their_policy("\n"), KV_EVAL, 1, "holds no values; expected one line per layer"),
    Case("tsv-cut-in-headscope-folder", lambda w, s: (policy(w) / DUO_TSV).write_text((w / "duo" / DUO_TSV).read_text()[:-3]),
         KV_EVAL, 1, "does not end with a line break, so its last row may be cut (headscope ends every row with one)"),
    Case("config-truncated", edited_config(lambda t: t[: len(t) // 2]), KV_EVAL, 1,
         "cannot read duo/config.json as JSON (cut or edited?)"),
    Case("config-a-list", edited_config(lambda t: "[1, 2]"), KV_EVAL, 1, "duo/config.json holds a JSON list; expected an object"),
    Case("config-sink-text", config_field(sink_size="sixteen"), KV_EVAL, 1,
         "duo/config.json: sink_size is 'sixteen'; expected a whole number >= 0"),
    Case("config-recent-zero", config_field(recent_size=0), KV_EVAL, 1, "recent_size is 0; expected a whole number >= 1"),
    Case("config-recent-bool", config_field(recent_size=True), KV_EVAL, 1, "recent_size is True; expected a whole number"),
    Case("config-fraction-above-one", config_field(full_fraction=1.5), KV_EVAL, 1,
         "full_fraction is 1.5; expected a number in (0, 1]"),
    Case("config-heads-zero", config_field(n_heads=0), KV_EVAL, 1, "n_heads is 0; expected a whole number >= 1"),
    Case("config-model-number", config_field(model=5), KV_EVAL, 1, "model is 5; expected a string"),
    Case("headkv-above-one", headkv('{"0-0": [1.5], "0-1": [0.2]}'), (*KV_EVAL[:2], "p.json", "--keep", "0.5", "--out", "eval"),
         1, "p.json: the scores of '0-0' average 1.5; expected a finite value in [0, 1] (HeadKV's reader does not clip"),
    Case("headkv-nan", headkv('{"0-0": [NaN], "0-1": [0.2]}'), (*KV_EVAL[:2], "p.json", "--keep", "0.5", "--out", "eval"),
         1, "the scores of '0-0' average nan"),
    Case("headkv-bool", headkv('{"0-0": [true], "0-1": [0.2]}'), (*KV_EVAL[:2], "p.json", "--keep", "0.5", "--out", "eval"),
         1, "the scores of '0-0' are not a list of numbers"),
    Case("headkv-head-twice", headkv('{"0-0": [0.1], "00-0": [0.2]}'), (*KV_EVAL[:2], "p.json", "--keep", "0.5", "--out", "eval"),
         1, "p.json: head '00-0' appears twice"),
    Case("headkv-cut", headkv('{"0-0": [0.1], "0-1": [0.'), (*KV_EVAL[:2], "p.json", "--keep", "0.5", "--out", "eval"),
         1, "cannot read p.json as JSON (cut or edited?)"),
    # checkpoint files (timeline): each named with its field
    Case("checkpoint-config-truncated", in_checkpoint(edit_json("config.json", lambda t: t[:200])), TIMELINE, 1,
         "cannot read series/checkpoint-8/config.json as JSON (cut or edited?)"),
    Case("checkpoint-config-a-list", in_checkpoint(edit_json("config.json", lambda t: "[]")), TIMELINE, 1,
         "series/checkpoint-8/config.json holds a JSON list; expected an object"),
    Case("checkpoint-width-text", in_checkpoint(edit_json("config.json", lambda t: t.replace('"hidden_size": 64', '"hidden_size": "wide"'))),
         TIMELINE, 1, "series/checkpoint-8/config.json: hidden_size is 'wide'; expected a whole number >= 1"),
    Case("checkpoint-heads-zero", in_checkpoint(edit_json("config.json", lambda t: t.replace('"num_attention_heads": 4', '"num_attention_heads": 0'))),
         TIMELINE, 1, "config.json: num_attention_heads is 0; expected a whole number >= 1"),
    Case("checkpoint-other-field-text", in_checkpoint(edit_json("config.json", lambda t: t.replace('"intermediate_size": 256', '"intermediate_size": "big"'))),
         TIMELINE, 1, "could not load a model from series/checkpoint-8: Validation error for field 'intermediate_size': "
                      "TypeError: Field 'intermediate_size' expected int, got str (value: 'big')"),
    Case("checkpoint-state-truncated", in_checkpoint(edit_json("trainer_state.json", lambda t: t[:20])), TIMELINE, 1,
         "cannot read series/checkpoint-8/trainer_state.json as JSON (cut or edited?)"),
    Case("checkpoint-step-text", in_checkpoint(edit_json("trainer_state.json", lambda t: t.replace('"global_step": 8', '"global_step": "eight"'))),
         TIMELINE, 1, "series/checkpoint-8/trainer_state.json: global_step is 'eight'; expected a whole number >= 0"),
    Case("checkpoint-loss-text", in_checkpoint(edit_json("trainer_state.json", lambda t: t.replace('"loss": 3.5', '"loss": "low"'))),
         TIMELINE, 1, "trainer_state.json: log_history entry 0 has step 8 and loss 'low'; expected a whole number and a number"),
    Case("checkpoint-weights-cut", in_checkpoint(cut_weights), TIMELINE, 1,
         "could not load a model from series/checkpoint-8: "),
    Case("checkpoint-weight-wrong-shape", in_checkpoint(wrong_shape), TIMELINE, 1,
         "the weights of series/checkpoint-8 do not match its config: model.layers.0.self_attn.q_proj.weight is 63 x 64 "
         "in the weights file, 64 x 64 in the model config.json describes"),
    # warnings: accepted, and said in one line
    Case("tsv-out-of-range-is-clipped-with-a-warning", their_policy("1.5\n-0.5\n"), KV_EVAL, 1,
         "stopped where the model would load", patch=stop_at_the_model,
         warning="duo/full_attention_heads.tsv: 2 value(s) lie outside [0, 1] (from -0.5 to 1.5); clipped to [0, 1], "
                 "as DuoAttention reads them"),
    Case("tsv-without-final-line-break-is-said", their_policy("0.9\n0.2"), KV_EVAL, 1, "stopped where the model would load",
         patch=stop_at_the_model, warning="does not end with a line break, so its last row may be cut; read as it is"),
]

USAGE = [  # every command: a value out of range, an unknown name or a malformed list exits 2
    ("analyze", ("--control", "shuffled"), "--control must be one of"),
    ("analyze", ("--device", "tpu"), "unknown device 'tpu'"),
    ("analyze", ("--dtype", "float8"), "unknown dtype 'float8'"),
    ("analyze", ("--device-map", "{oops"), "--device-map must be auto"),
    ("analyze", ("--sites", "bogus"), "has no 'bogus' attention sites"),
    ("analyze", ("--geometry", "--sites", "decoder.self"), "--geometry works on the default sites only"),
    ("analyze", ("--seq-len", "4000"), "takes at most"),
    ("analyze", ("--n-sentences", "-2"), "--n-sentences must be an integer of at least 0, got -2"),
    ("verify", ("--tolerance", "inf"), "--tolerance must be a positive number"),
    ("verify", ("--sites", "bogus"), "has no 'bogus' attention sites"),
    ("report", ("--plotlyjs", "inline"), "--plotlyjs must be embed or cdn"),
    ("compare", ("--plotlyjs", "inline"), "--plotlyjs must be embed or cdn"),
    ("geometry", ("--seq-len", "1"), "--seq-len must be an integer of at least 2, got 1"),
    ("geometry", ("--plotlyjs", "inline"), "--plotlyjs must be embed or cdn"),
    ("timeline", ("--detectors", "bogus"), "unknown detector 'bogus'"),
    ("timeline", ("--device", "tpu"), "unknown device 'tpu'"),
    ("kv-policy", ("--keep", "1.5"), "in (0, 1]; got 1.5"),
    ("kv-policy", ("--format", "unknown"), "--format must be one of duo, headkv"),
    ("kv-policy", ("--rank-by", "bogus"), "unknown ranking 'bogus'"),
    ("kv-policy", ("--sink", "-1"), "sink must be an integer of at least 0"),
    ("kv-eval", ("--lengths", "4k"), "--lengths takes comma-separated numbers"),
    ("kv-eval", ("--keeps", "0.2,1.5"), "in (0, 1]; got 1.5"),
    ("kv-eval", ("--random", "0"), "--random must be an integer of at least 1, got 0"),
    ("kv-eval", ("--needles", "0"), "--needles must be an integer of at least 1, got 0"),
    ("kv-eval", ("--keep", "2"), "in (0, 1]; got 2"),
    ("kv-eval-headkv", (), "is a HeadKV file, which holds scores only; pass keep (--keep)"),
    ("detectors", ("--detectors", "bogus"), "unknown detector 'bogus'"),
]


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> Path:
    """checkpoint-4 and checkpoint-8 of a 1-layer Llama trained on token ids (no tokenizer files),
    each with the trainer_state.json a Trainer writes."""
    root = tmp_path_factory.mktemp("series")
    for step in (4, 8):
        torch.manual_seed(step)
        tiny_llama(1).save_pretrained(root / f"checkpoint-{step}")
        state = {"global_step": step, "log_history": [{"step": step, "loss": 3.5}]}
        (root / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return root


def run_case(case: Case, work: Path, series: Path, planted_dir: Path, monkeypatch):
    case.setup(work, series)
    before = snapshot(work)
    monkeypatch.chdir(work)
    if case.patch is not None:
        case.patch(monkeypatch, work)
    args = [a.replace("{model}", str(planted_dir)) for a in case.args]
    result = CliRunner().invoke(app, args)
    monkeypatch.undo()  # os.access, os.replace, ... as they were before the files are compared
    return result, before


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_fault_is_one_line_naming_the_file_and_leaves_the_users_files_alone(case, series, planted_dir, tmp_path,
                                                                              monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    result, before = run_case(case, work, series, planted_dir, monkeypatch)
    lines = result.output.splitlines()
    assert result.exit_code == case.exit_code, result.output
    assert isinstance(result.exception, SystemExit), f"an exception escaped: {result.exception!r}"
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and case.message in errors[0], result.output  # one line says what is wrong
    warned = [line for line in lines if line.startswith("warning: ")]
    if case.warning:
        assert len(warned) == 1 and case.warning in warned[0], result.output  # accepted, and said in one line
    else:
        assert warned == [], result.output
    assert snapshot(work) == before, "the user's files changed, or something was left behind"


@pytest.mark.parametrize("command, extra, message", USAGE, ids=[f"{c}-{'-'.join(e)}" for c, e, _ in USAGE])
def test_every_usage_error_exits_2(command, extra, message, planted_dir, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    analysis(work)
    write_duo(policy_from_values(np.linspace(0, 1, 2 * N_HEADS).reshape(2, N_HEADS), 0.5, N_HEADS, 4, 16), work / "fits")
    (work / "p.json").write_text('{"0-0": [0.5], "0-1": [0.2], "0-2": [0.1]}')
    base = {
        "analyze": ("analyze", str(planted_dir), "--out", "out", "--device", "cpu", "--n-examples", "2",
                    "--seq-len", "16", "--detectors", "previous_token"),
        "verify": ("verify", str(planted_dir)),
        "report": ("report", "run"),
        "compare": ("compare", "run", "run", "--out", "cmp"),
        "geometry": ("geometry", str(planted_dir), "--out", "g", "--device", "cpu"),
        "timeline": ("timeline", str(planted_dir), "--out", "tl"),
        "kv-policy": ("kv-policy", "run", "--out", "pol", *RAZOR),
        "kv-eval": ("kv-eval", str(planted_dir), "fits", "--out", "eval", "--lengths", "40"),
        "kv-eval-headkv": ("kv-eval", str(planted_dir), "p.json", "--out", "eval"),
        "detectors": ("detectors",),
    }[command]
    before = snapshot(work)
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, [*base, *extra])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output, result.output
    assert snapshot(work) == before


# ---------------------------------------------------------------- what is accepted, and said

def test_unverified_reads_a_folder_without_its_manifest_with_a_warning(tmp_path, monkeypatch):
    folder = analysis(tmp_path)
    (folder / MANIFEST).unlink()
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["report", "run", "--unverified"])
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("warning: ")] == [
        f"warning: {UNVERIFIED}, so its files cannot be checked; read anyway (--unverified): only the shape of its "
        f"tables is checked"]
    after = snapshot(tmp_path)
    changed = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    assert changed == ["run/index.html"]  # the page re-rendered; the data files untouched, nothing left over


def test_force_replaces_a_headkv_file_headscope_wrote(tmp_path):
    folder = analysis(tmp_path)
    out = tmp_path / "p.json"
    for attempt in range(2):
        result = CliRunner().invoke(app, ["kv-policy", str(folder), "--out", str(out), "--format", "headkv", *RAZOR,
                                          "--keep", "0.5" if attempt else "0.25", "--force"])
        assert result.exit_code == 0, result.output
        assert written_by_headscope(out.read_bytes())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "run"]  # no temporary file left
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_a_headkv_file_is_recognised_only_in_headscopes_own_layout(tmp_path):
    path = write_headkv(policy_from_values(np.array([[0.9], [0.2]]), 0.5, 3, 4, 16), tmp_path / "p.json")
    data = path.read_bytes()
    assert written_by_headscope(data)
    assert not written_by_headscope(json.dumps(json.loads(data)).encode())  # re-laid out: not recognised
    assert not written_by_headscope(b'{\n"0-0": [\n1\n]\n}')  # an integer: not what headscope writes
    assert not written_by_headscope(b'{\n"notes": "mine"\n}') and not written_by_headscope(b"\xff")
    assert not written_by_headscope(data.replace(b'"1-', b'"2-', 1))  # a grid with a hole


def test_clipping_is_a_warning_in_the_api_too(tmp_path):
    their_policy("1.5\n-0.5\n")(tmp_path, None)
    with pytest.warns(HeadscopeWarning, match="2 value"):
        assert read_duo(tmp_path / "duo").values.tolist() == [[1.0], [0.0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_duo(policy(tmp_path, "ours"))  # a file in range: no warning


def test_a_usage_error_is_a_headscope_error():
    assert issubclass(UsageError, HeadscopeError)


# ---------------------------------------------------------------- the rule, on its own

@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_failure_inside_the_block_leaves_nothing_not_even_made_parents(kind, tmp_path):
    target = tmp_path / "a" / "b" / ("out" if kind == "folder" else "out.json")
    guard = atomic_dir(target) if kind == "folder" else atomic_file(target)
    with pytest.raises(RuntimeError):
        with guard as tmp:
            (tmp / "x").write_text("half") if kind == "folder" else tmp.write_text("half")
            raise RuntimeError("a fault while writing")
    assert list(tmp_path.iterdir()) == []


def test_a_replace_refused_halfway_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "pol"
    with atomic_dir(target) as tmp:
        (tmp / "old.txt").write_text("old")
    before = snapshot(tmp_path)
    real = os.replace

    def second_fails(src, dst):
        if ".tmp-" in Path(src).name:
            raise OSError(18, "Invalid cross-device link")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(HeadscopeError, match="could not put .*pol in place \\(Invalid cross-device link\\)"):
        with atomic_dir(target, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
    monkeypatch.undo()
    assert snapshot(tmp_path) == before and (target / MARKER).is_file()
