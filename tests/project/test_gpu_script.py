"""benchmarks/gpu.sh, the prepared device check, runs its steps on the CPU path with --dry-run
(so it is ready when a GPU is lent) and writes every result under one folder."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"


def test_an_unknown_argument_is_refused_in_one_line(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--bogus" in result.stderr


@pytest.mark.slow
def test_the_dry_run_passes_every_step(tmp_path):
    out = tmp_path / "gpu"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True,
                            env=env, timeout=600)
    summary = (out / "summary.txt").read_text()
    assert result.returncode == 0, summary + (out / "log.txt").read_text()[-3000:]
    steps = [line.split()[0] for line in summary.splitlines() if " rc=" in line]
    assert steps == ["env", "tests", "verify", "analyze", "rows", "parts", "patched"]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [(r["tokens"], r["batch"]) for r in rows] == [(128, 2), (256, 1)]
    assert all(r["lse_kernels"] == ["cpu-flash"] and r["lazy"]["seconds"] > 0 for r in rows)
    parts = [json.loads(line) for line in (out / "parts.jsonl").read_text().splitlines()]
    assert [(r["tokens"], r["batch"]) for r in parts] == [(128, 2), (256, 1)]
    assert all(r["kernel"] == "cpu-flash" and set(r["over_sdpa"]) == {"z_lse", "entropy", "reads"} for r in parts)
    patched = json.loads((out / "patched.json").read_text())
    assert patched["device"] == "cpu" and [run["kept"] for run in patched["runs"]] == [0.001]
    assert patched["runs"][0]["columns"] > 0 and np.isfinite(patched["runs"][0]["metric_columns"])
    # two circuits a pass: the first one's metric is its own run's
    assert patched["runs"][0]["metric_side_by_side"] == pytest.approx(patched["runs"][0]["metric_columns"], abs=1e-5)
    meta = json.loads((out / "analyze-meta.json").read_text())
    assert meta["dtype"] == "float32" and {p["lse"] for p in meta["probes"].values()} == {"cpu-flash"}
