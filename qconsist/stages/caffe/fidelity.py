"""The convert stage's own numerical check: the converted ONNX model (onnxruntime, CPU) against the numpy
reference of the Caffe network (``reference.py``) on one deterministic input.

Tolerance per output: ``atol + rtol * peak``, ``peak`` the greatest magnitude of the reference output.
``max_rel`` is the greatest absolute difference divided by that peak.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qconsist.stages.caffe import reference
from qconsist.stages.caffe.geometry import input_shapes
from qconsist.compare import TensorStats
from qconsist.inference.session import MEASUREMENT, create_session
from qconsist.errors import InputError
from qconsist.store.serde import serialized

SCHEMA = "qconsist.convert-check/1"
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
DEFAULT_SEED = 0


@dataclass
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    peak: float
    tolerance: float
    index: tuple[int, ...]  # where the greatest difference is
    passed: bool

    def describe(self) -> str:
        return (
            f"output '{self.name}': greatest absolute difference {self.max_abs:.3g} at {list(self.index)} "
            f"(relative to the output's peak {self.peak:.3g}: {self.max_rel:.3g}); tolerance {self.tolerance:.3g}"
        )


@serialized(
    schema=SCHEMA, derived=("passed", "max_abs", "max_rel", "tolerance"), error=InputError,
    refused="not a fidelity check (schema {found!r}, expected {schema})",
    malformed="fidelity check is malformed: {exc}",
)
@dataclass
class FidelityCheck:
    """ONNX (onnxruntime) vs the numpy Caffe reference on a seeded standard-normal input."""

    outputs: list[OutputCheck]
    seed: int
    rtol: float
    atol: float
    seconds: float = 0.0
    input_shapes: dict[str, list[int]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    @property
    def tolerance(self) -> float:
        """The tightest output tolerance (absolute)."""
        return min((o.tolerance for o in self.outputs), default=self.atol)


def compare(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> OutputCheck:
    """``actual`` against an independent reference, both as float64 (the comparison kernel's statistics),
    within ``atol + rtol · peak``: a reference computed in another precision and order agrees with the model
    to a share of the output's largest magnitude, not element by element."""

    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return OutputCheck(name, float("inf"), float("inf"), 0.0, 0.0, (), False)
    stats = TensorStats(name)
    stats.add(0, expected, actual)
    peak = float(np.abs(expected).max()) if expected.size else 0.0
    tolerance = atol + rtol * peak
    index = stats.max_abs_at[1] if stats.max_abs_at else ()
    max_abs = stats.max_abs
    return OutputCheck(name, max_abs, max_abs / peak if peak else max_abs, peak, tolerance, index, max_abs <= tolerance)


def seeded_inputs(net, seed: int = DEFAULT_SEED, batch: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in input_shapes(net).items():
        shape = (batch, *shape[1:]) if batch else shape
        out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def onnx_session(path: Path | bytes):
    """The converted model on the CPU, one intra-op thread (``qconsist.threads``)."""
    return create_session(path, MEASUREMENT)


def run_onnx(session, net, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feed Caffe-named inputs to the ONNX model (caffe2onnx renames them; inputs follow Caffe's order)."""
    feeds = {meta.name: inputs[blob] for meta, blob in zip(session.get_inputs(), input_shapes(net))}
    names = [meta.name for meta in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def check_fidelity(model: Path | bytes, net, weights, *, seed: int = DEFAULT_SEED, rtol: float = DEFAULT_RTOL,
                   atol: float = DEFAULT_ATOL, inputs: dict[str, np.ndarray] | None = None) -> FidelityCheck:
    start = time.perf_counter()
    inputs = inputs if inputs is not None else seeded_inputs(net, seed)
    expected = reference.forward(net, weights, inputs, dtype=np.float32)
    actual = run_onnx(onnx_session(model), net, inputs)
    outputs = []
    for (name, want), (onnx_name, got) in zip(expected.items(), actual.items()):
        outputs.append(compare(onnx_name, got, want, rtol, atol))
    return FidelityCheck(
        outputs=outputs, seed=seed, rtol=rtol, atol=atol, seconds=time.perf_counter() - start,
        input_shapes={k: list(v.shape) for k, v in inputs.items()},
    )
