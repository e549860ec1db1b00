"""Usage errors and faults headscope did not foresee reach the user as one line on stderr,
never typer's box or a traceback."""
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from headscope import cli
from headscope.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, **env):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "headscope", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=environment)


def test_a_typo_in_an_option_is_one_line_with_exit_code_2():
    done = _run("analyze", "some-model", "--seq-ln", "5")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: No such option: --seq-ln (Possible options: --repeat-len, --seq-len); see "
        "'python -m headscope analyze --help'"]
    assert done.stdout == ""


def test_other_usage_errors_are_one_line_too():
    for args, fragment in ((["nosuch"], "No such command 'nosuch'"),
                           (["report"], "give an analysis folder DIR, or --index FOLDER"),  # report takes DIR or --index
                           (["analyze", "m", "--seed", "99999999999999999999999"], "Invalid value for '--seed'"),
                           (["analyze", "m", "--seq-len", "abc"], "Invalid value for '--seq-len'")):
        done = _run(*args)
        assert done.returncode == 2, args
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], (args, done.stderr)


def test_no_command_prints_the_help():
    done = _run()
    assert done.returncode == 2 and "analyze" in done.stdout and done.stderr == ""


def test_an_unforeseen_fault_is_one_line_and_the_traceback_only_on_request(monkeypatch):
    def broken():
        raise RuntimeError("a fault no check foresaw\nwith a second line")

    monkeypatch.setattr(cli.loader, "models", broken)
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.strip().splitlines() == [
        "error: unexpected RuntimeError: a fault no check foresaw (a bug or an unchecked input: please report it; "
        "HEADSCOPE_TRACEBACK=1 shows the traceback)"]
    monkeypatch.setenv("HEADSCOPE_TRACEBACK", "1")
    result = CliRunner().invoke(app, ["models"])
    assert isinstance(result.exception, RuntimeError)


def test_a_command_that_succeeds_still_exits_0():
    for args in (["models"], ["analyze", "--help"]):
        done = _run(*args)
        assert done.returncode == 0 and done.stderr == "" and done.stdout, args
