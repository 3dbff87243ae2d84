"""Float vs quantized: how much error quantization puts into every tensor, ranked by node.

``diff`` compares two runs of one graph; a quantized model's graph is another graph (Q/DQ pairs, fused
QLinear kernels), so diff refuses it. ``quantization_error`` answers the other question — where does the
quantized model depart from the float one, and which node makes it depart — as onnxruntime's
``qdq_loss_debug`` and PPQ's layerwise analysis do, with two differences:

* **faithful**: the quantized model is observed through the dump machinery (``plan_dump``): ORT's optimized
  graph at the production level and execution provider, every tensor exposed, reloaded with optimizations
  off, its final outputs checked bit for bit against a production session. The values compared are those
  ORT computes in production — the uint8 outputs of fused QLinearConv kernels, in their NHWC layout where
  ORT chose it — not those of a copy with every tensor exposed, which blocks the fusions;
* **flat memory**: one sample at a time, per-tensor sums only (``NoiseStats``).

**Matching.** Every observed tensor of the quantized run is traced to the tensor of the float model it
stands for, through the quantized model as the quantizer wrote it: a DequantizeLinear output stands for its
QuantizeLinear's input (``relu_1_DequantizeLinear_Output`` → ``relu_1``); an integer tensor of a fused kernel
(QLinearConv's ``conv_1``) stands for the float tensor quantized where its value goes (``conv_1`` → Relu →
QuantizeLinear: ``relu_1``) and is dequantized with the scale and zero point ORT's graph gives it (the
producer's output scale, or its DequantizeLinear consumer's); a float tensor keeps its name. Constants
(dequantized weights and biases) and tensors internal to ORT's graph are left out and counted.

The float model is observed the same way at ``float_level`` (default ``disable``: every tensor of the float
graph exists; the level changes float results by rounding only, far below quantization noise).
"""

from __future__ import annotations

import logging
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.compare.noise import NoiseStats
from qconsist.errors import InputError, RunStoreError
from qconsist.inference.dump import DumpPlan, FaithfulCheck, plan_dump
from qconsist.inference.model import ModelSource, resolve_model
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session
from qconsist.inputs import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.serde import structure, to_jsonable

log = logging.getLogger(__name__)
SCHEMA = "qconsist.quant-error/1"

