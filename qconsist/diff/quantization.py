"""Float vs quantized: how much error quantization puts into every tensor, ranked by node.

``diff`` compares two runs of one graph; a quantized model's graph is another graph (Q/DQ pairs, fused
QLinear kernels), so diff refuses it. ``quantization_error`` answers the other question — where does the
quantized model depart from the float one, and which node makes it depart — as onnxruntime's
``qdq_loss_debug`` and PPQ's layerwise analysis do, with two differences:

* **faithful**: the quantized model is observed through the dump machinery (``plan_dump``): ORT's optimized
  graph at the production level and execution provider, every tensor exposed, reloaded with optimizations
  off, its final outputs checked bit for bit against a production session. The values compared are those
  ORT computes in production — the uint8 outputs of fused QLinearConv kernels, put back from their NHWC
  layout where ORT chose it (the permutation read from the graph, never from shapes) — not those of a copy
  with every tensor exposed, which blocks the fusions;
* **flat memory**: one sample at a time, per-tensor sums only (``NoiseStats``).

**Matching** (``float_twins.py``): every observed tensor of the quantized run is traced to the float tensor
it stands for; constants and tensors internal to ORT's graph are left out and counted.

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

import onnx

from qconsist.compare.noise import NoiseStats
from qconsist.compare.statistics import IDENTICAL, MEASURED
from qconsist.cpu import instruction_set
from qconsist.errors import InputError, RunStoreError
from qconsist.diff.float_twins import Graph, Match, match_tensors, match_weights
from qconsist.inference.dump import DumpPlan, FaithfulCheck, plan_dump
from qconsist.inference.graphmap import node_reads
from qconsist.inference.layout import to_original
from qconsist.onnxfile import is_invented, read_onnx
from qconsist.store.run import Run
from qconsist.inference.model import ModelSource, resolve_model
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session, measurement_options
from qconsist.inputs import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)
SCHEMA = "qconsist.quant-error/1"

@dataclass
class TensorError:
    """One float tensor against its value in the quantized run, over every sample."""

    node: str  # the float model's node computing the tensor
    op_type: str
    tensor: str  # the float tensor
    observed: str  # the tensor of the quantized run it is compared with
    how: str  # "float" | "dequantized" | "DequantizeLinear output", with ", NHWC" where ORT held it so
    position: int  # topological position in the float graph
    elements: int
    sqnr_db: float
    mse: float
    max_abs: float
    mean_abs: float
    cosine: float
    added_db: float | None = None  # SQNR lost at this node: its worst measured input's SQNR minus its own (None: none)
    nonfinite: int = 0
    figure: str = MEASURED  # "identical" / "zero-signal": no SQNR measured (``qconsist.compare.statistics``)
    noise_starts: bool = False  # measured, while every matched input upstream is identical: all its noise is added here
    invented: bool = False  # ``node`` is a name qconsist invented for an unnamed node ("~Sigmoid_118")

    @property
    def measured(self) -> bool:
        return self.figure == MEASURED


@serialized(
    schema=SCHEMA, derived=("passed",), error=RunStoreError,
    refused="quant-error result schema {found!r} is not {schema!r}",
    malformed="quant-error result is malformed: {exc}",
)
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
    constants: int  # observed tensors left out: dequantized weights and biases (compared in ``weights``)
    weights: list[TensorError] = field(default_factory=list)  # every dequantized weight and bias, lowest SQNR first
    internal: list[str] = field(default_factory=list)  # observed tensors with no float twin (ORT's own)
    faithful: bool = True  # both observations' final outputs bit-identical to production
    mismatched: list[str] = field(default_factory=list)  # which observation was not faithful, and how
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    instruction_set: dict[str, Any] = field(default_factory=dict)  # where the sessions ran (qconsist.cpu.InstructionSet)

    @property
    def passed(self) -> bool:
        return self.faithful

    def __bool__(self) -> bool:
        return self.passed


# --- the run ----------------------------------------------------------------------------------------------------


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def _added(errors: dict[str, TensorError], float_model: onnx.ModelProto) -> None:
    """Each measured tensor's SQNR lost at its node: the worst measured SQNR among the nearest matched tensors
    upstream (through float tensors with no quantized twin, such as a Conv output quantized with its Relu) minus
    its own. Identical and zero-signal tensors have no SQNR, so nothing is added at them (``added_db`` None) and
    they lend none to their consumers: a measured tensor whose matched inputs are all identical is where the
    noise starts (``noise_starts``), never "337 dB added"."""
    graph = Graph(float_model)

    def upstream(name: str, depth: int = 0) -> list[TensorError]:
        node = graph.producer.get(name)
        if node is None or depth > 4:
            return []
        found: list[TensorError] = []
        for source in node_reads(node):  # with the outer tensors its subgraphs read
            if source in errors:
                found.append(errors[source])
            elif source and source not in graph.constants:
                found += upstream(source, depth + 1)
        return found

    for error in errors.values():
        if not error.measured:
            continue
        inputs = upstream(error.tensor)
        measured = [e.sqnr_db for e in inputs if e.measured]
        if measured:
            error.added_db = min(measured) - error.sqnr_db
        elif inputs and all(e.figure == IDENTICAL for e in inputs):
            error.noise_starts = True


def ranked_by_added(errors: list[TensorError]) -> list[TensorError]:
    """``--sort added``: where the noise starts first, then the greatest SQNR added; identical and zero-signal
    tensors (no SQNR) last."""
    return sorted(errors, key=lambda e: (not e.measured, not e.noise_starts, -(e.added_db or 0.0), e.position))


def _load(path: Path) -> onnx.ModelProto:
    return read_onnx(path, external_data=True)


def _observe(matches: list[Match], plans: dict[str, Any], productions: dict[str, Any], inputs: InputSet,
             progress: Progress) -> tuple[list[NoiseStats], dict[str, FaithfulCheck], set[int]]:
    """Run every sample through both observed graphs and both production sessions, one sample at a time:
    the noise of every match, each side's faithfulness, and the matches whose layout could not be read."""
    checks = {side: FaithfulCheck() for side in plans}
    stats = [NoiseStats() for _ in matches]
    unreadable: set[int] = set()
    names = {"float": [plans["float"].tensors[m.float_column].name for m in matches if m.float_column >= 0],
             "quantized": [plans["quantized"].tensors[m.quantized_column].name for m in matches]}
    float_layouts = [plans["float"].tensors[m.float_column].layout for m in matches if m.float_column >= 0]
    with progress.task("quant-error", len(inputs)) as task:
        for index in range(len(inputs)):
            sample = inputs.sample(index)
            observed = {}
            for side, plan in plans.items():
                wanted = list(dict.fromkeys([*names[side], *plan.outputs]))
                arrays = dict(zip(wanted, plan.session.run(wanted, sample)))
                checks[side].add(index, productions[side].run(None, sample), [arrays[o] for o in plan.outputs])
                observed[side] = [arrays[n] for n in names[side]]
            references = iter(to_original(a, p) for a, p in zip(observed["float"], float_layouts))
            for i, (match, value) in enumerate(zip(matches, observed["quantized"])):
                reference = sample[match.tensor] if match.float_column < 0 else next(references)  # a graph input: the sample
                if i in unreadable:
                    continue
                converted = match.value(value, reference.shape)
                if converted is None:
                    unreadable.add(i)
                    continue
                stats[i].add(reference, converted)
            task.advance()
    return stats, checks, unreadable


