"""The Ray executor on a real local Ray (2 CPUs) that declares two GPUs of two types, H100 and H200, the way
Ray labels nodes (``accelerator_type:H100``): a worker killed mid-entry and the retry; an entry fanned out
over GPU types, compared across them; resource needs no node meets."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray  # the test group installs it (pyproject: qconsist[ray])

from nightly_files import derived_nightly
from progress_recorder import Recorder
from qconsist.errors import RunStoreError
from qconsist.history import History, model_timeline
from qconsist.nightly import ExecutorOptions, load_nightly, run_nightly
from qconsist.nightly.entry import ENTRY_STEPS
from qconsist.nightly.executors.ray import needs, worker_environment
from qconsist.store.rundir import RUNNING_NAME, open_run, run_state

RAY = ExecutorOptions("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, num_gpus=2, resources={"accelerator_type:H100": 1, "accelerator_type:H200": 1},
             include_dashboard=False, configure_logging=False, log_to_driver=False, object_store_memory=128 * 2**20)
    yield
    ray.shutdown()


def _kill_first_attempt(runs: Path, prefix: str, killed: list) -> None:
    """Kill the worker of the first entry run named ``prefix…`` once its pipeline run is under way."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for entry in runs.glob(f"{prefix}-entry-*"):
            try:
                marker = json.loads((entry / RUNNING_NAME).read_text())
            except (OSError, ValueError):
                continue
            pipelines = [p for p in runs.glob(f"{prefix}-2*") if (p / RUNNING_NAME).is_file()]
            if marker.get("stage") == "pipeline" and pipelines:
                os.kill(marker["pid"], signal.SIGKILL)
                killed.append((entry, pipelines[0], marker["pid"]))
                return
        time.sleep(0.01)


def test_a_killed_worker_is_retried_and_its_attempt_left_incomplete(tmp_path):
    config = load_nightly(derived_nightly(tmp_path, ["fcn_head-determinized"]))
    runs = tmp_path / "runs"
    killed: list = []
    killer = threading.Thread(target=_kill_first_attempt, args=(runs, "fcn_head-determinized", killed))
    killer.start()
    progress = Recorder()
    result = run_nightly(config, executor=RAY, progress=progress)
    killer.join()
    assert killed, "the worker was never killed"
    lost_entry, lost_pipeline, pid = killed[0]

    entry = result.entries[0]
    assert result.passed and entry.status == "pass", result.to_json()
    assert len(entry.attempts) == 1
    lost = entry.attempts[0]
    assert (lost.attempt, lost.entry_run, lost.state, lost.stage) == (1, str(lost_entry), "incomplete", "pipeline")
    assert lost.reason.startswith("WorkerCrashedError: ")
    assert entry.entry_run != str(lost_entry) and run_state(Path(entry.entry_run)) == "complete"
    assert result.retries() == {"fcn_head-determinized": [f"attempt 1 lost during pipeline: {lost.reason}"]}

    # the lost attempt's run directories: incomplete, as a killed local run's are, and every reader says so
    assert run_state(lost_entry) == "incomplete" and run_state(lost_pipeline) == "incomplete"
    assert json.loads((lost_entry / RUNNING_NAME).read_text())["pid"] == pid
    with pytest.raises(RunStoreError, match=r"run .*fcn_head-determinized-entry-.* is incomplete \(started .*, last step pipeline\): it was interrupted"):
        open_run(lost_entry)

    # the history: the night complete, the entry done and passed, the lost attempt recorded beside its runs
    db = History(config.history)
    assert [(n["night_id"], n["status"]) for n in db.nights()] == [(result.night_id, "complete")]
    row = model_timeline(db, "fcn_head-determinized").nights[0]
    assert (row["status"], row["error"], row["entry_run"], row["verdict"]["passed"]) == ("done", None, entry.entry_run, True)
    assert row["runs"]["attempt-1"] == str(lost_entry)
    assert sorted(row["runs"]) == ["attempt-1", "entry", "pipeline", "quantized", "repeat"]
    summary = json.loads((result.path / "summary.json").read_text())
    assert summary["retries"] == {"fcn_head-determinized": [f"attempt 1 lost during pipeline: {lost.reason}"]}
    assert "<h2>Retries</h2>" in (result.path / "report.html").read_text()
    # progress: the night's line, and one line per running entry, its steps read from RUNNING.json
    lines = {description: (total, done) for description, total, done in progress.tasks}
    assert lines["nightly on Ray (1 entries)"] == (1, 1)
    total, done = lines["fcn_head-determinized (attempt 2)"]
    assert total == len(ENTRY_STEPS) and 0 <= done < total  # closed when its outcome arrives