# Where a quantized kernel's output scale and zero point are among its inputs (onnx and com.microsoft ops).
_OUTPUT_PARAMS = {
    "QuantizeLinear": (1, 2), "QLinearConv": (6, 7), "QLinearAdd": (6, 7), "QLinearMul": (6, 7),
    "QLinearMatMul": (6, 7), "QGemm": (7, 8), "QLinearGlobalAveragePool": (3, 4), "QLinearAveragePool": (3, 4),
    "QLinearSigmoid": (3, 4), "QLinearLeakyRelu": (3, 4), "QLinearSoftmax": (3, 4), "QLinearConcat": (0, 1),
}
# Integer ops that move values without changing them: their output has their input's scale and zero point.
_PASS_THROUGH = {"Transpose", "Reshape", "MaxPool", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split"}
# Float ops the quantizer folds into the quantization of their input (a Relu after a Conv quantized as one).
_FOLDED = {"Relu", "Clip"}
_NHWC_TO_NCHW = (0, 3, 1, 2)
_QOPERATOR_SUFFIX = "_quantized"  # onnxruntime's QOperator quantizer names a quantized tensor <float name>_quantized


@dataclass
class TensorError:
    """One float tensor against its value in the quantized run, over every sample."""

    node: str  # the float model's node computing the tensor
    op_type: str
    tensor: str  # the float tensor
    observed: str  # the tensor of the quantized run it is compared with
    how: str  # "float" | "dequantized" | "dequantized, NHWC"
    position: int  # topological position in the float graph
    elements: int
    sqnr_db: float
    mse: float
    max_abs: float
    mean_abs: float
    cosine: float
    added_db: float | None = None  # SQNR lost at this node: its worst input's SQNR minus its own (None: no matched input)
    nonfinite: int = 0


@dataclass
class QuantErrorResult:
    """Per-node quantization error of a quantized model against its float model, worst first."""

    run: str
    float_stage: str
    quantized_stage: str
    float_options: dict[str, Any]
    quantized_options: dict[str, Any]
    inputs: dict[str, Any]
    samples: int
    tensors: list[TensorError]  # ranked: lowest SQNR first
    outputs: list[TensorError]  # the model's final outputs
    constants: int  # observed tensors left out: dequantized weights and biases
    internal: list[str] = field(default_factory=list)  # observed tensors with no float twin (ORT's own)
    faithful: bool = True  # both observations' final outputs bit-identical to production
    mismatched: list[str] = field(default_factory=list)  # which observation was not faithful, and how
    seconds: float = 0.0
    peak_rss_mb: float = 0.0

    @property
    def passed(self) -> bool:
        return self.faithful

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **to_jsonable(self.__dict__), "passed": self.passed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "QuantErrorResult":
        if data.get("schema") != SCHEMA:
            raise RunStoreError(f"quant-error result schema {data.get('schema')!r} is not {SCHEMA!r}")
        return structure(cls, {k: v for k, v in data.items() if k not in ("schema", "passed")})


# --- matching ---------------------------------------------------------------------------------------------------


class _Graph:
    """Producers, consumers and constants of one graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.constants = {init.name: init for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = attr.t
        self.tensors = set(self.producer) | {i.name for i in graph.input}
        self.by_name = {node.name: node for node in graph.node if node.name}

    def op(self, name: str) -> str | None:
        node = self.producer.get(name)
        return node.op_type if node is not None else None

    def scalar(self, name: str) -> float | int | None:
        if name not in self.constants:
            return None
        value = numpy_helper.to_array(self.constants[name])
        return value.reshape(()).item() if value.size == 1 else None


def _float_source(qgraph: _Graph, fgraph: _Graph, name: str) -> str | None:
    """The float tensor a quantized model's tensor stands for, walking back through DequantizeLinear and
    QuantizeLinear (a DequantizeLinear output that kept a float tensor's name, as a renamed graph output does,
    stands for it); ``None`` for a constant (a dequantized weight or bias)."""
    for _ in range(8):
        if name in fgraph.constants:
            return None
        node = qgraph.producer.get(name)
        if node is None or node.op_type not in ("DequantizeLinear", "QuantizeLinear"):
            return None if name in qgraph.constants else name
        if node.op_type == "DequantizeLinear" and name in fgraph.tensors:
            return name
        name = node.input[0]
    return name


def _quantized_where(qgraph: _Graph, name: str) -> str | None:
    """For a float tensor that a fused kernel holds quantized (QLinearConv's ``conv_1``): the float tensor
    quantized where its value goes, through ops the quantizer folds (``conv_1`` → Relu → ``relu_1``)."""
    for _ in range(4):
        consumers = qgraph.consumers.get(name, [])
        if len(consumers) != 1:
            return None
        node = consumers[0]
        if node.op_type == "QuantizeLinear":
            return name
        if node.op_type not in _FOLDED:
            return None
        name = node.output[0]
    return None


def _output_params(graph: _Graph, name: str) -> tuple[float, int] | None:
    """Scale and zero point of an integer tensor of ORT's graph: its DequantizeLinear consumer's, or its
    producer's output parameters (through ops that only move values)."""
    for _ in range(8):
        for node in graph.consumers.get(name, []):
            if node.op_type == "DequantizeLinear" and node.input[0] == name:
                scale = graph.scalar(node.input[1])
                zero = graph.scalar(node.input[2]) if len(node.input) > 2 and node.input[2] else 0
                return (scale, zero) if scale is not None and zero is not None else None
        node = graph.producer.get(name)
        if node is None:
            return None
        if node.op_type in _OUTPUT_PARAMS:
            s, z = _OUTPUT_PARAMS[node.op_type]
            scale = graph.scalar(node.input[s]) if len(node.input) > s else None
            zero = graph.scalar(node.input[z]) if len(node.input) > z and node.input[z] else 0
            return (scale, zero) if scale is not None and zero is not None else None
        if node.op_type not in _PASS_THROUGH:
            return None
        name = node.input[0]
    return None


def _channels_last(graph: _Graph, name: str) -> bool:
    node = graph.producer.get(name)
    return node is not None and any(a.name == "channels_last" and a.i == 1 for a in node.attribute)


@dataclass
class _Match:
    float_column: int
    quantized_column: int
    tensor: str
    observed: str
    params: tuple[float, int] | None  # dequantize with these
    how: str = "float"
    nhwc: bool | None = None  # decided on the first sample
    nhwc_hint: bool = False  # the producer computes channels last

    def value(self, array: np.ndarray, reference_shape: tuple[int, ...]) -> np.ndarray | None:
        if self.params is not None:  # as DequantizeLinear computes it: float32 (x - zero point) * scale
            scale, zero = self.params
            array = (array.astype(np.int32) - np.int32(zero)).astype(np.float32) * np.float32(scale)
        if self.nhwc is None:
            if array.shape == reference_shape and not (self.nhwc_hint and array.ndim == 4):
                self.nhwc = False
            elif array.ndim == 4 and tuple(array.shape[i] for i in _NHWC_TO_NCHW) == tuple(reference_shape):
                self.nhwc = True
            elif array.shape == reference_shape:
                self.nhwc = False
            else:
                return None
        if self.nhwc:
            array = np.transpose(array, _NHWC_TO_NCHW)
        return array if array.shape == reference_shape else None


def _named_start(origin: Any, qgraph: _Graph, integer: bool) -> str | None:
    """The quantized model's tensor an observed tensor holds: its mapped original, its own name, or — for the
    integer output of a fused kernel that ORT renamed — the output of the last non-Q/DQ node it computes."""
    if origin.original:
        return origin.original
    if origin.name in qgraph.tensors:
        return origin.name
    if integer:
        for node_name in (*reversed(origin.covers), origin.node):  # a fused kernel may keep its node's name
            node = qgraph.by_name.get(node_name)
            if node is not None and node.op_type not in ("QuantizeLinear", "DequantizeLinear") and node.output:
                return node.output[0]
    return None


def _folded_forward(fgraph: _Graph, qgraph: _Graph, tensor: str) -> str:
    """The float tensor a quantized value really holds when the quantizer folded the activation after it (a
    QOperator QLinearConv's output is the quantized Relu output): forward through a sole Relu or Clip that the
    quantized model no longer computes."""
    for _ in range(4):
        consumers = fgraph.consumers.get(tensor, [])
        if len(consumers) != 1 or consumers[0].op_type not in _FOLDED:
            return tensor
        after = consumers[0].output[0]
        if after in qgraph.tensors or after + _QOPERATOR_SUFFIX in qgraph.tensors:
            return tensor
        tensor = after
    return tensor


# preference when several observed tensors stand for one float tensor: the DequantizeLinear output ORT
# computes, then an integer tensor dequantized here, then a float computed before quantization
_PREFERENCE = {"DequantizeLinear output": 0, "dequantized": 1, "dequantized, NHWC": 1, "float": 2}


def match_tensors(float_plan: DumpPlan, quantized_plan: DumpPlan, quantized_model: onnx.ModelProto,
                  quantized_optimized: onnx.ModelProto, float_model: onnx.ModelProto) -> tuple[list[_Match], int, list[str]]:
    """The observed quantized tensors matched to observed float tensors (one per float tensor, by
    ``_PREFERENCE``); the number of constants left out; the labels of observed tensors with no float twin."""
    qgraph, optimized, fgraph = _Graph(quantized_model), _Graph(quantized_optimized), _Graph(float_model)
    float_columns = {t.original: i for i, t in enumerate(float_plan.tensors) if t.original and t.how == "same"}
    float_columns.update({i.name: -1 for i in float_model.graph.input if i.name not in fgraph.constants})  # the sample itself
    found: dict[str, _Match] = {}
    constants, internal = 0, []
    for column, (origin, dtype) in enumerate(zip(quantized_plan.tensors, quantized_plan.dtypes)):
        integer = np.dtype(dtype).kind in "iu"
        start = _named_start(origin, qgraph, integer)
        if start is None:
            internal.append(origin.label)
            continue
        if integer and start.endswith(_QOPERATOR_SUFFIX) and start[:-len(_QOPERATOR_SUFFIX)] in fgraph.tensors:
            tensor = start[:-len(_QOPERATOR_SUFFIX)]  # a QOperator model's integer tensor: <float name>_quantized
        else:
            if integer and qgraph.op(start) != "QuantizeLinear" and start not in qgraph.constants:
                start = _quantized_where(qgraph, start) or ""
            tensor = _float_source(qgraph, fgraph, start) if start else ""
        if tensor is None:
            constants += 1
            continue
        tensor = _folded_forward(fgraph, qgraph, tensor)
        if tensor not in float_columns:
            internal.append(origin.label)
            continue
        if integer:
            params = _output_params(optimized, origin.name)
            if params is None:
                internal.append(origin.label)
                continue
            how = "dequantized"
        elif qgraph.op(start) == "DequantizeLinear":
            params, how = None, "DequantizeLinear output"
        elif qgraph.op(start) == fgraph.op(tensor):
            params, how = None, "float"
        else:  # the float value before quantization of a tensor whose activation the quantizer folded away
            internal.append(origin.label)
            continue
        match = _Match(float_columns[tensor], column, tensor, origin.name, params, how)
        match.nhwc_hint = integer and _channels_last(optimized, origin.name)
        if tensor not in found or _PREFERENCE[how] < _PREFERENCE[found[tensor].how]:
            found[tensor] = match
    return sorted(found.values(), key=lambda m: m.float_column), constants, internal


# --- the run ----------------------------------------------------------------------------------------------------


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def _added(errors: dict[str, TensorError], float_model: onnx.ModelProto) -> None:
    """Each tensor's SQNR lost at its node: the worst SQNR among the nearest matched tensors upstream (through
    float tensors with no quantized twin, such as a Conv output quantized with its Relu) minus its own."""
    graph = _Graph(float_model)

    def upstream(name: str, depth: int = 0) -> list[float]:
        node = graph.producer.get(name)
        if node is None or depth > 4:
            return []
        found: list[float] = []
        for source in node.input:
            if source in errors:
                found.append(errors[source].sqnr_db)
            elif source and source not in graph.constants:
                found += upstream(source, depth + 1)
        return found

    for error in errors.values():
        inputs = upstream(error.tensor)
        if inputs:
            error.added_db = min(inputs) - error.sqnr_db


def _load(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - onnx raises several kinds
        raise InputError(f"cannot read {path}: {exc}") from None


def quantization_error(
    run_dir: Path,
    inputs: InputSet,
    options: ExecutionOptions = ExecutionOptions(),
    *,
    float_stage: str = "optimize",
    quantized_stage: str = "quantize",
    float_level: OptimizationLevel | str = OptimizationLevel.DISABLE,
    progress: Progress = NULL_PROGRESS,
) -> QuantErrorResult:
    """Per-node error of ``run_dir``'s ``quantized_stage`` model against its ``float_stage`` model on
    ``inputs``, the quantized model observed as ``options`` run it (see the module docstring)."""
    started = time.perf_counter()
    float_source: ModelSource = resolve_model(run_dir, float_stage)
    quantized_source: ModelSource = resolve_model(run_dir, quantized_stage)
    float_options = options.with_options(graph_optimization_level=float_level)
    float_model, quantized_model = _load(float_source.path), _load(quantized_source.path)
    if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               for n in quantized_model.graph.node):
        raise InputError(f"the {quantized_stage} model of {run_dir} has no quantized node: nothing to compare")
    with tempfile.TemporaryDirectory(prefix="qconsist-quant-error-") as scratch:
        float_plan = plan_dump(float_source.path, float_options, Path(scratch) / "float")
        quantized_plan = plan_dump(quantized_source.path, options, Path(scratch) / "quantized")
        matches, constants, internal = match_tensors(float_plan, quantized_plan, quantized_model,
                                                     _load(quantized_plan.optimized_path), float_model)
    if not matches:
        raise InputError(f"no tensor of the {quantized_stage} model of {run_dir} matches a tensor of its "
                         f"{float_stage} model: is it the quantization of that model?")
    productions = {"float": create_session(float_source.path, float_options), "quantized": create_session(quantized_source.path, options)}
    checks = {"float": FaithfulCheck(), "quantized": FaithfulCheck()}
    stats = [NoiseStats() for _ in matches]
    unmatched_layout: set[int] = set()
    float_names = [float_plan.tensors[m.float_column].name for m in matches if m.float_column >= 0]
    quantized_names = [quantized_plan.tensors[m.quantized_column].name for m in matches]
    plans = {"float": (float_plan, float_names), "quantized": (quantized_plan, quantized_names)}
    with progress.task("quant-error", len(inputs)) as task:
        for index in range(len(inputs)):
            sample = inputs.sample(index)
            observed = {}
            for side, (plan, names) in plans.items():
                wanted = list(dict.fromkeys([*names, *plan.outputs]))
                arrays = dict(zip(wanted, plan.session.run(wanted, sample)))  # type: ignore[attr-defined]
                checks[side].add(index, productions[side].run(None, sample), [arrays[o] for o in plan.outputs])
                observed[side] = [arrays[n] for n in names]
            references = iter(observed["float"])
            observed["float"] = [sample[m.tensor] if m.float_column < 0 else next(references) for m in matches]
            for i, (match, reference, value) in enumerate(zip(matches, observed["float"], observed["quantized"])):
                if i in unmatched_layout:
                    continue
                converted = match.value(value, reference.shape)
                if converted is None:
                    unmatched_layout.add(i)
                    continue
                stats[i].add(reference, converted)
            task.advance()
    labels = {t.original: t.label for t in float_plan.tensors if t.original}
    ops = {out: n.op_type for n in float_model.graph.node for out in n.output}
    errors: dict[str, TensorError] = {}
    for i, (match, stat) in enumerate(zip(matches, stats)):
        if i in unmatched_layout:
            internal.append(quantized_plan.tensors[match.quantized_column].label)
            continue
        how = match.how + (", NHWC" if match.nhwc else "")
        errors[match.tensor] = TensorError(
            node=labels.get(match.tensor, match.tensor), op_type=ops.get(match.tensor, "input"), tensor=match.tensor,
            observed=match.observed, how=how, position=match.float_column, elements=stat.elements // max(len(inputs), 1),
            sqnr_db=stat.sqnr_db, mse=stat.mse, max_abs=stat.max_abs, mean_abs=stat.mean_abs, cosine=stat.cosine,
            nonfinite=stat.nonfinite,
        )
    _added(errors, float_model)
    final = set(float_plan.outputs)
    mismatched = [f"{side}: final outputs of {len(c.mismatched)}/{c.samples} samples differ from production "
                  f"(max abs diff {c.max_abs_diff:.3g})" for side, c in checks.items() if not c.faithful]
    return QuantErrorResult(
        run=str(run_dir), float_stage=float_stage, quantized_stage=quantized_stage,
        float_options=float_options.to_json(), quantized_options=options.to_json(),
        inputs=inputs.describe(), samples=len(inputs),
        tensors=sorted((e for e in errors.values() if e.tensor not in final), key=lambda e: (e.sqnr_db, e.position)),
        outputs=[errors[o] for o in float_plan.outputs if o in errors],
        constants=constants, internal=internal, faithful=not mismatched, mismatched=mismatched,
        seconds=time.perf_counter() - started, peak_rss_mb=_peak_rss_mb(),
    )
