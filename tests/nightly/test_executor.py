"""Executor options and the registry; the nightly CLI's executor flags; progress lines that overlap."""

from __future__ import annotations

import io

import pytest
from typer.testing import CliRunner

from nightly_files import derived_nightly
from qconsist.cli import app
from qconsist.errors import ConfigError
from qconsist.nightly import ExecutorOptions, executor_names, load_nightly, make_executor


def test_registry_lists_local_first_and_builds_each():
    assert executor_names() == ["local", "ray"]
    assert make_executor().name == "local"
    assert make_executor(ExecutorOptions("ray", address="auto")).name == "ray"


@pytest.mark.parametrize(("options", "message"), [
    (dict(name="dask"), "unknown `executor` 'dask'; choose one of: local, ray"),
    (dict(name="local", address="auto"), "`address` (and a local Ray's CPUs, GPUs and resources) are options of `executor` ray"),
    (dict(name="ray", address="auto", num_cpus=2), "a cluster at `address` declares its own CPUs, GPUs and resources; give them to `ray start`"),
    (dict(name="ray", max_retries=11), "`max_retries` must be a whole number from 0 to 10, got 11"),
    (dict(name="ray", max_retries=True), "`max_retries` must be a whole number from 0 to 10, got True"),
    (dict(name="ray", num_gpus=-1), "`num_gpus` must be a whole number >= 0, got -1"),
    (dict(name="ray", resources={"accelerator_type:H100": 0}), "resource 'accelerator_type:H100' must be a positive amount, got 0"),
])
def test_options_are_validated_on_creation(options, message):
    with pytest.raises(ConfigError) as caught:
        ExecutorOptions(**options)
    assert caught.value.template == message


def test_cli_names_the_flags(tmp_path):
    config = derived_nightly(tmp_path, ["fcn_head"])
    runner = CliRunner()
    result = runner.invoke(app, ["nightly", str(config), "--address", "auto"])
    assert result.exit_code == 2
    assert result.stderr == "error: --address (and a local Ray's CPUs, GPUs and resources) are options of --executor ray\n"
    result = runner.invoke(app, ["nightly", str(config), "--executor", "ray", "--max-retries", "11"])
    assert (result.exit_code, result.stderr) == (2, "error: --max-retries must be a whole number from 0 to 10, got 11\n")
    result = runner.invoke(app, ["nightly", str(config), "--executor", "slurm"])
    assert (result.exit_code, result.stderr) == (2, "error: unknown --executor 'slurm'; choose one of: local, ray\n")
    assert not (tmp_path / "runs").exists()


def test_an_unreachable_cluster_is_exit_3_at_once(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = derived_nightly(tmp_path, ["fcn_head"])
    result = CliRunner().invoke(app, ["nightly", str(config), "--executor", "ray", "--address", f"127.0.0.1:{port}"])
    assert result.exit_code == 3
    assert result.stderr == (f"error: cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused; start it with "
                             "`ray start --head` or check --address\n")
    assert not (tmp_path / "runs").exists()  # no night was started: no run directory, no history


@pytest.mark.parametrize(("key", "value", "message"), [
    ("gpus", '"H100"', "'gpus' must be a list of GPU types such as [\"H100\", \"H200\"], got 'H100'"),
    ("gpus", '["H100", "H100"]', "GPU type 'H100' is listed twice in 'gpus'"),
    ("gpus", '["H 100"]', "'gpus' must be a list of GPU types such as [\"H100\", \"H200\"], got ['H 100']"),
    ("cpus", "0", "'cpus' must be a number greater than 0, got 0"),
    ("memory_gb", "true", "'memory_gb' must be a number greater than 0, got True"),
])
def test_resource_keys_of_an_entry_are_checked(tmp_path, key, value, message):
    path = derived_nightly(tmp_path, ["fcn_head"])
    path.write_text(path.read_text().replace('name = "fcn_head"\n', f'name = "fcn_head"\n{key} = {value}\n'))
    with pytest.raises(ConfigError) as caught:
        load_nightly(path)
    assert caught.value.message == f"{path}: model 'fcn_head': {message}"


def test_entry_keys_fan_out_per_gpu_type(tmp_path):
    config = load_nightly(derived_nightly(tmp_path, ["fcn_head"], extra={"fcn_head": {"gpus": ["H100", "H200"], "cpus": 2}}))
    entry = config.models[0]
    assert entry.keys() == (("fcn_head@H100", "H100"), ("fcn_head@H200", "H200"))
    assert (entry.cpus, entry.memory_gb) == (2.0, None)


def test_rich_progress_keeps_overlapping_lines(monkeypatch):
    import importlib

    from rich.console import Console

    cli_app = importlib.import_module("qconsist.cli.app")  # the module (qconsist.cli.app is also the typer app)

    stream = io.StringIO()
    monkeypatch.setattr(cli_app, "stderr_console", lambda: Console(file=stream, force_terminal=True, width=100))
    progress = cli_app.RichProgress()
    night = progress.task("nightly on Ray (2 entries)", 2)
    night.__enter__()
    first, second = progress.task("model-a", 7), progress.task("model-b", 7)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # one entry finishes while the other runs: the display stays
    assert progress._progress.live.is_started
    assert [t.description for t in progress._progress.tasks] == ["nightly on Ray (2 entries)", "model-b"]
    second.__exit__(None, None, None)
    night.__exit__(None, None, None)
    assert not progress._progress.live.is_started


def test_the_baseline_is_like_with_like(tmp_path):
    """Among a model's good nights the newest on the same GPU, driver and onnxruntime is the baseline; when none
    is, the newest."""
    import copy
    import json as _json

    from qconsist.environment import fingerprint
    from qconsist.history import History
    from qconsist.nightly import night_tasks, run_nightly
    from qconsist.nightly.entry import choose_baseline

    config = load_nightly(derived_nightly(tmp_path, ["fcn_head"]))
    first, second = run_nightly(config), run_nightly(config)
    assert second.entries[0].baseline_night == first.night_id
    h200 = [{"name": "NVIDIA H200", "driver": "570.86", "memory": "", "compute_capability": "9.0"}]
    manifest = tmp_path / "runs" / second.entries[0].entry_run / "manifest.json"
    data = _json.loads(manifest.read_text())
    data["environment"]["gpus"] = h200
    manifest.write_text(_json.dumps(data))  # as if the second night had run on an H200 node

    [task] = night_tasks(config, History(config.history), "next")
    assert [night for night, _ in task.baselines] == [second.night_id, first.night_id]
    here = fingerprint()
    assert choose_baseline(task, here) == (first.entries[0].entry_run, first.night_id)  # older, but like this node
    on_h200 = copy.deepcopy(here) | {"gpus": h200}
    assert choose_baseline(task, on_h200) == (second.entries[0].entry_run, second.night_id)
    upgraded = copy.deepcopy(here) | {"onnxruntime_module": "99.0.0"}
    upgraded["packages"]["onnxruntime"] = "99.0.0"
    assert choose_baseline(task, upgraded) == (second.entries[0].entry_run, second.night_id)  # none alike: the newest
