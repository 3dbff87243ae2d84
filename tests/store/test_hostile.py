"""Every hostile run directory of ``hostile.CASES`` gives one line and exit 2, never a traceback."""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from hostile import CASES, Case
from qconsist.cli import app
from qconsist.store.verify import reset_cache


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_run_directory(case: Case, runs_copy):
    reset_cache()
    case.mutate(runs_copy)
    result = CliRunner().invoke(app, case.command(runs_copy), env=case.env)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    line = result.stderr.removeprefix("error: ").rstrip("\n")
    expected = case.message(runs_copy)
    assert re.fullmatch(pattern(expected), line), line
    if os.environ.get("QCONSIST_HOSTILE_TABLE"):  # the closing note's table: case, command, message
        shown = line.replace(str(runs_copy["runs"].parent), "…")
        with open(os.environ["QCONSIST_HOSTILE_TABLE"], "a", encoding="utf-8") as table:
            table.write(f"| {case.name} | `qconsist {case.command(runs_copy)[0]}` | `{shown}` |\n")


def pattern(message: str) -> str:
    """A case's message as a regular expression: ``<sha>``, ``<n>`` and ``<any>`` stand for what varies."""
    text = re.escape(message)
    for token, regex in (("<sha>", "[0-9a-f]{12}…"), ("<n>", r"\d+"), ("<any>", ".*")):
        text = text.replace(re.escape(token), regex)
    return text
