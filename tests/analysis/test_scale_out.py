"""Scale-out: probe batches split across torchrun processes (gloo) and models split with a device map."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import headscope
from headscope.cli import app
from headscope.analysis.analyze import analyze
from headscope.probes.kinds import RepeatedProbe, TextProbe, TreebankProbe

pytestmark = pytest.mark.slow  # torchrun processes and disk offload: 10-60 s a test
ARGS = ["--n-examples", "12", "--seq-len", "40", "--repeat-len", "10", "--batch-size", "2", "--device", "cpu"]
SPLIT = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.h.0": "cpu", "transformer.h.1": "disk",
         "transformer.ln_f": "cpu", "lm_head": "cpu"}


def _torchrun(*args, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "-m", "headscope", "analyze", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


def test_two_gloo_processes_match_one(planted_path, tmp_path):
    single = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(tmp_path / "one"), *ARGS])
    assert single.exit_code == 0, single.output
    proc = _torchrun(planted_path, "--out", str(tmp_path / "two"), *ARGS)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    for name in ("scores.csv", "labels.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "one" / name, keep_default_na=False),
                                      pd.read_csv(tmp_path / "two" / name, keep_default_na=False), check_exact=True)
    assert headscope.Analysis.load(tmp_path / "two").meta["processes"] == 2
    assert out.count("report:") == 1  # rank 0 alone writes and reports


def _rank_pids(parent: int, rank: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            stat = (proc / "stat").read_text().split()
        except OSError:
            continue
        if int(stat[3]) == parent and f"RANK={rank}".encode() in env:
            pids.append(int(proc.name))
    return pids


def test_a_dying_rank_leaves_no_report_and_is_named(planted_path, tmp_path):
    out = tmp_path / "died"
    proc = _torchrun(planted_path, "--out", str(out), *ARGS[:-2], "--n-examples", "600", "--batch-size", "1",
                     "--device", "cpu")
    deadline = time.time() + 120
    victims = []
    while time.time() < deadline and not victims:
        time.sleep(0.5)
        victims = _rank_pids(proc.pid, 1)
    assert victims, "rank 1 never started"
    time.sleep(4)  # let it load and start computing
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "rank      : 1" in output or "local_rank: 1" in output, output[-2000:]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_device_map_split_gives_the_same_scores(planted_path, tmp_path):
    kw = dict(probes=[TextProbe(4, 40), RepeatedProbe(4, 10, 4)])
    whole = analyze(headscope.load(planted_path, device="cpu"), **kw, control=None)
    split = headscope.load(planted_path, device_map=SPLIT, offload_folder=str(tmp_path / "offload"))
    assert split.model.hf_device_map["transformer.h.1"] == "disk"
    # A model spread over devices gets no random twin by default (it would need as much memory).
    assert "spread over devices" in analyze(split, **kw, detectors=["sink"]).meta["control"]["note"]
    parted = analyze(split, **kw, control=None)
    pd.testing.assert_frame_equal(whole.scores, parted.scores)
    pd.testing.assert_frame_equal(whole.labels, parted.labels)


def test_cli_device_map_and_bad_value(planted_path, tmp_path):
    good = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(tmp_path / "dm"), *ARGS[:-2],
                                    "--device-map", json.dumps(SPLIT)])
    assert good.exit_code == 0, good.output
    bad = CliRunner().invoke(app, ["analyze", planted_path, "--out", str(tmp_path / "bad"), "--device-map", "everywhere"])
    assert bad.exit_code == 2 and "--device-map must be" in bad.output  # a usage error
