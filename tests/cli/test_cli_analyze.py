"""`headscope analyze`, `report`, `compare`, `detectors` end to end on the planted tiny model."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from pathlib import Path
from typer.testing import CliRunner

from headscope.analysis import Analysis
from headscope.cli import app
from headscope.detectors import REGISTRY

ARGS = ["--n-examples", "4", "--seq-len", "40", "--device", "cpu"]


@pytest.fixture(scope="module")
def analyzed(planted_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "planted"
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS,
                                      "--detectors", "previous_token,sink,uniform,self"])
    assert result.exit_code == 0, result.output
    return out, result


def _leftovers(folder):
    return [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_analyze_writes_analysis_and_report(analyzed):
    out, result = analyzed
    assert {p.name for p in out.iterdir()} == {"scores.csv", "labels.csv", "meta.json", "examples.json", "ov.csv",
                                               "index.html", ".headscope", "manifest.json"}
    analysis = Analysis.load(out)
    assert set(analysis.detectors) == {"previous_token", "sink", "uniform", "self"}
    assert analysis.labels.set_index(["layer", "head"]).label[(0, 0)] == "previous_token"
    scores = analysis.scores.set_index(["layer", "head", "detector"])
    planted = scores.loc[(0, 0, "previous_token")]
    # The same quantity and numbers as the report's top-heads table: score, then the control's score.
    line = next(line for line in result.stdout.splitlines() if line.strip().startswith("previous_token"))
    assert f"attention mass: 0.0 {planted.score:.3f} (control {planted.control:.3f})" in line
    assert analysis.meta["control"]["kind"] == "random-init" and "control: random-init twin" in result.stdout
    assert f"report: {out / 'index.html'}" in result.stdout
    assert _leftovers(out) == []


def test_summary_says_when_there_was_no_control_and_a_detector_was_skipped(capsys, tmp_path):
    from tests.support.fake_analysis import fake_analysis
    from headscope.cli.analysis import _summary
    from headscope.report.data import top_heads

    skipped = "syntactic detector skipped: no relation has at least 30 scored arcs in each half of the sentences"
    analysis = fake_analysis(with_syntax=False, control=False)
    analysis.meta["syntax_notes"] = [skipped]
    _summary(analysis, tmp_path)
    out = capsys.readouterr().out
    assert "control: none (none was asked for)" in out
    assert "warning: No control model (none was asked for)" in out and f"warning: {skipped}" in out
    top = [t for t in top_heads(analysis, 3) if t.label == "induction"]
    line = next(line for line in out.splitlines() if line.strip().startswith("induction"))
    assert line.endswith("attention mass: " + ", ".join(f"{t.layer}.{t.head} {t.score:.3f}" for t in top))
    assert "(control" not in out


def test_summary_names_each_labels_quantity_and_the_control(capsys, tmp_path):
    from tests.support.fake_analysis import fake_analysis
    from headscope.cli.analysis import _summary

    analysis = fake_analysis()
    _summary(analysis, tmp_path)
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    head = analysis.heads_with("syntactic:obj").iloc[0]
    row = analysis.scores.set_index(["layer", "head", "detector"]).loc[(head["layer"], head["head"], "syntactic")]
    assert lines["syntactic:obj"].endswith(
        f"held-out margin over the baseline: {head['layer']}.{head['head']} {row.score:.3f} (control {row.control:.3f})")
    assert "clearest detector's score: " in lines["mixed"] and "warning" not in "".join(lines.values())


def test_existing_output_needs_force(analyzed, planted_path):
    out, _ = analyzed
    before = (out / "scores.csv").read_text()
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS])
    assert result.exit_code == 1 and "already exists; pass --force" in result.output
    assert (out / "scores.csv").read_text() == before


def test_force_replaces(analyzed, planted_path, tmp_path):
    out = tmp_path / "again"
    for _ in range(2):
        result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS, "--force",
                                          "--detectors", "sink", "--plotlyjs", "cdn"])
        assert result.exit_code == 0, result.output
    assert (out / "index.html").stat().st_size < 3_000_000 and _leftovers(out) == []


@pytest.mark.parametrize("extra,message", [
    (["--detectors", "previous_token,copy_suppression"], "unknown detector 'copy_suppression'; detectors:"),
    (["--n-examples", "0"], "n_examples must be an integer of at least 1"),
    (["--seq-len", "4000"], "takes at most 48"),
    (["--device", "tpu"], "unknown device"),
    (["--plotlyjs", "inline"], "--plotlyjs must be embed or cdn"),
])
def test_bad_input_is_one_line_and_writes_nothing(planted_path, tmp_path, extra, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS, *extra])
    assert result.exit_code == 2  # each a usage error: an unknown name or a number out of range
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_interrupt_while_writing_leaves_nothing(planted_path, tmp_path, monkeypatch):
    import headscope.report as report

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report_into", interrupted)
    out = tmp_path / "half"
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS, "--detectors", "sink"])
    assert result.exit_code == 130 and "interrupted" in result.output
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_a_real_process(planted_path, tmp_path):
    out = tmp_path / "sigint"
    # 40 examples of every probe and the control's: many seconds of batches to interrupt
    proc = subprocess.Popen([sys.executable, "-m", "headscope", "analyze", planted_path, "--out", str(out), *ARGS,
                             "--n-examples", "40", "--repeat-len", "10"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    computing, seen = threading.Event(), []

    def read_stderr():  # drains stderr to the end; the first progress bar means batches are running
        for char in iter(lambda: proc.stderr.read(1), ""):
            seen.append(char)
            if not computing.is_set() and "".join(seen[-32:]).endswith("probe "):
                computing.set()
        computing.set()  # the process ended first: the assertions below say how

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert computing.wait(timeout=120), "no progress bar within 120 s"
    err = "".join(seen)
    assert err.startswith("loading"), err  # "loading ..." is printed inside the command
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    proc.stdout.close()
    err = "".join(seen)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_report_rerenders_without_a_model(analyzed, tmp_path):
    out, _ = analyzed
    page = (out / "index.html").read_bytes()
    (out / "index.html").unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "index.html").read_bytes() == page  # deterministic for the same analysis
    bad = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert bad.exit_code == 1 and "is not a headscope analysis" in bad.output


def test_compare_and_detectors(analyzed, planted_path, tmp_path):
    out, _ = analyzed
    other = tmp_path / "other"
    assert CliRunner().invoke(app, ["analyze", planted_path, "--out", str(other), *ARGS, "--seed", "1",
                                    "--detectors", "previous_token,sink,uniform,self"]).exit_code == 0
    result = CliRunner().invoke(app, ["compare", str(out), str(other), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cmp" / "index.html").exists()
    listing = CliRunner().invoke(app, ["detectors"])
    assert listing.exit_code == 0
    for name in ("induction", "previous_token", "sink", "uniform", "duplicate_token", "self", "next_token"):
        assert name in listing.stdout
    opt_in = [line.split("--detectors ")[1].rstrip(")") for line in listing.stdout.splitlines() if "opt-in:" in line]
    assert opt_in == [name for name, det in REGISTRY.items() if det.opt_in] and "retrieval" in opt_in


def test_help_is_fast_and_lists_commands():
    out = subprocess.run([sys.executable, "-m", "headscope", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("analyze", "report", "compare", "models", "detectors", "verify"):
        assert command in out.stdout


def test_treebank_option_and_bad_treebank(planted_path, tmp_path, monkeypatch):
    import headscope.probes.treebank
    import headscope.probes.conllu
    from headscope.probes.conllu import read_conllu

    # The planted model takes 48 characters: the short grammar sentences fit.
    sample = tmp_path / "mine.conllu"
    lines = []
    for s in read_conllu(Path(__file__).resolve().parents[2] / "tools" / "grammar" / "generated.conllu")[:300]:
        lines.append(f"# sent_id = {s.sent_id}")
        for i, (w, h, r) in enumerate(zip(s.words, s.heads, s.relations), 1):
            lines.append(f"{i}\t{w}\t{w.lower()}\t_\t_\t_\t{h}\t{r}\t_\t_")
        lines.append("")
    sample.write_text("\n".join(lines) + "\n")
    out = tmp_path / "syn"
    reads = []

    def counted(path):
        reads.append(path)
        return read_conllu(path)

    monkeypatch.setattr(headscope.probes.conllu, "read_conllu", counted)
    monkeypatch.setattr(headscope.probes.treebank, "read_conllu", counted)
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS, "--repeat-len", "10",
                                      "--treebank", str(sample), "--n-sentences", "0"])
    assert result.exit_code == 0, result.output
    assert reads == [sample]  # read once, before the model loads
    analysis = Analysis.load(out)
    assert analysis.syntax is not None and "syntactic" in set(analysis.scores.detector)
    assert analysis.meta["treebank"]["source"] == str(sample)
    broken = tmp_path / "broken.conllu"
    broken.write_text("# sent_id = x\n1\tThe\tthe\tDET\n")
    bad = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(tmp_path / "never"), "--treebank", str(broken)])
    assert bad.exit_code == 1 and "broken.conllu" in bad.output and "line 2" in bad.output
    assert not (tmp_path / "never").exists()


def test_validate_flag_writes_the_causal_check(planted_path, tmp_path):
    out = tmp_path / "validated"
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS, "--repeat-len", "10",
                                      "--detectors", "previous_token,induction,sink", "--validate"])
    assert result.exit_code == 0, result.output
    analysis = Analysis.load(out)
    table = analysis.validation
    induction = table[(table.label == "induction") & table.primary]
    assert induction.hurts_more.all() and induction.heads.tolist() == ["1.0"]
    from headscope.report import report_data

    assert report_data(analysis).validation is not None


def test_open_flag_opens_the_report(analyzed, monkeypatch):
    import webbrowser

    out, _ = analyzed
    opened = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url))
    result = CliRunner().invoke(app, ["report", str(out), "--open"])
    assert result.exit_code == 0, result.output
    assert opened == [(out / "index.html").resolve().as_uri()]


def test_control_option(planted_path, tmp_path):
    out = tmp_path / "nocontrol"
    result = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(out), *ARGS, "--repeat-len", "10",
                                      "--detectors", "previous_token", "--control", "none"])
    assert result.exit_code == 0, result.output
    analysis = Analysis.load(out)
    assert analysis.meta["control"]["kind"] == "none" and analysis.scores.control.isna().all()
    assert "control: none" in result.output
    bad = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(tmp_path / "bad"), "--control", "shuffled"])
    assert bad.exit_code == 2 and "--control must be one of random-init, none" in bad.output
    assert not (tmp_path / "bad").exists()
