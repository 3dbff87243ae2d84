"""What qconsist deletes it proves is its own: ``runs rm`` removes run directories only (a manifest of a
``qconsist.run/`` schema, or the ``RUNNING.json`` marker a run writes first), and a run directory appears with
its marker, so a clean-up never takes a starting run for an abandoned one (issue 29, items 1 and 4)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import OutputError
from qconsist.store import rundir
from qconsist.store.atomic import write_json_atomic
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RUNNING_NAME, RunDirectory
from qconsist.store.runs import remove_runs

runner = CliRunner()


def _project(runs_copy, tmp_path: Path) -> Path:
    """A project folder as a user has one: sources, data, a runs folder of complete runs, and one killed run."""
    project = tmp_path / "project"
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "src" / "pkg" / "model.py").write_text("print('hello')\n")
    (project / "data").mkdir()
    shutil.copyfile(runs_copy["data"], project / "data" / "arrays.npy")
    (project / "empty").mkdir()
    shutil.copytree(runs_copy["runs"], project / "runs", symlinks=True)
    dead = RunDirectory.create(project, "dead", "inference", run_id="dead")
    marker = json.loads((dead.path / RUNNING_NAME).read_text())
    (dead.path / RUNNING_NAME).write_text(json.dumps({**marker, "pid": 2**22 + 12345}))
    rundir._OPEN.discard(os.path.realpath(dead.path))
    return project


def test_rm_incomplete_in_a_project_folder_removes_only_the_killed_run(runs_copy, tmp_path):
    project = _project(runs_copy, tmp_path)
    result = runner.invoke(app, ["runs", "rm", "--incomplete", "--runs-dir", str(project)])
    assert result.exit_code == 0, result.stderr
    why = "not a run directory (no qconsist manifest, no RUNNING.json marker); never removed"
    assert result.stdout.splitlines()[:5] == ["removed dead", f"kept data: {why}", f"kept empty: {why}",
                                              f"kept runs: {why}", f"kept src: {why}"]
    assert not (project / "dead").exists()
    assert (project / "src" / "pkg" / "model.py").read_text() == "print('hello')\n"
    assert (project / "data" / "arrays.npy").is_file() and (project / "empty").is_dir()
    assert sorted(p.name for p in (project / "runs").iterdir()) == sorted(p.name for p in runs_copy["runs"].iterdir())


def test_rm_older_than_keeps_folders_that_are_not_runs(runs_copy, tmp_path):
    project = _project(runs_copy, tmp_path)
    old = time.time() - 90 * 86400
    for name in ("src", "data", "runs", "empty"):
        os.utime(project / name, (old, old))
    removal = remove_runs(project, [], older_than=30 * 86400)
    assert removal.removed == [] and set(removal.kept) == {"src", "data", "runs", "empty"}
    assert removal.kept["src"].startswith("not a run directory")
    removal = remove_runs(project / "runs", [], older_than=0)  # the runs themselves: every one of them is a run
    assert sorted(removal.removed) == sorted(p.name for p in runs_copy["runs"].iterdir() if p.is_dir())
    assert (project / "src" / "pkg" / "model.py").is_file()


def test_rm_by_name_refuses_a_folder_that_is_not_a_run(runs_copy, tmp_path):
    project = _project(runs_copy, tmp_path)
    for name in ("src", "runs", "empty"):
        result = runner.invoke(app, ["runs", "rm", name, "--runs-dir", str(project)])
        assert (result.exit_code, result.stdout) == (2, ""), result.stderr
        assert result.stderr == (f"error: {project / name} is not a run directory (no qconsist manifest, no RUNNING.json "
                                 "marker); never removed; refused\n")
        assert (project / name).is_dir()
    (project / "forged").mkdir()  # a manifest of another schema, or a marker that is not a run's
    (project / "forged" / "manifest.json").write_text('{"schema": "other.tool/1", "status": "complete"}')
    (project / "forged2").mkdir()
    (project / "forged2" / RUNNING_NAME).write_text('{"pid": 1}')
    from qconsist.store.runs import run_evidence

    assert (run_evidence(project / "forged"), run_evidence(project / "forged2")) == (None, None)
    assert (run_evidence(project / "runs" / "pipeline"), run_evidence(project / "dead")) == ("manifest", "marker")
    listed = json.loads(runner.invoke(app, ["runs", "list", "--runs-dir", str(project), "--json"]).stdout)
    assert {r["name"]: r["status"] for r in listed["runs"]} == {
        "data": "invalid", "dead": "incomplete", "empty": "invalid", "forged": "invalid", "forged2": "invalid",
        "runs": "invalid", "src": "invalid"}


def test_a_run_appears_with_its_marker(tmp_path, monkeypatch):
    """A clean-up that runs while a run is being created (between its folder and its marker) finds nothing to
    remove: the folder appears under its name with ``RUNNING.json`` already in it."""
    runs = tmp_path / "runs"
    seen = []
    real = rundir.write_json_atomic

    def clean_up_first(path, data):
        if path.name == RUNNING_NAME:
            seen.append(remove_runs(runs, [], incomplete=True))
        return real(path, data)

    monkeypatch.setattr(rundir, "write_json_atomic", clean_up_first)
    run = RunDirectory.create(runs, "starting", "pipeline", run_id="starting")
    assert [r.removed for r in seen] == [[]]
    assert json.loads((run.path / RUNNING_NAME).read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in runs.iterdir()) == ["starting"]  # the staging name is gone
    monkeypatch.undo()
    run.file("quantize/model.onnx").write_bytes(b"x")
    assert run.finish(Manifest(kind="pipeline")) == run.path


def test_a_removed_run_is_not_made_again(tmp_path):
    run = RunDirectory.create(tmp_path / "runs", "gone", "pipeline", run_id="gone")
    shutil.rmtree(run.path)  # `runs rm` or a user, while the run still writes
    with pytest.raises(OutputError, match=r"cannot write .*gone/dump/index.json: its run directory .*gone was removed "
                                          r"while being written"):
        write_json_atomic(run.path / "dump" / "index.json", {})
    with pytest.raises(OutputError, match=r"its run directory .*gone was removed while being written"):
        run.file("quantize/model.onnx")
    assert not run.path.exists()
    run.abandon()


def test_runs_created_while_another_process_cleans_up(tmp_path):
    """25 runs created and finished here while another process runs ``runs rm --incomplete`` in a loop: none lost."""
    runs = tmp_path / "runs"
    runs.mkdir()
    stop = tmp_path / "stop"
    loop = ("import sys, pathlib\nfrom qconsist.store.runs import remove_runs\nruns, stop = map(pathlib.Path, sys.argv[1:])\n"
            "removed = 0\nwhile not stop.exists():\n    removed += len(remove_runs(runs, [], incomplete=True).removed)\n"
            "print(removed)\n")
    cleaner = subprocess.Popen([sys.executable, "-c", loop, str(runs), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the loop is running
        failed = []
        for index in range(25):
            try:
                run = RunDirectory.create(runs, "race", "pipeline", run_id=f"race-{index}")
                for step in range(4):
                    run.file(f"step{step}/data.bin").write_bytes(b"x" * 1000)
                    run.mark_progress(f"step{step}")
                run.finish(Manifest(kind="pipeline"))
            except OutputError as exc:
                failed.append(str(exc))
    finally:
        stop.touch()
        removed = int(cleaner.communicate(timeout=60)[0])
    assert (failed, removed) == ([], 0)
    assert sorted(p.name for p in runs.iterdir()) == sorted(f"race-{i}" for i in range(25))
