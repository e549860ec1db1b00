"""Two `headscope analyze --out conc` started together, as real processes (slow): one writes the
folder, the other exits 1 in one line without replacing it, and no temporary folder is left.
The same rule at the folder level, fast, is in test_cli_faults.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from headscope.analysis import Analysis

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_two_runs_into_one_folder_never_both_write(planted_path, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "headscope", "analyze", planted_path, "--out", "conc", "--device", "cpu",
               "--detectors", "induction,duplicate_token", "--n-examples", "4", "--repeat-len", "8", "--repeats", "3",
               "--seq-len", "24", "--control", "none"]
    runs = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    done = [(run.wait(timeout=300), run.communicate()[1]) for run in runs]
    codes = sorted(code for code, _ in done)
    assert codes == [0, 1], done
    refused = next(stderr for code, stderr in done if code == 1)
    errors = [line for line in refused.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and ("appeared while this ran" in errors[0] or "already exists" in errors[0]), refused
    assert "Traceback" not in refused
    Analysis.load(tmp_path / "conc")  # the winner's folder is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conc"]  # no temporary folder left
