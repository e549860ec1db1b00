"""Write the golden analyses of the two bundled models: `python tests/support/golden/regenerate.py`.

Runs `headscope analyze MODEL` with its defaults and keeps the three tables that carry every
number and label (scores, labels, syntax), floats rounded to 7 significant digits.

On x86-64 both runs use the same vector instruction set (AVX2) in torch's own kernels and in
MKL and oneDNN, whatever the machine offers: the syntactic detector counts argmax agreements,
and float rounding that differs by instruction set flips the few near-tied arcs (measured on
all-MiniLM-L6-v2: 5 of 13,008 syntax accuracies moved by one arc between an AVX-512 machine
and the one that wrote the tables, the same under transformers 5.22 to 5.24).
tests/project/test_golden.py runs the same command and compares under the rule of
tests/support/golden/compare.py, which lets those counts differ by one arc, since the pin does not
settle every tie: another vendor's AVX2 still breaks a few the other way (measured: 6 of 32,832
cells of all-MiniLM-L6-v2's syntax table on an AMD EPYC machine, 4 on an Intel machine's default
AVX-512 kernels). HEADSCOPE_GOLDEN_KERNELS=default leaves the machine's own kernels in place.
Regenerate only on purpose, and say in the commit which change moved the numbers.
"""
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
MODELS = ("minilm-l6", "smollm2-135m")
TABLES = ("scores.csv", "labels.csv", "syntax.csv")


# The instruction set pinned on x86-64 (module docstring).
SAME_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def run_analyze(model: str, out: Path) -> subprocess.CompletedProcess:
    """`headscope analyze MODEL --out OUT` with every other option at its default, on CPU."""
    env = dict(os.environ)
    pinned = os.environ.get("HEADSCOPE_GOLDEN_KERNELS", "avx2") != "default"
    if pinned and platform.machine().lower() in ("x86_64", "amd64"):
        env.update(SAME_KERNELS)
    return subprocess.run([sys.executable, "-m", "headscope", "analyze", model, "--out", str(out),
                           "--device", "cpu"], capture_output=True, text=True, timeout=1200, env=env)


def main() -> None:
    for model in MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / model
            result = run_analyze(model, out)
            if result.returncode != 0:
                sys.exit(result.stderr[-2000:])
            (HERE / model).mkdir(exist_ok=True)
            for table in TABLES:
                pd.read_csv(out / table).to_csv(HERE / model / table, index=False, float_format="%.7g")
        print(f"wrote {HERE / model}")


if __name__ == "__main__":
    main()
