"""`headscope --help` and every `headscope COMMAND --help` print whole at 80 columns: rich cuts a
word longer than its column with an ellipsis, so no help line may end in one. The usage line's
`[ARGS]...` (click's notation for "one or more") is not a cut and is the one exception."""
import pytest
import typer
from typer.testing import CliRunner

from headscope.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)
BORDER = " \t│╭╮╰╯─"  # the panels' box drawing around each line


def _help(args: list[str]) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def _cut_lines(text: str) -> list[str]:
    lines = [line.strip(BORDER) for line in text.splitlines()]
    return [line for line in lines if line.endswith("…") or (line.endswith("...") and not line.startswith("Usage:"))]


def test_a_cut_line_is_recognised():
    assert _cut_lines("│   reports/MODEL-TASK-c… │\n│ MIB's 0.1,0.2,0.5...  │\nUsage: x [ARGS]...") == [
        "reports/MODEL-TASK-c…", "MIB's 0.1,0.2,0.5..."]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_prints_whole_at_80_columns(command):
    text = _help([command] if command else [])
    assert "Usage:" in text and max(len(line) for line in text.splitlines()) <= 80  # it did lay out at 80
    assert "…" not in text, _cut_lines(text)
    assert _cut_lines(text) == []
