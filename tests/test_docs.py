"""Every CLI command has help text and appears in the README's CLI reference (as sqlite-utils does)."""

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from qconsist.cli import app

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _commands() -> list[tuple[str, ...]]:
    root = typer.main.get_command(app)
    found: list[tuple[str, ...]] = []

    def walk(cmd, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, path + (name,))
        else:
            found.append(path)

    walk(root, ())
    return found


COMMANDS = _commands()


def test_there_are_commands():
    names = {" ".join(c) for c in COMMANDS}
    assert {"pipeline run", "calib repeat", "run", "diff", "locate", "models fetch"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_command_has_help_and_is_in_readme(path):
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    assert (command.help or "").strip(), f"qconsist {' '.join(path)} has no help text"
    heading = re.compile(r"^#+ .*`qconsist " + re.escape(" ".join(path)) + r"[ `]", re.MULTILINE)
    assert heading.search(README), f"README has no heading for `qconsist {' '.join(path)}`"


def test_readme_gives_the_two_commands():
    assert "make run" in README and "make test" in README
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert "make test" in ci
