"""Shared fixtures: CLI isolation (every test) and one complete open_nsfw pipeline run (per session)."""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path

import pytest

from onnx_builders import build_classifier_model, build_pad_pool_model, save_arrays

REPO = Path(__file__).resolve().parent.parent
OPEN_NSFW_PIPELINE = REPO / "pipelines" / "open_nsfw.toml"

# fixtures that run the real open_nsfw pipeline (seconds to minutes): their tests are marked ``slow``
OPEN_NSFW_FIXTURES = {"nsfw_run", "nsfw_models", "gate_runs", "level_runs", "calibration_runs", "nsfw_inputs"}
# modules marked ``slow`` whole: nights, pipelines in subprocesses, fuzzing, another environment built, a wheel
SLOW_MODULES = ("tests/nightly/", "tests/test_threads.py", "tests/test_wheel.py", "tests/test_fuzz_readers.py",
                "tests/cli/test_fuzz_cli.py", "tests/store/test_fuzz_rundir.py", "tests/store/test_signals.py",
                "tests/explain/test_upgrade.py")


# Under pytest-xdist (make test) the unit of work is a module, or a folder whose modules share expensive
# session fixtures (tests/diff: dumps at two levels and a second calibration; tests/gpu: a CPU exploration), so
# that they are built once; the modules that start a local Ray are one unit (two local Rays on the same cores
# only slow each other down); the longest units start first, so that no worker is left with one of them at the end.
RAY_MODULES = ("tests/nightly/test_ray_identity.py", "tests/nightly/test_ray_interrupt.py", "tests/nightly/test_ray_cluster.py")
SHARED_FOLDERS = ("tests/diff/", "tests/gpu/")
LONGEST_FIRST = ("ray", "tests/nightly/test_nightly.py", "tests/diff/", "tests/nightly/test_interrupt.py", "tests/test_threads.py",
                 "tests/gate/test_gate.py", "tests/cli/test_fuzz_cli.py", "tests/calibration/test_calib_repeat.py",
                 "tests/explain/test_explain.py", "tests/gpu/")