def _tensor_errors(matches: list[Match], stats: list[NoiseStats], unreadable: set[int], internal: list[str],
                   float_plan: DumpPlan, quantized_plan: DumpPlan, float_model: onnx.ModelProto, samples: int) -> dict[str, TensorError]:
    """Per matched tensor, its error (by tensor name); the matches whose layout could not be read go to ``internal``."""
    labels = {t.original: t.label for t in float_plan.tensors if t.original}
    ops = {out: n.op_type for n in float_model.graph.node for out in n.output}
    errors: dict[str, TensorError] = {}
    for i, (match, stat) in enumerate(zip(matches, stats)):
        if i in unreadable:
            internal.append(quantized_plan.tensors[match.quantized_column].label)
            continue
        errors[match.tensor] = TensorError(
            node=labels.get(match.tensor, match.tensor), op_type=ops.get(match.tensor, "input"), tensor=match.tensor,
            observed=match.observed, how=match.described, position=match.float_column, elements=stat.elements // max(samples, 1),
            sqnr_db=stat.sqnr_db, mse=stat.mse, max_abs=stat.max_abs, mean_abs=stat.mean_abs, cosine=stat.cosine,
            nonfinite=stat.nonfinite, figure=stat.figure, invented=is_invented(labels.get(match.tensor, "")),
        )
    _added(errors, float_model)
    return errors


