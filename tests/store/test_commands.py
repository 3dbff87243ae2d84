"""``qconsist verify``, ``runs list|show|rm`` and the recorded ``files`` map, on small runs built in code."""

from __future__ import annotations

import hashlib
import json
import re
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.errors import ConfigError, RunStoreError
from qconsist.store.confine import check_npy, check_npz, confined
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RUNNING_NAME, RunDirectory
from qconsist.store.runs import parse_age, remove_runs
from qconsist.store.runs import verify_run
from qconsist.store.verify import COST, file_sha256, reset_cache, run_file

runner = CliRunner()


def test_finish_records_every_file_with_sha256_and_md5(runs_copy):
    run = runs_copy["inference"]
    data = json.loads((run / "manifest.json").read_text())
    on_disk = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert sorted(data["files"]) == on_disk
    assert {"dump/table/hashes.npy", "dump/table/stats.npy", "dump/table/starts.npy", "dump/table/events.npy",
            "outputs/o0.npy", "dump/raw/000000.npz"} <= set(on_disk)
    blob = (run / "dump" / "index.json").read_bytes()
    assert data["files"]["dump/index.json"] == {"sha256": hashlib.sha256(blob).hexdigest(),
                                                "md5": hashlib.md5(blob).hexdigest(), "size": len(blob)}


def test_each_file_is_hashed_once_per_command(runs_copy):
    reset_cache()
    manifest = Manifest.load(runs_copy["pipeline"] / "manifest.json")
    for _ in range(3):
        run_file(runs_copy["pipeline"], manifest, "quantize/model.onnx")
    assert (COST.files, COST.cached) == (1, 2)
    (runs_copy["pipeline"] / "quantize" / "model.onnx").open("ab").write(b"\0")  # rewritten: hashed again
    with pytest.raises(RunStoreError, match=r"quantize/model.onnx was modified after the run \(sha256 [0-9a-f]{12}… recorded"):
        run_file(runs_copy["pipeline"], manifest, "quantize/model.onnx")
    assert COST.files == 2


def test_verify_lists_every_file(runs_copy):
    result = runner.invoke(app, ["verify", str(runs_copy["pipeline"])])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"run {runs_copy['pipeline']}: verified (6 file(s), ")
    assert [line.split() for line in lines[1:]] == [
        ["ok", "convert/model.onnx"], ["ok", "inputs/calibration.jsonl"], ["ok", "inputs/evaluation.jsonl"],
        ["ok", "optimize/model.onnx"], ["ok", "quantize/calibration_ranges.json"], ["ok", "quantize/model.onnx"]]


def test_verify_json_and_statuses(runs_copy):
    run = runs_copy["inference2"]
    (run / "dump" / "raw" / "000001.npz").unlink()
    (run / "notes.txt").write_text("added later")
    (run / "dump" / "index.json").write_text("{}")
    result = runner.invoke(app, ["verify", "--json", str(run), str(runs_copy["inference"])])
    assert result.exit_code == 2
    assert result.stderr == f"error: run {run}: dump/index.json was modified after the run" + result.stderr.split("after the run", 1)[1]
    data = json.loads(result.stdout)
    assert data["schema"] == "qconsist.verify/1" and data["passed"] is False
    first, second = data["runs"]
    statuses = {f["path"]: f["status"] for f in first["files"]}
    assert statuses["dump/raw/000001.npz"] == "missing"
    assert statuses["dump/index.json"] == "modified"
    assert statuses["notes.txt"] == "unrecorded"
    assert statuses["outputs/o0.npy"] == "ok" and statuses["dump/raw/000000.npz"] == "ok"
    assert second["passed"] is True and all(f["status"] == "ok" for f in second["files"])


