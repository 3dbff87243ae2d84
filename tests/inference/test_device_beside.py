"""The device dump's dump session beside production (``recording.DeviceDump``), on the CPU: the GPU's fingerprint
kernels are stood in for by the host's fingerprints of the same session's outputs (``_HostKernels``: the same
``submit``/``collect`` protocol as ``device.DeviceDump``), so that the orchestration — which thread runs which
step, when the main thread waits, what an error becomes — is checked where no GPU is. The kernels themselves are
checked against the host's fingerprints on the GPU machine (tests/gpu/test_device_dump.py)."""

from __future__ import annotations

import contextlib
import threading
import types

import numpy as np
import pytest

from onnx_builders import build_classifier_model, save_arrays
from qconsist.diff import diff_runs
from qconsist.errors import UnsupportedModelError
from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
from qconsist.inference.fingerprint import RECORD, fingerprint
from qconsist.inputs import open_input_set


class _HostKernels:
    """``device.DeviceDump``'s protocol on the host: each step's records a step late, from ``session.run``."""

    calls: list[tuple[str, int]] = []
    fail_at: int | None = None

    def __init__(self, session, names, dtypes, batched, shapes, device_id=0, relaid=None):
        self.session, self.names, self.batched, self.shapes, self.device_id = session, list(names), list(batched), shapes, device_id
        self.cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda index: contextlib.nullcontext()))
        self.seconds = {"exposure": 0.0, "fingerprints": 0.0, "transfers": 0.0}
        self._pending = None

    def submit(self, step, count, host_columns=()):
        earlier = self.collect()
        _HostKernels.calls.append((threading.current_thread().name, count))
        if _HostKernels.fail_at is not None and len(_HostKernels.calls) == _HostKernels.fail_at:
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : a failure of the dump session's step")
        arrays = self.session.run(self.names, step)
        records = np.zeros((count, len(arrays)), RECORD)
        for column, array in enumerate(arrays):
            split = count > 1 and self.batched[column] and array.ndim and array.shape[0] == count
            for row in range(count):
                part = array[row:row + 1] if split else array
                records[row, column] = fingerprint(part, self.shapes.id(part.shape))
        self._pending = (records, {c: arrays[c] for c in host_columns})
        return earlier

    def collect(self):
        found, self._pending = self._pending, None
        return found


def _run(tmp_path, run_id, batch, device, monkeypatch, samples=7):
    import qconsist.inference.recording as recording
    import qconsist.inference.runner as runner

    if device:
        monkeypatch.setattr(recording, "GpuFingerprints", _HostKernels)
        monkeypatch.setattr(runner, "_on_device", lambda plan, request: plan is not None)
    model = build_classifier_model(tmp_path / "m.onnx", batch="N")
    data = save_arrays(tmp_path / "x.npy", samples, seed=3)
    inputs = open_input_set(data, None, "x")
    return run_inference(resolve_model(model), inputs, RunRequest(ExecutionOptions(graph_optimization_level="basic"), dump=True, batch_size=batch),
                         tmp_path / "runs", run_id=run_id)


def test_the_dump_session_runs_beside_production_after_each_sizes_first_step_and_records_as_the_host(tmp_path, monkeypatch):
    """7 samples at batch 3: steps of 3, 3, 1. The first step of each size runs on the main thread before
    production (the sessions' algorithm search undisturbed), the others in the dump's thread beside production;
    the records equal a host dump's, tensor for tensor, and the summary says the dump ran beside production."""
    _HostKernels.calls, _HostKernels.fail_at = [], None
    host = _run(tmp_path, "host", 3, False, monkeypatch)
    beside = _run(tmp_path, "device", 3, True, monkeypatch)
    assert _HostKernels.calls == [("MainThread", 3), ("qconsist-dump_0", 3), ("MainThread", 1)]
    assert beside.dump.faithful and beside.dump.beside_production and not host.dump.beside_production
    assert beside.dump.fingerprints_on == "device" and beside.dump.samples_checked == 7
    result = diff_runs(host.run_dir, beside.run_dir)
    assert result.tensors.compared == host.dump.tensors and result.tensors.samples == 7
    assert [n.label for n in result.tensors.nodes] == [] and result.passed


def test_a_failure_of_the_dump_session_beside_production_is_the_runs_one_line(tmp_path, monkeypatch):
    """onnxruntime failing in the dump's thread is the run's error in one line, as on the main thread, and the
    run directory is not left as a finished run."""
    _HostKernels.calls, _HostKernels.fail_at = [], 2  # the second step: the first that runs beside production
    with pytest.raises(UnsupportedModelError) as raised:
        _run(tmp_path, "device", 3, True, monkeypatch)
    assert str(raised.value) == ("onnxruntime cannot run the model (its dumped graph): a failure of the dump "
                                 "session's step")
    assert _HostKernels.calls[-1] == ("qconsist-dump_0", 3)
    assert not (tmp_path / "runs" / "device" / "manifest.json").exists()