def _weight_errors(quantized_model: onnx.ModelProto, float_model: onnx.ModelProto) -> list[TensorError]:
    """The error of each quantized weight against its float twin."""
    weights = []
    for twin in match_weights(quantized_model, float_model):
        stat = NoiseStats()
        stat.add(twin.float_value, twin.dequantized)
        weights.append(TensorError(
            node=twin.consumer, op_type=twin.op_type, tensor=twin.tensor, observed=twin.stored,
            how="constant, per channel" if twin.per_channel else "constant", position=-1, elements=stat.elements,
            sqnr_db=stat.sqnr_db, mse=stat.mse, max_abs=stat.max_abs, mean_abs=stat.mean_abs, cosine=stat.cosine,
            nonfinite=stat.nonfinite, figure=stat.figure, invented=is_invented(twin.consumer)))
    return weights


def quantization_error(
    run: Run | Path,
    inputs: InputSet,
    options: ExecutionOptions = ExecutionOptions(),
    *,
    float_stage: str = "optimize",
    quantized_stage: str = "quantize",
    float_level: OptimizationLevel | str = OptimizationLevel.DISABLE,
    progress: Progress = NULL_PROGRESS,
) -> QuantErrorResult:
    """Per-node error of ``run``'s ``quantized_stage`` model against its ``float_stage`` model on
    ``inputs``, the quantized model observed as ``options`` run it (see the module docstring)."""
    started = time.perf_counter()
    run = run if isinstance(run, Run) else Run.open(run)
    run_dir = run.path
    float_source: ModelSource = resolve_model(run, float_stage)
    quantized_source: ModelSource = resolve_model(run, quantized_stage)
    # the float model is the reference: measured with one intra-op thread unless a count is given (qconsist.threads)
    float_options = measurement_options(options.with_options(graph_optimization_level=float_level))
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
    stats, checks, unmatched_layout = _observe(matches, {"float": float_plan, "quantized": quantized_plan}, productions,
                                               inputs, progress)
    errors = _tensor_errors(matches, stats, unmatched_layout, internal, float_plan, quantized_plan, float_model, len(inputs))
    weights = _weight_errors(quantized_model, float_model)
    final = set(float_plan.outputs)
    mismatched = [f"{side}: final outputs of {len(c.mismatched)}/{c.samples} samples differ from production "
                  f"(max abs diff {c.max_abs_diff:.3g})" for side, c in checks.items() if not c.faithful]
    return QuantErrorResult(
        run=str(run_dir), float_stage=float_stage, quantized_stage=quantized_stage,
        float_options=float_options.to_json(), quantized_options=options.to_json(),
        inputs=inputs.describe(), samples=len(inputs),
        tensors=sorted((e for e in errors.values() if e.tensor not in final), key=lambda e: (not e.measured, e.sqnr_db, e.position)),
        outputs=[errors[o] for o in float_plan.outputs if o in errors],
        weights=sorted(weights, key=lambda e: (not e.measured, e.sqnr_db)), constants=constants, internal=internal, faithful=not mismatched, mismatched=mismatched,
        seconds=time.perf_counter() - started, peak_rss_mb=_peak_rss_mb(), instruction_set=instruction_set().to_json(),
    )