def test_runs_list_show_and_statuses(runs_copy, tmp_path):
    runs = runs_copy["runs"]
    (runs_copy["pipeline2"] / "quantize" / "model.onnx").open("ab").write(b"\0")
    stuck = RunDirectory.create(runs, "stuck", "pipeline", run_id="stuck")
    stuck.mark_progress("quantize")
    result = runner.invoke(app, ["runs", "list", "--runs-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.stderr
    listing = {r["name"]: r for r in json.loads(result.stdout)["runs"]}
    assert {k: (v["kind"], v["status"]) for k, v in listing.items()} == {
        "inference": ("inference", "complete"), "inference2": ("inference", "complete"),
        "legacy": ("inference", "complete"), "legacy2": ("inference", "complete"),  # the per-sample layout
        "pipeline": ("pipeline", "complete"), "pipeline2": ("pipeline", "modified"), "stuck": ("pipeline", "incomplete")}
    assert listing["pipeline"]["model"] == "tiny" and listing["pipeline"]["size"] > 1000
    assert listing["stuck"]["running"] is True and listing["stuck"]["detail"] == "being written by a live process"
    text = runner.invoke(app, ["runs", "list", "--runs-dir", str(runs)]).stdout.splitlines()
    total = sum(r["size"] for r in listing.values())
    assert re.fullmatch(rf"7 run\(s\) in {re.escape(str(runs))}, [\d.]+ (KB|MB); free space with qconsist runs rm "
                        r"--older-than 30d \(--dry-run first\)", text[-1]) and total > 0
    assert text[0].split() == ["run", "kind", "model", "status", "verdict", "age", "size"]
    assert [line.split()[0] for line in text[1:-1]] == sorted(listing, key=lambda name: listing[name]["age_seconds"])  # newest first
    assert any(re.match(r"pipeline2 +pipeline +tiny +modified +", line) and "quantize/model.onnx was modified" in line for line in text)
    assert len({line.index(" pipeline ") for line in text[1:-1] if " pipeline " in line}) == 1  # aligned
    shown = runner.invoke(app, ["runs", "show", str(runs_copy["pipeline2"])])
    assert shown.exit_code == 0
    assert shown.stdout.splitlines()[0].startswith(f"run {runs_copy['pipeline2']}: pipeline run of tiny, modified, verdict PASS, started ")
    assert "  modified   quantize/model.onnx" in shown.stdout


def test_runs_rm_incomplete_never_a_live_one(runs_copy):
    runs = runs_copy["runs"]
    live = RunDirectory.create(runs, "live", "inference", run_id="live")
    dead = RunDirectory.create(runs, "dead", "inference", run_id="dead")
    marker = json.loads((dead.path / RUNNING_NAME).read_text())
    (dead.path / RUNNING_NAME).write_text(json.dumps({**marker, "pid": 2**22 + 12345}))
    result = runner.invoke(app, ["runs", "rm", "--incomplete", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["removed dead", "kept live: being written by a live process",
                                          f"removed 1 run(s), {result.stdout.splitlines()[-1].split(', ')[1]}"]
    assert not dead.path.exists() and live.path.is_dir() and runs_copy["pipeline"].is_dir()


def _agreement(runs, name):
    """What ``runs list``, ``runs show`` and ``runs rm --incomplete --dry-run`` say of run ``name``."""
    listed = {r["name"]: r for r in json.loads(runner.invoke(app, ["runs", "list", "--runs-dir", str(runs), "--json"]).stdout)["runs"]}
    shown = runner.invoke(app, ["runs", "show", name, "--runs-dir", str(runs), "--json"])
    assert shown.exit_code == 0, shown.stderr
    removal = json.loads(runner.invoke(app, ["runs", "rm", "--incomplete", "--dry-run", "--runs-dir", str(runs), "--json"]).stdout)
    return listed[name], json.loads(shown.stdout)["run"], removal


def test_a_sigkilled_pipeline_run_is_the_same_to_list_show_and_rm(small_models, tmp_path):
    """A real ``qconsist pipeline run`` SIGKILLed mid-way, asked about before its parent reaps it (a zombie:
    ``kill(pid, 0)`` still succeeds) and after: not being written, to all three commands alike."""
    import signal
    import subprocess
    import sys
    import time

    pipeline = tmp_path / "long.toml"
    pipeline.write_text(f'[model]\nonnx = "{small_models["classifier"]}"\n'
                        f'[calibration]\ndata = "{small_models["arrays"]}"\nrepeat = 100\n')
    runs = tmp_path / "runs"
    command = [str(Path(sys.executable).parent / "qconsist"), "pipeline", "run", str(pipeline), "--runs-dir", str(runs), "--run-id", "killed"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = runs / "killed" / RUNNING_NAME
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (marker.exists() and "calib_repeat" in marker.read_text()):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    stat = Path(f"/proc/{process.pid}/stat")
    while time.monotonic() < deadline and stat.read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)
    assert stat.read_text().rpartition(")")[2].split()[0] == "Z"  # killed, not reaped: the case that misled `runs list`
    recorded = json.loads(marker.read_text())
    assert recorded["pid"] == process.pid and recorded["host"] and recorded["process_start"]
    for reaped in (False, True):
        listed, shown, removal = _agreement(runs, "killed")
        assert (listed["status"], listed["running"], listed["detail"]) == ("incomplete", False, "interrupted or killed"), reaped
        assert {k: v for k, v in shown.items() if k != "age_seconds"} == {k: v for k, v in listed.items() if k != "age_seconds"}
        assert shown["started"] == recorded["started"] and shown["kind"] == "pipeline" and shown["size"] > 1000
        assert removal["removed"] == ["killed"] and removal["kept"] == {}
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


def test_being_written_names_one_process(runs_copy):
    """A live pid that is another process than the recorded one (pid reuse), this process's own pid on a run it
    no longer writes (interrupted), a run it does write, and a run written on another host."""
    runs = runs_copy["runs"]
    reused = RunDirectory.create(runs, "reused", "pipeline", run_id="reused")
    data = json.loads((reused.path / RUNNING_NAME).read_text())
    (reused.path / RUNNING_NAME).write_text(json.dumps({**data, "pid": os.getppid(), "process_start": "another-boot:1"}))
    with pytest.raises(KeyboardInterrupt):
        with RunDirectory.create(runs, "interrupted", "pipeline", run_id="interrupted"):
            raise KeyboardInterrupt
    writing = RunDirectory.create(runs, "writing", "pipeline", run_id="writing")
    elsewhere = RunDirectory.create(runs, "elsewhere", "pipeline", run_id="elsewhere")
    data = json.loads((elsewhere.path / RUNNING_NAME).read_text())
    (elsewhere.path / RUNNING_NAME).write_text(json.dumps({**data, "host": "node-7"}))
    for name, running, detail in (("reused", False, "interrupted or killed"), ("interrupted", False, "interrupted or killed"),
                                  ("writing", True, "being written by a live process"),
                                  ("elsewhere", True, "being written on host node-7 (cannot be checked from here)")):
        listed, shown, removal = _agreement(runs, name)
        assert (listed["running"], listed["detail"], shown["running"], shown["detail"]) == (running, detail, running, detail), name
        assert (name in removal["removed"], removal["kept"].get(name)) == (not running, detail if running else None), name
    writing.finish(Manifest(kind="pipeline"))


def test_runs_show_of_a_run_that_is_not_there(runs_copy):
    runs = runs_copy["runs"]
    result = runner.invoke(app, ["runs", "show", "gone", "--runs-dir", str(runs)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"error: run directory gone does not exist (nor {runs / 'gone'})\n"
    result = runner.invoke(app, ["runs", "show", str(runs / "gone")])
    assert result.exit_code == 2 and result.stderr == f"error: run directory {runs / 'gone'} does not exist\n"


def test_runs_rm_refuses_paths_and_links(runs_copy):
    runs = runs_copy["runs"]
    (runs / "link").symlink_to(runs_copy["outside"])
    for name, message in (("../outside", r"'../outside' leaves the run directory"),
                          ("link", r"is a symbolic link, not a run directory; refused"),
                          ("nothing", r"run directory .*nothing does not exist")):
        with pytest.raises((RunStoreError, ConfigError), match=message):
            remove_runs(runs, [name])
    assert (runs_copy["outside"] / "secret.onnx").is_file()
    with pytest.raises(ConfigError, match="say which runs to remove"):
        remove_runs(runs, [])
    with pytest.raises(ConfigError, match=r"older_than '3 days': write a number and a unit"):
        parse_age("3 days")
    assert parse_age("2w") == 14 * 86400


def test_runs_rm_keeps_the_baseline_the_history_names(runs_copy):
    from qconsist.gate import evaluate_gate
    from qconsist.gate.policy import CalibrationPolicy, Policy
    from qconsist.history import History

    runs = runs_copy["runs"]
    history = History(runs / "history.sqlite")
    verdict = evaluate_gate(runs_copy["pipeline"], None, Policy(calibration=CalibrationPolicy(repeat_must_agree=False)))
    assert verdict.passed, verdict.reasons
    history.start_night("night-1", "nightly.toml", {})
    history.start_entry("night-1", "tiny")
    history.record_run("night-1", "tiny", "pipeline", "pipeline", "pipeline", str(runs_copy["pipeline"]))
    history.finish_entry("night-1", "tiny", str(runs_copy["pipeline"]), verdict, None)
    history.finish_night("night-1", {})
    result = runner.invoke(app, ["runs", "rm", "--older-than", "0s", "--dry-run", "--runs-dir", str(runs)])
    assert result.exit_code == 0, result.stderr
    assert "kept pipeline: the history names it as a baseline (--force removes it)" in result.stdout
    assert "would remove pipeline2" in result.stdout and runs_copy["pipeline2"].is_dir()
    listing = json.loads(runner.invoke(app, ["runs", "list", "--runs-dir", str(runs), "--json"]).stdout)
    assert [r["name"] for r in listing["runs"] if r["baseline"]] == ["pipeline"], listing
    from qconsist.history.db import baseline_runs

    forced = remove_runs(runs, ["pipeline"], baselines=baseline_runs(runs / "history.sqlite"), force=True)
    assert forced.removed == ["pipeline"] and not runs_copy["pipeline"].exists()


def test_confined_refusals(tmp_path):
    run = tmp_path / "run"
    (run / "a").mkdir(parents=True)
    (run / "a" / "f").write_bytes(b"x")
    (run / "inside").symlink_to(run / "a" / "f")
    assert confined(run, "inside") == (run / "a" / "f").resolve()  # a link inside the run is followed
    for relative, message in (("/etc/passwd", "is absolute"), ("a/../a/f", r"leaves the run directory \('..'\)"),
                              ("a//f", "is not normalised"), ("", "is '', not a path"), (3, "is 3, not a path"),
                              ("a", "a is a directory; refused"), ("b", "b is missing")):
        with pytest.raises(RunStoreError, match=message):
            confined(run, relative)


def test_npy_header_that_lies_is_refused_before_reading(tmp_path):
    import numpy as np

    path = tmp_path / "t.npy"
    np.save(path, np.zeros((4, 3), np.float32))
    assert check_npy(path, "t.npy", np.dtype(np.float32), 2) == (4, 3)
    blob = path.read_bytes()
    path.write_bytes(blob.replace(b"(4, 3)", b"(9, 3)"))
    with pytest.raises(RunStoreError, match=r"t.npy: its header says \(9, 3\) float32 \(236 bytes with the header\), the file holds 176; refused"):
        check_npy(path, "t.npy")
    np.savez(tmp_path / "a.npz", o0=np.arange(3))
    assert check_npz(tmp_path / "a.npz", "a.npz") == {"o0": ("<i8", (3,))}


def test_file_sha256_refuse_a_pipe(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(RunStoreError, match="is not a regular file; refused"):
        file_sha256(tmp_path / "pipe")


def test_verify_run_on_an_old_run_without_files(runs_copy):
    """Runs written before ``files`` existed: their stage artifacts are verified, other files unverified."""
    run = runs_copy["pipeline2"]
    data = json.loads((run / "manifest.json").read_text())
    data.pop("files")
    (run / "manifest.json").write_text(json.dumps(data))
    result = verify_run(run)
    assert result.passed
    assert {f.path: f.status for f in result.files} == {
        "convert/model.onnx": "ok", "optimize/model.onnx": "ok", "quantize/model.onnx": "ok",
        "quantize/calibration_ranges.json": "unverified", "inputs/calibration.jsonl": "unverified",
        "inputs/evaluation.jsonl": "unverified"}
    shutil.copyfile(run / "optimize" / "model.onnx", run / "quantize" / "model.onnx")
    assert [f.status for f in verify_run(run).files if f.path == "quantize/model.onnx"] == ["modified"]
