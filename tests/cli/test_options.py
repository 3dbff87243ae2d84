"""One CLI vocabulary: a flag shared by several commands means one thing in all of them, old spellings are
hidden aliases, -v/-q work anywhere, and one boundary turns errors into one line and a documented code."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
import typer
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.cli.app import QconsistGroup


def _commands():
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


def _options():
    """(command, flag) -> (parameter name, help text) of every option of every command."""
    table = {}
    for name, command in _commands().items():
        for param in command.params:
            if getattr(param, "param_type_name", "") != "option":
                continue
            for flag in (*param.opts, *getattr(param, "secondary_opts", [])):
                table[(name, flag)] = (param.name, " ".join((param.help or "").split()), flag in param.opts)
    return table


def _meaning(help_text: str) -> str:
    """What a flag means, whatever the command: its help's first clause, without the defaults in parentheses or
    what the command adds after a colon (``Do what is refused by default: remove a run …``)."""
    sentence = re.sub(r" ?\([^)]*\)", "", help_text).split(". ")[0].rstrip(".")
    prefix = "cuda: " if sentence.startswith("cuda: ") else ""
    return prefix + sentence[len(prefix):].split(": ")[0]


def test_meaning_is_the_first_clause():
    assert _meaning("How many samples from --offset (default: 8).") == "How many samples from --offset"
    assert _meaning("Do what is refused by default: remove a run the history names as a baseline.") == "Do what is refused by default"
    assert _meaning("cuda: use_tf32 on or off (default: both are explored).") == "cuda: use_tf32 on or off"


def test_every_shared_flag_has_one_name_and_one_meaning():
    by_flag, by_param = defaultdict(dict), defaultdict(set)
    for (command, flag), (param, help_text, primary) in _options().items():
        by_flag[flag][command] = (param, help_text)
        if flag.startswith("--") and primary:
            by_param[param].add(flag)
    shared = {flag: uses for flag, uses in by_flag.items() if len(uses) > 1 and flag != "--help"}
    assert {"--json", "--inputs", "--ep", "--offset", "--count", "--runs-dir", "--run-id", "--stage", "--pipeline",
            "--history", "--repeats", "--cudnn-conv-algo-search", "--tf32"} <= set(shared)
    for flag, uses in shared.items():
        meanings = {_meaning(help_text) for _, help_text in uses.values()}
        assert len(meanings) == 1, f"{flag} means {len(meanings)} things: {uses}"
        assert len({param for param, _ in uses.values()}) == 1, f"{flag} reaches differently named parameters: {uses}"
    # one parameter, one flag (no --db here and --history there)
    for param, flags in by_param.items():
        assert len(flags) == 1, f"parameter {param} has the flags {sorted(flags)}"


def test_old_spellings_are_hidden_aliases(tmp_path):
    runner = CliRunner()
    missing = tmp_path / "none.sqlite"
    for old in (["history", "m", "--db", str(missing)], ["history", "m", "--history", str(missing)]):
        result = runner.invoke(app, old)
        assert result.exit_code == 2
        assert result.stderr == f"error: history database {missing} does not exist; run qconsist nightly first (or give --history)\n"
    helps = runner.invoke(app, ["history", "--help"]).output
    assert "--history" in helps and "--db" not in helps


def test_verbosity_anywhere():
    runner = CliRunner()
    assert runner.invoke(app, ["env", "--json", "-v"]).exit_code == 0
    assert QconsistGroup.verbosity == 1
    assert runner.invoke(app, ["-q", "env", "--json"]).exit_code == 0
    assert QconsistGroup.verbosity == -1
    assert runner.invoke(app, ["env", "--json"]).exit_code == 0
    assert QconsistGroup.verbosity == 0


def test_parameter_names_become_the_commands_flags(tmp_path):
    result = CliRunner().invoke(app, ["locate", str(tmp_path / "m.onnx"), "--inputs", "x.npy", "--count", "300"])
    assert result.exit_code == 2
    assert result.stderr == "error: --count must be between 1 and 256, got 300\n"
    result = CliRunner().invoke(app, ["run", str(tmp_path / "m.onnx"), "--inputs", "x.npy", "--raw", "all"])
    assert result.exit_code == 2 and result.stderr == "error: --raw needs --dump\n"


def test_usage_errors_are_one_line():
    result = CliRunner().invoke(app, ["diff", "a", "b", "--bogus"])
    assert result.exit_code == 2 and result.stderr == "error: No such option: --bogus\n"


@pytest.mark.parametrize("verbose", [False, True])
def test_a_bug_is_an_internal_error_with_its_own_code(monkeypatch, verbose):
    import qconsist.environment

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(qconsist.environment, "check_environment", broken)
    result = CliRunner().invoke(app, ["env", *(["-v"] if verbose else [])])
    assert result.exit_code == 4
    last = result.stderr.splitlines()[-1]
    assert re.fullmatch(r"internal error: RuntimeError: boom \(at test_options\.py:\d+\) — rerun with -v for the traceback", last)
    assert ("Traceback (most recent call last)" in result.stderr) is verbose


@pytest.mark.parametrize("options", [
    {"provider": "cpu"},
    {"provider": "cpu", "graph_optimization_level": "disable", "intra_op_threads": 2, "deterministic_compute": False,
     "disabled_optimizers": ("QDQSelectorActionTransformer", "ConstantFolding")},
    {"provider": "cpu", "session_config": {"session.disable_quant_qdq": "1", "session.intra_op.allow_spinning": "0"}},
    {"provider": "cuda", "provider_options": {"cudnn_conv_algo_search": "HEURISTIC", "use_tf32": False,
                                              "cudnn_conv_use_max_workspace": True, "device_id": 1, "prefer_nhwc": True},
     "deterministic_compute": True},
])
def test_execution_options_go_to_flags_and_back_through_the_execution_group(options):
    """``ExecutionOptions.to_args`` is the one way back to flags: the execution group builds the same object."""
    from qconsist.cli import options as opt
    from qconsist.inference.session import ExecutionOptions

    built = []
    probe = typer.Typer()

    @probe.command()
    @opt.uses(execution=opt.EXECUTION)
    def command(*, execution: ExecutionOptions) -> None:
        built.append(execution)

    given = ExecutionOptions(**options)
    result = CliRunner().invoke(probe, given.to_args())
    assert result.exit_code == 0, result.output
    assert built == [given]


def test_a_group_member_reaches_the_command_only_as_its_object():
    from qconsist.cli import options as opt

    with pytest.raises(TypeError, match="has no parameter execution"):
        opt.uses(execution=opt.EXECUTION)(lambda model: None)
    with pytest.raises(TypeError, match="the group has no option tf64"):
        opt.EXECUTION.with_defaults(tf64=True)
