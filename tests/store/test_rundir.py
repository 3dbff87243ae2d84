"""Run directories: atomic manifest written last, abandon on user error, incomplete runs recognised."""

import json

import pytest

from qconsist.errors import InputError, OutputError, RunStoreError
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RUNNING_NAME, RunDirectory, list_runs, open_run, run_state


def test_complete_run_roundtrip(tmp_path):
    run = RunDirectory.create(tmp_path / "runs", "demo", kind="pipeline")
    run.file("convert/model.onnx").write_bytes(b"x")
    assert run_state(run.path) == "incomplete"
    run.finish(Manifest(kind="pipeline", model={"name": "demo"}))
    assert run_state(run.path) == "complete"
    assert not (run.path / RUNNING_NAME).exists()
    manifest = open_run(run.path)
    assert manifest.kind == "pipeline" and manifest.model == {"name": "demo"} and manifest.run_id == run.run_id
    assert manifest.status == "complete" and manifest.finished


def test_user_error_abandons_directory(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(InputError):
        with RunDirectory.create(runs, "demo", kind="pipeline") as run:
            run.file("a/b.txt").write_text("half")
            raise InputError("bad image")
    assert list(runs.iterdir()) == []


def test_interrupted_run_is_incomplete_and_refused(tmp_path):
    run = RunDirectory.create(tmp_path / "runs", "demo", kind="pipeline")
    run.mark_progress("quantize")
    # the process dies here: no manifest
    assert run_state(run.path) == "incomplete"
    with pytest.raises(RunStoreError, match=r"is incomplete \(started .*, last step quantize\)"):
        open_run(run.path)
    assert list_runs(tmp_path / "runs") == [(run.path, "incomplete")]


def test_manifest_with_wrong_status_or_schema_is_refused(tmp_path):
    run = RunDirectory.create(tmp_path / "runs", "demo", kind="pipeline")
    run.finish(Manifest(kind="pipeline"))
    path = run.path / "manifest.json"
    data = json.loads(path.read_text())
    data["schema"] = "qconsist.run/99"
    path.write_text(json.dumps(data))
    with pytest.raises(RunStoreError, match=r"schema 'qconsist.run/99' is not supported"):
        open_run(run.path)
    data["schema"] = "qconsist.run/1"
    data["stages"] = "nope"
    path.write_text(json.dumps(data))
    with pytest.raises(RunStoreError, match=r"'stages' must be a JSON list"):
        open_run(run.path)
    path.write_text("{truncated")
    assert run_state(run.path) == "incomplete"


def test_missing_run(tmp_path):
    with pytest.raises(RunStoreError, match=r"run directory .*nothing does not exist"):
        open_run(tmp_path / "nothing")


def test_existing_run_id_and_unwritable_root(tmp_path):
    RunDirectory.create(tmp_path / "runs", "demo", kind="x", run_id="fixed")
    with pytest.raises(OutputError, match="already exists"):
        RunDirectory.create(tmp_path / "runs", "demo", kind="x", run_id="fixed")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OutputError, match=r"cannot create run directory in .*file/runs"):
        RunDirectory.create(blocker / "runs", "demo", kind="x")
    with pytest.raises(OutputError, match="invalid run id"):
        RunDirectory.create(tmp_path / "runs", "demo", kind="x", run_id="../escape")