def test_an_entry_fans_out_over_gpu_types_and_compares_across_them(tmp_path):
    path = derived_nightly(tmp_path, ["fcn_head", "fcn_head-determinized"],
                           extra={"fcn_head": {"gpus": ["H100", "H200"]}, "fcn_head-determinized": {"gpus": ["A100"]}})
    config = load_nightly(path)
    first = run_nightly(config, executor=RAY, across_gpus=True)
    assert [(e.model, e.status, e.gpu_label) for e in first.entries] == [
        ("fcn_head@H100", "pass", "H100"), ("fcn_head@H200", "pass", "H200"), ("fcn_head-determinized@A100", "error", "A100")]
    assert first.entries[2].error == "no node of the Ray cluster has a A100 GPU (GPU types there: H100, H200)"
    for entry in first.entries[:2]:
        manifest = open_run(Path(entry.entry_run))
        record = manifest.sections["nightly_entry"]
        assert (record["model"], record["gpu_type"], record["gpu_run"]) == (entry.model, entry.gpu_type, None)
        assert record["gpu_skipped"].startswith("execution provider cuda (CUDAExecutionProvider) is not in this onnxruntime")
        assert manifest.environment["env"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")  # the GPU Ray assigned
    [across] = first.across_gpus
    assert (across.model, across.gpu_a, across.gpu_b, across.role, across.identical, across.nodes) == (
        "fcn_head", "H100", "H200", "quantized", True, ())
    assert [(r.where, r.stable) for r in across.repeats] == [("H100", True), ("H200", True)]  # each type's quantized and repeat
    assert str(across) == ("fcn_head: H100 vs H200 (CPU EP dumps; two fresh sessions on each): bit-identical, each GPU type's "
                           "two sessions too; no node depends on the GPU type")
    html = (first.path / "report.html").read_text()
    assert "<td>H100</td>" in html and "<td>H200</td>" in html and "<h2>Across GPU types</h2>" in html

    # the second night: each GPU type's baseline is its own first night (like with like)
    second = run_nightly(config, executor=RAY, only=["fcn_head"])
    assert [e.model for e in second.entries] == ["fcn_head@H100", "fcn_head@H200"]
    for before, after in zip(first.entries, second.entries):
        assert after.status == "pass", after.to_json()
        assert (after.baseline, after.baseline_night) == (before.entry_run, first.night_id)
        assert after.verdict.check("artifacts").message == "every stage's md5 matches the baseline"
        assert after.verdict.check("environment").status.value == "pass"
    db = History(config.history)
    assert db.models() == ["fcn_head-determinized@A100", "fcn_head@H100", "fcn_head@H200"]


def test_the_local_executor_refuses_a_gpu_type_this_machine_lacks(tmp_path):
    config = load_nightly(derived_nightly(tmp_path, ["fcn_head"], extra={"fcn_head": {"gpus": ["H100"]}}))
    result = run_nightly(config)
    assert [(e.model, e.status, e.error) for e in result.entries] == [
        ("fcn_head@H100", "error", "needs a H100 GPU; this machine has no GPU: run it with --executor ray on a cluster that has one")]
    assert result.exit_code == 2


def test_resource_needs_of_a_task(tmp_path):
    config = load_nightly(derived_nightly(tmp_path, ["fcn_head", "fcn_head-determinized"], extra={
        "fcn_head": {"gpus": ["H200"], "cpus": 2, "memory_gb": 4}, "fcn_head-determinized": {"cpus": 3}}))
    from qconsist.history import History as _History
    from qconsist.nightly import night_tasks

    tasks = night_tasks(config, _History(config.history), "night")
    cluster = {"CPU": 16.0, "GPU": 2.0, "memory": 64 * 2**30, "accelerator_type:H200": 1.0}
    assert needs(tasks[0], cluster) == {"num_cpus": 2.0, "memory": 4 * 2**30, "num_gpus": 1, "accelerator_type": "H200",
                                        "max_retries": 0, "retry_exceptions": False}
    assert needs(tasks[1], cluster) == {"num_cpus": 3.0, "num_gpus": 1, "max_retries": 0, "retry_exceptions": False}
    assert needs(tasks[1], {"CPU": 2.0}) == "needs 3 CPUs; the Ray cluster has 2"
    assert needs(tasks[0], {"CPU": 16.0, "memory": 2**30, "accelerator_type:H200": 1.0, "GPU": 1.0}) == (
        "needs 4 GB of memory; the Ray cluster has 1.0 GB for tasks")


def test_a_worker_starts_with_the_head_numerics_environment(tmp_path):
    """The variables the head has set reach the worker process before numpy loads its BLAS (``runtime_env``);
    one it has not set is not invented, and the GPU stays Ray's to assign."""
    from dataclasses import replace

    from qconsist.nightly import night_tasks

    config = load_nightly(derived_nightly(tmp_path, ["fcn_head"]))
    [task] = night_tasks(config, History(config.history), "night")
    task = replace(task, numerics_env=(("OPENBLAS_NUM_THREADS", "2"), ("OMP_NUM_THREADS", None), ("CUDA_VISIBLE_DEVICES", "1")))
    assert worker_environment(task) == {"OPENBLAS_NUM_THREADS": "2"}

    def blas_in_worker():  # defined here: Ray sends it by value
        import numpy  # noqa: F401 - BLAS as numpy loads it in this worker
        from threadpoolctl import threadpool_info

        return os.environ.get("OPENBLAS_NUM_THREADS"), [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    probe = ray.remote(blas_in_worker)
    assert ray.get(probe.options(runtime_env={"env_vars": worker_environment(task)}).remote()) == ("2", [2])
    inherited, _ = ray.get(probe.remote())  # without it, a worker has what the local Ray started with
    assert inherited == os.environ.get("OPENBLAS_NUM_THREADS")
