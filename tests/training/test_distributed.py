"""Timelines under torchrun: two gloo processes on the CPU score together, rank 0 alone writes (slow)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import headscope

pytestmark = pytest.mark.slow  # torchrun processes: 10-30 s each
WORKER = Path(__file__).with_name("ddp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _torchrun(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(WORKER),
                           *args], env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_two_gloo_processes_record_what_one_does(planted_path, planted, tmp_path):
    out = tmp_path / "two"
    _torchrun("record", planted_path, str(out))
    one = headscope.Timeline(control="random-init")
    one.record(planted.model, 0)
    pd.testing.assert_frame_equal(pd.read_csv(out / "timeline.csv"), one.scores, check_dtype=False)
    ranks = [json.loads((tmp_path / f"two-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["processes"] == ranks[1]["processes"] == 2  # the batches were dealt to both
    assert ranks[0]["summary"] == ranks[1]["summary"]  # gathered: every rank holds the same scores
    assert json.loads((out / "meta.json").read_text())["processes"] == 2


def test_a_ddp_trainer_with_the_callback_writes_one_timeline(tmp_path):
    out = tmp_path / "timeline"
    _torchrun("trainer", "-", str(out))
    scores = pd.read_csv(out / "timeline.csv")
    assert sorted(scores.step.unique()) == [0, 4, 8]
    assert not scores.duplicated(["step", "layer", "head", "detector"]).any()
    assert json.loads((out / "meta.json").read_text())["processes"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline", "timeline-run"]
