"""A dump's start-up off the critical path (issue 31): the dump plan's exposed graph — ORT's optimized graph saved,
every tensor exposed, the dumping session made — needs no step of the model and is made at once beside the outputs'
batch-axis probe, only its splits wait for that probe; the device recorder's start (CuPy's import, its kernels)
is begun beside the start-up. Every error keeps its place in the start-up's order
(``runner._ORDER``): the plan's, the probe's and the recorder's lines are the ones the run gave before.

The orderings are checked with events, not with time: a probe that waits for the plan's session (bounded, so that
the old order ends in a failed assertion instead of a hang) only goes on because the session is made meanwhile."""

from __future__ import annotations

import json
import sys
import threading
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnx_builders import build_classifier_model, save_arrays
from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.errors import UnavailableError, UnsupportedModelError
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set

BOUND = 20.0  # seconds an event is waited for before the test gives up (the order it checks did not happen)


def _save(nodes, inputs, outputs, path, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _classifier_run(tmp_path, run_id, batch=2, samples=5, **request):
    model = build_classifier_model(tmp_path / "m.onnx", batch="N")
    inputs = open_input_set(save_arrays(tmp_path / "x.npy", samples, seed=3), None, "x")
    return run_inference(resolve_model(model), inputs, RunRequest(ExecutionOptions(graph_optimization_level="basic"),
                                                                  dump=True, batch_size=batch, **request),
                         tmp_path / "runs", run_id=run_id)


def _device_asked(monkeypatch):
    """The run fingerprints on the device, as ``--fingerprints device`` on the CUDA EP asks (this machine has no
    GPU: CuPy is not installed, so the device recorder's start fails as it does where CuPy is missing)."""
    import qconsist.inference.runner as runner

    monkeypatch.setattr(runner, "_on_device", lambda plan, request: plan is not None)
    monkeypatch.setattr(runner, "_device_asked", lambda request: True, raising=False)


def test_the_exposed_graph_is_made_while_the_outputs_probe_runs_and_only_the_splits_wait_for_it(tmp_path, monkeypatch):
    """The outputs' probe is held until the dump plan's session is made (at most ``BOUND``): the plan's session is
    made before the probe ends, the plan's splits (its steps of the probe's samples) after; the plan makes each of
    its sessions once (ORT's optimized graph saved, reloaded, exposed), and its records at batch 2 are batch 1's."""
    import qconsist.inference.dump as dump
    import qconsist.inference.runner as runner

    events, made = [], threading.Event()
    create, splits, output_splits = dump.create_session, dump.probe_splits, runner._output_splits

    def plan_session(*args, **kwargs):
        session = create(*args, **kwargs)
        if kwargs.get("optimized_model_filepath") is not None:
            events.append("optimized graph saved")
        elif kwargs.get("spinning") is False:  # the exposed graph's (its idle threads sleep)
            events.append("plan session")
            made.set()
        else:
            events.append("saved graph reloaded")  # dump.reloadable's check
        return session

    def probe(*args):
        events.append("probe begins")
        events.append("probe went on" if made.wait(BOUND) else "probe gave up waiting")
        found = output_splits(*args)
        events.append("probe ends")
        return found

    def plan_splits(*args):
        events.append("plan splits")
        return splits(*args)

    monkeypatch.setattr(dump, "create_session", plan_session)
    monkeypatch.setattr(dump, "probe_splits", plan_splits)
    monkeypatch.setattr(runner, "_output_splits", probe)
    two = _classifier_run(tmp_path, "two")
    assert "probe went on" in events, events
    assert events.index("plan session") < events.index("probe ends") < events.index("plan splits"), events
    assert [e for e in events if "graph" in e or "session" in e] == ["optimized graph saved", "saved graph reloaded",
                                                                     "plan session"], events
    monkeypatch.undo()
    one = _classifier_run(tmp_path, "one", batch=1)
    index = json.loads((two.run_dir / "dump" / "index.json").read_text())
    assert index["splits"] == [{"kind": "axis", "axis": 0, "size": 1}] * len(index["tensors"])
    assert two.dump.faithful and two.dump.samples_checked == 5 and two.dump.tensors == one.dump.tensors
    result = diff_runs(one.run_dir, two.run_dir)
    assert result.passed and result.tensors.compared == one.dump.tensors and result.tensors.samples == 5


def test_the_exposed_graph_does_not_wait_for_the_input_folder_to_be_listed(tmp_path, monkeypatch):
    """With ``--dynamic-batch`` most start-up parts wait in their threads for the inputs (the model's hashes, the
    re-stamp's sample and check, the probe): the inputs opened only once the plan's session is made (at most
    ``BOUND``), the plan still makes it — a thread is left for it (with 8 it waited for the listing: on the H200 the
    50,000 JPEGs' 1.31 s)."""
    import qconsist.inference.dump as dump

    made, create = threading.Event(), dump.create_session

    def plan_session(*args, **kwargs):
        session = create(*args, **kwargs)
        if kwargs.get("spinning") is False:
            made.set()
        return session

    def listed():
        listing = "listed after the plan's session" if made.wait(BOUND) else "listed without it"
        return listing, open_input_set(save_arrays(tmp_path / "x.npy", 5, seed=3), None, "x")

    opened = []
    monkeypatch.setattr(dump, "create_session", plan_session)
    model = build_classifier_model(tmp_path / "m.onnx", batch="N")
    run = run_inference(resolve_model(model), lambda: opened.append(listed()) or opened[-1][1],
                        RunRequest(ExecutionOptions(), dump=True, batch_size=2, dynamic_batch=True), tmp_path / "runs",
                        run_id="listed")
    assert [listing for listing, _ in opened] == ["listed after the plan's session"]
    assert run.dump.faithful and run.dump.samples_checked == 5


class _FakeCupy(types.ModuleType):
    """``cupy`` as ``device.start`` and ``device._cupy`` use it: ``cuda.Device`` entered, ``RawModule`` compiled; each
    use recorded with its thread. ``hold``: the first ``get_function`` waits for it (a load under way)."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        super().__init__("cupy")
        self.used: list[tuple[str, object]] = []
        self.loading = threading.Event()
        fake = self

        class Device:
            def __init__(self, index):
                self.index = index

            def __enter__(self):
                fake.used.append(("device", self.index))

            def __exit__(self, *exc):
                return False

        class RawModule:
            def __init__(self, code, options):
                fake.used.append(("compiled", threading.current_thread().name))

            def get_function(self, name):
                fake.loading.set()
                if hold is not None:
                    hold.wait(BOUND)
                return name

        self.cuda = types.SimpleNamespace(Device=Device)
        self.RawModule = RawModule


def test_cupys_start_beside_loads_the_kernels_once_on_the_runs_gpu_and_the_recorder_waits_for_it(monkeypatch):
    """``device.start`` (a start-up part) imports CuPy and loads the kernels in the run's GPU's context; the
    recorder's start (``_cupy`` on the main thread) meanwhile waits for that load instead of compiling them again."""
    import qconsist.inference.device as device

    hold = threading.Event()
    fake = _FakeCupy(hold)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(device, "_module", {})
    beside = threading.Thread(target=device.start, args=(3,), name="qconsist-start_0")
    beside.start()
    assert fake.loading.wait(BOUND)
    found = []
    recorder = threading.Thread(target=lambda: found.append(device._cupy()), name="recorder")
    recorder.start()
    hold.set()
    beside.join(BOUND)
    recorder.join(BOUND)
    assert found == [fake]
    assert fake.used == [("device", 3), ("compiled", "qconsist-start_0")]
    assert sorted(device._module) == ["chunk_stats", "fingerprint_arena", "segment_reduce"]


def test_cupy_missing_is_the_recorders_error_at_its_place_though_its_start_began_beside(tmp_path, monkeypatch):
    """CuPy's import fails in the start-up thread that begins it; the run's error is still the device recorder's
    line, raised by its start on the main thread, and no run is left behind."""
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy: ImportError, whether or not it is installed
    _device_asked(monkeypatch)
    with pytest.raises(UnavailableError) as raised:
        _classifier_run(tmp_path, "device")
    assert str(raised.value).startswith("on-device dumps need CuPy for CUDA 13: install qconsist[gpu] (cupy-cuda13x) (")
    assert list((tmp_path / "runs").iterdir()) == []


def _mixing_model(path):
    """y = ReduceSum over the batch: no sample owns a part of it."""
    return _save([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], path,
                 [numpy_helper.from_array(np.array([0], np.int64), "axes")])


def _input_output_model(path, reshape=False):
    """Outputs ``x`` (the input itself: the dump plan refuses it once ORT's optimized graph is saved) and ``y``
    (``reshape``: a Reshape to [4, -1] that fails on a step of one sample of 6 values, so the probe fails)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])] if reshape else [helper.make_node("Relu", ["x"], ["y"])]
    inits = [numpy_helper.from_array(np.array([4, -1], np.int64), "shape")] if reshape else []
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                  helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])], path, inits)


def test_an_unsplittable_final_output_is_the_plans_error_before_the_recorders(tmp_path, monkeypatch):
    """The plan refuses an output that mixes the samples (at its place, ``dump plan``); the device recorder, placed
    after it, would fail too (CuPy missing): the plan's line is the run's, as when the plan waited for the probe."""
    path = _mixing_model(tmp_path / "mix.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(2).normal(size=(4, 16)).astype(np.float32))
    monkeypatch.setitem(sys.modules, "cupy", None)
    _device_asked(monkeypatch)
    with pytest.raises(UnsupportedModelError) as raised:
        run_inference(resolve_model(path), open_input_set(tmp_path / "x.npy", None, "x"),
                      RunRequest(ExecutionOptions(), dump=True, batch_size=2), tmp_path / "runs", run_id="mix")
    assert str(raised.value) == ("output 'y' cannot be split into the samples of a step (it mixes the samples of a "
                                 "step); run with batch_size 1")
    assert list((tmp_path / "runs").iterdir()) == []


def test_the_plans_early_failure_waits_for_the_probes_error_placed_before_it(tmp_path):
    """The exposed graph fails at once (an output that is the model's input), the probe later (onnxruntime cannot
    run a step of one sample): the probe's line is the run's, exit 2, as when the plan began after the probe."""
    path = _input_output_model(tmp_path / "both.onnx", reshape=True)
    np.save(tmp_path / "x.npy", np.arange(24, dtype=np.float32).reshape(4, 6))
    result = CliRunner().invoke(app, ["run", str(path), "--inputs", str(tmp_path / "x.npy"), "--batch-size", "2",
                                      "--dump", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: onnxruntime cannot run model {path}: ")
    assert "input 'x' itself" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize("batch", [1, 2])
def test_the_plans_own_refusal_is_the_runs_line_before_the_recorders(tmp_path, monkeypatch, batch):
    """An output that is the model's input: production runs it, the plan refuses it (nothing computes it) in its
    thread beside production's session; with the device recorder failing after it, the plan's line is the run's."""
    path = _input_output_model(tmp_path / "same.onnx")
    np.save(tmp_path / "x.npy", np.arange(24, dtype=np.float32).reshape(4, 6))
    monkeypatch.setitem(sys.modules, "cupy", None)
    _device_asked(monkeypatch)
    with pytest.raises(UnsupportedModelError) as raised:
        run_inference(resolve_model(path), open_input_set(tmp_path / "x.npy", None, "x"),
                      RunRequest(ExecutionOptions(), dump=True, batch_size=batch), tmp_path / "runs", run_id="same")
    assert str(raised.value) == ("output 'x' is the model's input 'x' itself: no node computes it, so there is "
                                 "nothing to observe")
    assert list((tmp_path / "runs").iterdir()) == []
