"""The CLI runner shared by the `audio8` command's test files (test_cli*.py)."""

from __future__ import annotations

from typer.testing import CliRunner

from audio8_coreai.cli import app

runner = CliRunner()


def run(*args):
    result = runner.invoke(app, [str(a) for a in args], prog_name="audio8")
    assert "Traceback" not in result.output
    return result
