"""Write the golden analyses of the two bundled models: `python tests/support/golden/regenerate.py`.

Runs `headscope analyze MODEL` with its defaults and keeps the three tables that carry every
number and label (scores, labels, syntax), floats rounded to 7 significant digits.
tests/project/test_golden.py runs the same command and compares. Regenerate only on purpose, and say in
the commit which change moved the numbers.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
MODELS = ("minilm-l6", "smollm2-135m")
TABLES = ("scores.csv", "labels.csv", "syntax.csv")


def run_analyze(model: str, out: Path) -> subprocess.CompletedProcess:
    """`headscope analyze MODEL --out OUT` with every other option at its default, on CPU."""
    return subprocess.run([sys.executable, "-m", "headscope", "analyze", model, "--out", str(out),
                           "--device", "cpu"], capture_output=True, text=True, timeout=1200)


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