def work_unit(nodeid: str) -> str:
    """The unit of work of a test under pytest-xdist: ``ray``, a shared folder, or its module."""
    module = nodeid.split("::", 1)[0]
    if module in RAY_MODULES:
        return "ray"
    return next((folder for folder in SHARED_FOLDERS if module.startswith(folder)), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's scheduler by ``work_unit``, in the collection's order (``LONGEST_FIRST``). (Its own
    ``loadgroup`` does not group on pytest 9.2, whose node ids it can no longer rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False
    return UnitScheduling(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Fetch the real models once, before any test (and before pytest-xdist starts its workers, which would
    otherwise each download them on a fresh cache): the first run on a machine spends its download here."""
    if hasattr(session.config, "workerinput"):
        return
    from qconsist.errors import QconsistError
    from qconsist.models.registry import fetch_model

    for name in ("open_nsfw", "nudenet_320n"):
        try:
            fetch_model(name)
        except QconsistError as exc:  # the tests that need it fail with this message
            print(f"\nconftest: cannot fetch model {name}: {exc}")


@contextmanager
def _turn(item: pytest.Item):
    """Under pytest-xdist, a test marked ``alone`` (it measures how threads interleave: another worker on the same
    cores serializes them) runs while no other worker runs a test; every other test runs beside any but those.
    A readers-writer lock of two ``flock`` files in the session's shared temporary folder; the turnstile makes
    a waiting ``alone`` test go next."""
    config = item.config
    if not hasattr(config, "workerinput"):
        yield
        return
    folder = Path(config.option.basetemp).parent
    alone = item.get_closest_marker("alone") is not None
    with open(folder / "turnstile.lock", "a") as turnstile, open(folder / "tests.lock", "a") as tests:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    with _turn(item):
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` on every test that needs the real open_nsfw run or lies in ``SLOW_MODULES`` (``-m "not slow"``,
    ``make check``, for a quick pass); a ``gpu``
    test skipped with its reason where no CUDA provider runs (CI deselects them with ``-m "not gpu"``); in a
    pytest-xdist worker, the longest modules first (``LONGEST_FIRST``)."""
    if hasattr(config, "workerinput"):
        rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))
    cuda = None
    for item in items:
        if OPEN_NSFW_FIXTURES & set(getattr(item, "fixturenames", ())) or item.nodeid.startswith(SLOW_MODULES):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") is not None:
            if cuda is None:
                from qconsist.inference.session import provider_available

                cuda = provider_available("cuda")
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs onnxruntime-gpu and a usable CUDA GPU"))


# What third-party libraries leave in the temporary folder on their own (onnxruntime writes a session id file,
# ``.ses``, when it is imported; the local Ray of the Ray executor's tests keeps its session logs in ``ray``; uv,
# building the wheel in test_wheel.py, leaves its ``uv-*.lock`` files): not qconsist's to clean (the folder
# itself is removed after the check).
THIRD_PARTY_TEMPORARY = {".ses", "ray"}
THIRD_PARTY_PREFIXES = ("uv-",)


@pytest.fixture(scope="session", autouse=True)
def system_temporary_folder(tmp_path_factory: pytest.TempPathFactory):
    """The tests' own system temporary folder (``TMPDIR``, for this process and the commands it starts): at the
    end of the session it must hold nothing qconsist made — ``make test`` leaves nothing in /tmp."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    tmp_path_factory.getbasetemp()  # pytest's own folders stay where pytest puts them
    # a short path: Ray puts AF_UNIX sockets (at most 107 bytes) under it
    folder = Path(tempfile.mkdtemp(prefix="qconsist-tests-"))
    saved_env, saved_default = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved_default
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
    left = sorted(p.name for p in folder.iterdir()
                  if p.name not in THIRD_PARTY_TEMPORARY and not p.name.startswith(THIRD_PARTY_PREFIXES))
    shutil.rmtree(folder, ignore_errors=True)
    assert left == [], f"the tests left temporary files behind: {left}"


@pytest.fixture(autouse=True)
def cli_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test runs in its own temporary working directory, without colour, at a fixed width."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("CI", raising=False)
    return work


@pytest.fixture(scope="session")
def nsfw_run(tmp_path_factory: pytest.TempPathFactory):
    """A complete run of pipelines/open_nsfw.toml in a temporary runs directory: a ``PipelineResult``.

    ``nsfw_run.path`` is the run directory (``convert/``, ``optimize/``, ``quantize/`` models and
    ``manifest.json``); ``nsfw_run.artifacts[stage]`` their hashes; ``nsfw_run.repeat`` the repeated
    calibration (3 runs).
    """
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("nsfw-runs")
    return run_pipeline(load_pipeline(OPEN_NSFW_PIPELINE), runs_dir=runs, run_id="open_nsfw-fixture")


# --- small ONNX models built in code (pipeline, stage and calibration tests): tests/onnx_builders.py -----


@pytest.fixture(scope="session")
def small_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small ONNX models and calibration arrays built in code: ``pad_pool`` (-inf Pad), ``pad_pool_zero``
    (a 0 Pad), ``classifier``, ``arrays`` (12 samples 3×8×8) and ``arrays_b`` (12 other samples)."""
    folder = tmp_path_factory.mktemp("small-models")
    return {
        "pad_pool": build_pad_pool_model(folder / "pad_pool.onnx"),
        "pad_pool_zero": build_pad_pool_model(folder / "pad_pool_zero.onnx", 0.0),
        "classifier": build_classifier_model(folder / "classifier.onnx"),
        "arrays": save_arrays(folder / "arrays.npy", 12, seed=2),
        "arrays_b": save_arrays(folder / "arrays_b.npy", 12, seed=3),
    }
