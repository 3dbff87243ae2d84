"""A probe: the run's float model quantized again by the pipeline's own quantize function with some nodes kept
in float, from the ranges the run calibrated (no calibration per probe), then run on the probe inputs as
production runs it and judged against the float model.

Probes differ only in ``nodes_to_exclude`` (or, for an alternative, in the quantize options given), so a
difference between two probes is the effect of that change alone. A probe whose quantized model is
byte-identical to one already measured (excluding a node that the quantizer left in float anyway) is not run
again: its figures are that model's. Every probe is measured once per analysis (cached by what it excludes).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import onnx

from qconsist.inference.session import ExecutionOptions, create_session, ort_logged, run_outputs
from qconsist.inputs import InputSet
from qconsist.sensitivity.figures import Figures, judge
from qconsist.sensitivity.source import QuantizedRun
from qconsist.stages.quantize import NothingQuantizedError, QuantizeOptions, quantize_model, quantizable_op_types

log = logging.getLogger(__name__)


@dataclass
class Probe:
    """One quantization measured: what it keeps in float beyond the run's own ``nodes_to_exclude``, its model's
    md5, its figures and what it cost."""

    excluded: tuple[str, ...]
    md5: str
    figures: Figures
    quantize_seconds: float = 0.0
    session_seconds: float = 0.0
    inference_seconds: float = 0.0
    same_model_as: tuple[str, ...] | None = None  # byte-identical to the probe excluding these: not run again
    options: dict | None = None  # quantize options that differ from the run's (an alternative), else None
    nothing_quantized: bool = False  # the list leaves no node quantized (the quantize stage refuses that): never proposed

    @property
    def seconds(self) -> float:
        return self.quantize_seconds + self.session_seconds + self.inference_seconds


@dataclass
class ProbeCost:
    """What the probes cost: quantizations, sessions (the float reference's included) and seconds by part."""

    quantizations: int = 0
    sessions: int = 0
    quantize_seconds: float = 0.0
    session_seconds: float = 0.0
    inference_seconds: float = 0.0
    reused: int = 0  # probes whose model was byte-identical to one measured before

    @property
    def seconds(self) -> float:
        return self.quantize_seconds + self.session_seconds + self.inference_seconds


def quantizable_nodes(model: onnx.ModelProto, options: QuantizeOptions) -> tuple[list[onnx.NodeProto], int]:
    """The nodes of ``model`` that onnxruntime's quantizer may quantize under ``options`` and that can be kept in
    float by name (an op it quantizes in the format, within ``op_types`` when given, not already excluded), and
    how many such nodes have no name (``nodes_to_exclude`` cannot name them)."""
    ops = set(options.op_types) or set(quantizable_op_types(options))
    excluded = set(options.nodes_to_exclude)
    eligible = [n for n in model.graph.node if n.op_type in ops and n.name not in excluded]
    return [n for n in eligible if n.name], sum(1 for n in eligible if not n.name)


@dataclass
class Prober:
    """Measures probes of ``run`` on ``inputs`` as ``execution`` runs them (see the module docstring)."""

    run: QuantizedRun
    inputs: InputSet
    execution: ExecutionOptions
    workdir: Path
    labels: Sequence[int | None] | None = None
    cost: ProbeCost = field(default_factory=ProbeCost)
    _reference: list | None = field(default=None, repr=False)
    _float_accuracy: float | None = field(default=None, repr=False)
    _probes: dict = field(default_factory=dict, repr=False)
    _by_md5: dict = field(default_factory=dict, repr=False)
    _kept: dict = field(default_factory=dict, repr=False)

    @property
    def probes(self) -> int:
        """How many probes were asked for (each distinct list and settings once)."""
        return len(self._probes)

    def measured(self) -> list[Probe]:
        """The probes whose model was run (one per distinct quantized model)."""
        return list(self._by_md5.values())

    def reference(self) -> list:
        """The float model's outputs on the probe inputs (one session, once)."""
        if self._reference is None:
            started = time.perf_counter()
            with ort_logged():
                session = create_session(self.run.float_model, self.execution)
                self.cost.sessions += 1
                made = time.perf_counter()
                self._reference = run_outputs(session, self.inputs)
            self.cost.session_seconds += made - started
            self.cost.inference_seconds += time.perf_counter() - made
        return self._reference

    def judge(self, outputs: list) -> Figures:
        """Outputs of a quantized model on the probe inputs, judged against the float model's."""
        figures = judge(self.reference(), outputs, self.run.judged(), self.labels, self._float_accuracy)
        self._float_accuracy = figures.float_accuracy
        return figures

    def options_for(self, excluded: Sequence[str], changes: dict | None = None) -> QuantizeOptions:
        """The run's quantize options with ``excluded`` added to its ``nodes_to_exclude`` and ``changes`` (settings
        as a pipeline file writes them, ``{"activation_type": "int16"}``) applied."""
        recorded = self.run.options.to_json()
        return QuantizeOptions.from_json({**recorded, **(changes or {}),
                                          "nodes_to_exclude": [*recorded["nodes_to_exclude"], *excluded]})

    def model(self, excluded: Sequence[str], changes: dict | None = None) -> Path:
        """The quantized model of a probe measured with ``keep=True``."""
        return self._kept[self._key(excluded, changes)]

    @staticmethod
    def _key(excluded: Sequence[str], changes: dict | None) -> tuple:
        return (frozenset(excluded), tuple(sorted((changes or {}).items())))

    def probe(self, excluded: Sequence[str], changes: dict | None = None, keep: bool = False) -> Probe:
        """The run's quantization with ``excluded`` also kept in float (and ``changes`` to its quantize options),
        measured; the same probe asked again is answered from the cache."""
        key = self._key(excluded, changes)
        if key in self._probes and (not keep or key in self._kept):
            return self._probes[key]
        self.reference()  # the float model first: its session is not counted in the probe's time
        path = self.workdir / f"probe-{len(self._probes) + len(self._kept)}.onnx"
        started = time.perf_counter()
        try:
            quantize_model(self.run.float_model, path, None, self.options_for(excluded, changes), self.run.calibration,
                           ranges=self.run.ranges)
        except NothingQuantizedError:  # everything in float: the float model's figures, and never a proposal
            self.cost.quantizations += 1
            self.cost.quantize_seconds += time.perf_counter() - started
            path.unlink(missing_ok=True)
            figures = self.judge(self.reference())
            result = Probe(tuple(excluded), "", figures, time.perf_counter() - started, options=dict(changes) if changes else None,
                           nothing_quantized=True)
            self._probes[key] = result
            return result
        quantized = time.perf_counter()
        self.cost.quantizations += 1
        self.cost.quantize_seconds += quantized - started
        md5 = hashlib.md5(path.read_bytes()).hexdigest()
        earlier = self._by_md5.get(md5)
        if earlier is not None:
            self.cost.reused += 1
            result = Probe(tuple(excluded), md5, earlier.figures, quantized - started, same_model_as=earlier.excluded,
                           options=dict(changes) if changes else None)
        else:
            with ort_logged():
                session = create_session(path, self.execution)
                made = time.perf_counter()
                outputs = run_outputs(session, self.inputs)
            ran = time.perf_counter()
            self.cost.sessions += 1
            self.cost.session_seconds += made - quantized
            self.cost.inference_seconds += ran - made
            figures = self.judge(outputs)
            result = Probe(tuple(excluded), md5, figures, quantized - started, made - quantized, ran - made,
                           options=dict(changes) if changes else None)
            self._by_md5[md5] = result
        if keep:
            self._kept[key] = path
        else:
            path.unlink(missing_ok=True)
        self._probes[key] = result
        log.info("probe %s: %s (%.2f s)", ", ".join(excluded) or "none in float", result.figures.describe(), result.seconds)
        return result
