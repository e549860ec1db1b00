"""Ctrl-C at any moment of `headscope analyze`, from its imports to the writing: exit status
130, one line saying so, no traceback or crash, and no folder or temporary folder left (slow:
each try is a fresh process). The first ~50 ms, before Python runs any of headscope's code, are
Python's own: an interrupt there gets Python's traceback."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("after", [0.15, 0.4, 1.0, 1.5, 4.0])
def test_ctrl_c_at_any_moment_exits_130_in_one_line(planted_path, tmp_path, after):
    out = tmp_path / "reports" / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "headscope", "analyze", planted_path, "--out", str(out),
                             "--n-examples", "8", "--seq-len", "40", "--repeat-len", "10", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)
    if proc.returncode == 0:
        pytest.skip(f"the run finished within {after} s, before the interrupt")
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Segmentation" not in stderr and "Aborted" not in stderr, stderr
    said = [line for line in stderr.splitlines() if "interrupted" in line]
    assert len(said) == 1 and "nothing was written" in said[0], stderr
    assert not out.exists()
    leftovers = [p for p in (tmp_path / "reports").glob(".*")] if (tmp_path / "reports").exists() else []
    assert leftovers == []


def test_sigterm_in_a_command_exits_143_through_the_entry_handler(planted_path, tmp_path):
    """The command's own SIGTERM handling (for CliRunner and embedding programs) steps aside for
    the entry point's, so SIGTERM ends a command line run with 143 as the README says."""
    out = tmp_path / "reports" / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "headscope", "analyze", planted_path, "--out", str(out),
                             "--n-examples", "8", "--seq-len", "40", "--repeat-len", "10", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal")
    assert proc.returncode == 143, stderr
    said = [line for line in stderr.splitlines() if "terminated" in line]
    assert len(said) == 1 and "nothing was written" in said[0] and "Traceback" not in stderr, stderr
    assert not out.exists()


@pytest.mark.parametrize("env, prefix", [({"RANK": "1", "WORLD_SIZE": "2"}, "headscope: rank 1: terminated"),
                                         ({}, "headscope: terminated")])
def test_the_interrupt_line_names_the_torchrun_rank(env, prefix):
    """torchrun stops every process of a group at once: each one's line says which rank it is."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    code = "import signal; from headscope import atomic; atomic._interrupted(signal.SIGTERM)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(base, PYTHONPATH=str(ROOT), **env), timeout=60)
    assert done.returncode == 143
    assert done.stderr.splitlines() == [f"{prefix}; nothing was written"]
