"""Stage optimize: ONNX Runtime's own offline graph tools, parameters recorded, outputs checked.

Two methods:

* ``quant_pre_process`` (default): ``onnxruntime.quantization.shape_inference.quant_pre_process``, the
  preparation ORT recommends before ``quantize_static`` (ORT's basic-level graph optimizations, then ONNX
  shape inference). Symbolic shape inference (for transformer-style dynamic shapes, needs sympy) is off
  unless ``symbolic_shape = true``.
* ``session``: an ORT session at a recorded graph-optimization level writes its optimized graph
  (``SessionOptions.optimized_model_filepath``). Levels above ``basic`` may emit ORT-only fused operators.

``name_nodes = true``: after the tool, every node of the main graph the model leaves unnamed gets a name derived
from its op type and its position in the optimized graph (``Sigmoid_118``: the name qconsist's reports call
``~Sigmoid_118``, without the mark; a name already taken gets ``_1``, ``_2``… after it). The names given are
recorded (``named_nodes``), and the named model is the one checked. Then ``[quantize] nodes_to_exclude`` and
``qconsist sensitivity`` can name every node of an export that names none (a PyTorch export's often).

Check: the optimized model's outputs against the original's on real evaluation inputs, elementwise
``|opt - orig| <= atol + rtol * |orig|``; greatest absolute and relative difference and the tolerance are
recorded, and a mismatch raises ``FidelityError``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

from qconsist.compare import OutputComparison, compare_outputs
from qconsist.errors import ConfigError, FidelityError, UnsupportedModelError
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session, ort_level, ort_logged, ort_message, outputs_of
from qconsist.inputs.inputset import InputSet
from qconsist.onnxfile import INVENTED_MARK, invented_name, read_onnx
from qconsist.store.atomic import write_atomic
from qconsist.tomlfile import guard
from qconsist.stages.base import StageRecord
from qconsist.store.hashing import hash_artifact
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)


class OptimizeMethod(str, Enum):
    PRE_PROCESS = "quant_pre_process"
    SESSION = "session"


_STATE = ort.capi.onnxruntime_pybind11_state
# what ORT's tools raise on a model they cannot handle (anything else is a bug and keeps its traceback)
_TOOL_ERRORS = (
    _STATE.Fail, _STATE.InvalidGraph, _STATE.InvalidArgument, _STATE.NotImplemented, _STATE.InvalidProtobuf,
    onnx.checker.ValidationError, onnx.shape_inference.InferenceError, RuntimeError, ValueError,
)

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4


@serialized
@dataclass(frozen=True)
class OptimizeOptions:
    method: OptimizeMethod = OptimizeMethod.PRE_PROCESS
    level: OptimizationLevel = OptimizationLevel.BASIC  # session method only; quant_pre_process applies ORT's basic level
    skip_optimization: bool = False  # quant_pre_process: shape inference only
    symbolic_shape: bool = False  # quant_pre_process: symbolic shape inference (needs sympy)
    name_nodes: bool = False  # give unnamed nodes stable names (op type and position), recorded
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL

    def __post_init__(self) -> None:
        if not isinstance(self.name_nodes, bool):
            raise ConfigError(f"optimize.name_nodes must be true or false, got {self.name_nodes!r}")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ConfigError(f"optimize.{name} must be a number >= 0, got {value!r}")
        if self.method is OptimizeMethod.SESSION and (self.skip_optimization or self.symbolic_shape):
            raise ConfigError("optimize.skip_optimization and optimize.symbolic_shape apply to method quant_pre_process only")
        if self.level is OptimizationLevel.DISABLE:
            raise ConfigError("optimize.level disable optimizes nothing; choose basic, extended or all")
        if self.method is OptimizeMethod.PRE_PROCESS and self.level is not OptimizationLevel.BASIC:
            raise ConfigError("optimize.level applies to method \"session\" only (quant_pre_process uses ORT's basic level)")

    def tool_params(self) -> dict[str, Any]:
        """The exact arguments given to ORT's tool, for the manifest."""
        if self.method is OptimizeMethod.SESSION:
            return {
                "tool": "onnxruntime.SessionOptions.optimized_model_filepath",
                "graph_optimization_level": ort_level(self.level).name,
                "providers": ["CPUExecutionProvider"],
            }
        return {
            "tool": "onnxruntime.quantization.shape_inference.quant_pre_process",
            "skip_optimization": self.skip_optimization,
            "skip_onnx_shape": False,
            "skip_symbolic_shape": not self.symbolic_shape,
            "auto_merge": False,
            "int_max": 2**31 - 1,
            "guess_output_rank": False,
        }


@serialized
@dataclass
class OptimizeResult:
    path: Path
    seconds: float
    params: dict[str, Any]
    nodes_before: int
    nodes_after: int
    check: OutputComparison | None = None
    named_nodes: dict[str, str] = field(default_factory=dict)  # name_nodes: name given -> op type


def _pre_process(source: Path, target: Path, options: OptimizeOptions) -> None:
    params = options.tool_params()
    with ort_logged():  # its optimizer session logs at onnxruntime's default level
        _quant_pre_process(source, target, params)


