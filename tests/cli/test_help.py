"""Help that belongs: every command's ``--help`` names only options that command has, says what each shared
option does for that command, shows its options in panels, and lists commands with whole summaries."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from qconsist.cli import app

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
QUOTED = re.compile(r"`[^`]*`")  # `qconsist run --dump`: another command, named as such


def _commands() -> dict[str, object]:
    found = {}

    def walk(command, path):
        sub = getattr(command, "commands", None)
        if isinstance(sub, dict):
            for name, child in sub.items():
                walk(child, path + (name,))
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = _commands()


def _flags(command) -> set[str]:
    return {flag for param in command.params for flag in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))}


def _help(path: str, columns: int = 120) -> str:
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_names_only_the_commands_own_options(name):
    command = COMMANDS[name]
    own = _flags(command) | {"--help"}
    text = _help(name)
    unwrapped = " ".join(re.sub(r"-\n\s*", "-", text).split())  # click breaks lines after a hyphen too
    named = set(FLAG.findall(QUOTED.sub("", unwrapped)))
    assert named - own == set(), f"qconsist {name} --help names options it lacks: {sorted(named - own)}"
    for param in command.params:  # and each option's own text, unwrapped
        assert set(FLAG.findall(QUOTED.sub("", param.help or ""))) <= own, (name, param.name, param.help)


def _option_help(name: str, flag: str) -> str:
    for param in COMMANDS[name].params:
        if flag in getattr(param, "opts", ()):
            return " ".join((param.help or "").split())
    raise AssertionError(f"{name} has no {flag}")


def test_shared_options_say_what_they_do_for_their_command():
    assert _option_help("gate", "--policy") == (
        "Policy file (TOML; default: the built-in defaults, see policies/default.toml): the checks and their tolerances.")
    assert _option_help("diff", "--policy") == (
        "Policy file (TOML; default: the built-in defaults, see policies/default.toml): its [diff] tolerances "
        "(atol, rtol, per node); --atol/--rtol override them.")
    assert _option_help("quant-error", "--pipeline") == "Pipeline file whose [preprocess] prepares images."
    assert _option_help("locate", "--pipeline") == (
        "Pipeline file whose [preprocess] prepares images. Its [quantize] and [calibration] serve --calibration-repeats.")
    assert _option_help("report", "--output") == "The file to write: the HTML page."
    assert _option_help("convert", "--output") == "The file to write: the ONNX model, written only once every check passed."
    assert _option_help("runs rm", "--force") == "Do what is refused by default: remove a run the history names as a baseline."
    assert _option_help("gate", "--force") == (
        "Do what is refused by default: write an output file over an existing file, an input or a file inside a run directory.")
    assert _option_help("locate", "--count") == "How many samples from --offset (default: 8)."
    assert _option_help("run", "--count") == "How many samples from --offset (default: all)."
    assert _option_help("calib repeat", "--repeats") == "How many times the work is repeated and compared: calibrations (default 3)."


def test_options_are_shown_in_panels():
    text = _help("run")
    sections = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[A-Z][a-z]+:", line)]
    assert sections == ["Arguments", "Options", "Model", "Inputs", "Execution", "Output"]
    inputs = text.split("\nInputs:\n", 1)[1].split("\n\n", 1)[0]
    assert [FLAG.search(line).group() for line in inputs.splitlines() if line.startswith("  --")] == [
        "--inputs", "--pipeline", "--offset", "--count", "--workers", "--labels"]
    assert "--ep" in text.split("\nExecution:\n", 1)[1].split("\n\n", 1)[0]
    assert "--json" in text.split("\nOutput:\n", 1)[1]


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("group", ["", "pipeline", "calib", "models", "runs"])
def test_command_lists_give_whole_summaries(group, columns):
    text = _help(group, columns)
    listed = text.split("\nCommands:\n", 1)[1]
    assert "..." not in listed
    if columns == 200:  # one line per command
        assert len(listed.strip().splitlines()) == len(typer.main.get_command(app).commands if not group else
                                                      typer.main.get_command(app).commands[group].commands)
    root = _help("", 200)
    assert "  gate           PASS or FAIL a run against its baseline under a policy.\n" in root