def _quant_pre_process(source: Path, target: Path, params: dict) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(
        str(source), str(target),
        skip_optimization=params["skip_optimization"], skip_onnx_shape=params["skip_onnx_shape"],
        skip_symbolic_shape=params["skip_symbolic_shape"], auto_merge=params["auto_merge"],
        int_max=params["int_max"], guess_output_rank=params["guess_output_rank"],
    )


def _session_optimize(source: Path, target: Path, options: OptimizeOptions) -> None:
    create_session(source, ExecutionOptions(graph_optimization_level=options.level), optimized_model_filepath=target)


def name_unnamed_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """Name every unnamed node of ``model``'s main graph after its op type and position (``Sigmoid_118``, the name
    qconsist's reports invent for it, without the mark; ``_1``, ``_2``… after a name already taken), in place.
    Returns the names given, each with its op type, in graph order."""
    taken = {node.name for node in model.graph.node if node.name}
    given: dict[str, str] = {}
    for index, node in enumerate(model.graph.node):
        if node.name:
            continue
        base = invented_name(node.op_type, index).removeprefix(INVENTED_MARK)
        name, suffix = base, 0
        while name in taken:
            suffix += 1
            name = f"{base}_{suffix}"
        node.name = name
        taken.add(name)
        given[name] = node.op_type
    return given


def _node_count(path: Path) -> int:
    return len(read_onnx(path).graph.node)


def optimize_model(
    source: Path,
    output: Path,
    options: OptimizeOptions = OptimizeOptions(),
    evaluation: InputSet | None = None,
) -> OptimizeResult:
    """Optimize ``source`` into ``output`` (written atomically) and check it on ``evaluation``.

    Raises ``FidelityError`` when an output differs beyond ``options.atol``/``rtol``.
    """
    source, output = Path(source), Path(output)
    start = time.perf_counter()
    with scratch_dir("qconsist-optimize-") as tmp:
        staged = Path(tmp) / "model.onnx"
        try:
            if options.method is OptimizeMethod.SESSION:
                _session_optimize(source, staged, options)
            else:
                _pre_process(source, staged, options)
        except ImportError as exc:
            raise ConfigError(f"optimize: {exc}") from None
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"optimize: {exc.message}") from None
        except _TOOL_ERRORS as exc:
            raise UnsupportedModelError(f"optimize: onnxruntime cannot optimize {source}: {ort_message(exc)}") from None
        named: dict[str, str] = {}
        if options.name_nodes:
            model = read_onnx(staged, external_data=True)
            named = name_unnamed_nodes(model)
            onnx.save(model, str(staged))
        write_atomic(output, lambda tmp_path: tmp_path.write_bytes(staged.read_bytes()))
    seconds = time.perf_counter() - start
    result = OptimizeResult(
        path=output, seconds=seconds, params=options.to_json() | options.tool_params(),
        nodes_before=_node_count(source), nodes_after=_node_count(output), named_nodes=named,
    )
    log.info("optimized %s -> %s (%d -> %d nodes) in %.2f s", source, output, result.nodes_before, result.nodes_after, seconds)
    if evaluation is not None:
        result.check = check_optimized(source, output, evaluation, options)
    return result


def check_optimized(source: Path, optimized: Path, evaluation: InputSet, options: OptimizeOptions) -> OutputComparison:
    """Compare optimized and original outputs on ``evaluation``; ``FidelityError`` beyond the tolerance."""
    reference = outputs_of(source, evaluation)
    candidate = outputs_of(optimized, evaluation)
    comparison = compare_outputs(reference, candidate, atol=options.atol, rtol=options.rtol)
    if not comparison.passed:
        raise FidelityError(f"optimize changed the model's outputs beyond tolerance: {comparison.summary()}")
    return comparison


class OptimizeStage:
    """ONNX Runtime's offline optimization, checked against the previous stage's outputs."""

    name = "optimize"
    order = 20
    optional = False
    produces_float = True
    options_type = OptimizeOptions

    def parse(self, table, base: Path) -> OptimizeOptions:
        if table is None:
            return OptimizeOptions()

        options = guard(table, lambda: OptimizeOptions(
            method=table.choice("method", OptimizeMethod, OptimizeMethod.PRE_PROCESS),
            level=table.choice("level", OptimizationLevel, OptimizationLevel.BASIC),
            skip_optimization=table.get("skip_optimization", bool, False),
            symbolic_shape=table.get("symbolic_shape", bool, False),
            name_nodes=table.get("name_nodes", bool, False),
            atol=table.get("atol", float, OptimizeOptions.atol), rtol=table.get("rtol", float, OptimizeOptions.rtol),
        ))
        table.finish()
        return options

    def run(self, source: Path | None, target: Path, options: OptimizeOptions, context):  # -> StageRecord

        evaluation = context.evaluation(source) if context.evaluation else None
        result = optimize_model(source, target, options, evaluation)
        checks = {f"outputs_vs_{context.previous}": result.check.to_json() if result.check is not None else None,
                  "nodes_before": result.nodes_before, "nodes_after": result.nodes_after,
                  **({"named_nodes": result.named_nodes} if options.name_nodes else {})}
        return StageRecord(self.name, target, result.params, hash_artifact(target, context.root), checks,
                           result.seconds, result=result)


STAGE = OptimizeStage()
