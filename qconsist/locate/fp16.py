"""``--precision fp16``: convert the float model to float16 and find where it breaks, against float32.

The conversion is onnxconverter-common's ``convert_float_to_float16`` (inputs and outputs stay float32,
``keep_io_types``); the constants it clamps into float16's range are counted. Both models are observed
(every tensor of the graph that runs, ``qconsist.locate.observe``) on the same samples and execution provider.
Reported, in topological order:

* the first node whose float16 output holds NaN or Inf while its float32 counterpart is finite;
* the first node whose float32 output exceeds float16's largest finite value (65504), which overflows
  when stored as float16;
* per node (matched through the original tensor names) the greatest absolute and relative difference,
  and on the final outputs the greatest difference and top-1 agreement.

On the CPU EP ONNX Runtime has few float16 kernels: it inserts casts and, where consecutive nodes all run
in float32, removes the casts between them, so the float16 model's intermediate tensors are float32 there
and NaN/Inf from float16 storage cannot show. The report counts the float16 tensors actually observed
(``float16_tensors`` of ``float_tensors``) and says so; the overflow check (the float32 reference against
65504) names the node on any EP. On the CUDA EP the nodes run float16 kernels.

The analysis runs at graph optimization level ``basic`` unless told otherwise (``FP16_LEVEL``): no node
fusion and no layout change, so every node of the model is observed under its own name and the first
node to overflow is named exactly. A fused node (at higher levels) is reported with the nodes it covers.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from qconsist.errors import ConfigError, InputError, UnsupportedModelError
from qconsist.inference.layout import to_original
from qconsist.locate.observe import Observer
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, ort_logged
from qconsist.compare import OutputEffect
from qconsist.onnxfile import read_onnx
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.serde import serialized
from qconsist.store.scratch import scratch_dir

log = logging.getLogger(__name__)

FLOAT16_MAX = 65504.0
SCHEMA = "qconsist.fp16/1"
FP16_LEVEL = OptimizationLevel.BASIC


@dataclass(frozen=True)
class Fp16Options:
    keep_io_types: bool = True
    overflow_limit: float = FLOAT16_MAX

    def __post_init__(self) -> None:
        if not 0 < self.overflow_limit <= FLOAT16_MAX:
            raise ConfigError(f"fp16 overflow limit must be in (0, {FLOAT16_MAX}], got {self.overflow_limit!r}")


@serialized
@dataclass(frozen=True)
class Finding:
    """One node output: where it is and what was seen (in the earliest sample showing it)."""

    label: str
    tensor: str
    op_type: str
    sample: int
    nan: int = 0
    inf: int = 0
    max_abs_fp32: float = 0.0
    covers: tuple[str, ...] = ()  # the model's nodes this (possibly fused) node computes


@serialized
@dataclass(frozen=True)
class NodeError:
    label: str
    tensor: str
    max_abs: float
    max_rel: float


def _effect(data: dict[str, Any]) -> dict[str, Any]:
    """Reports recorded before the output effect: its figures from the flat keys."""
    if "effect" in data:
        return data
    return {**data, "effect": {"samples": data["samples"], "greatest_abs": data["output_greatest_abs"], "top1_agree": data["top1_agree"]}}


@serialized(
    schema=SCHEMA, derived=("passed", "output_greatest_abs", "top1_agree", "stored_as_float16", "note"),
    error=InputError, refused="not an fp16 report (schema {found!r}, expected {schema})",
    malformed="fp16 report is malformed: {exc}", upgrade=_effect,
)
@dataclass
class Fp16Report:
    model: str
    execution: dict
    samples: int
    truncated_constants: int  # constants clamped by the converter into float16's range
    first_nonfinite: Finding | None
    first_overflow: Finding | None
    nonfinite_tensors: int
    overflow_tensors: int
    worst_nodes: list[NodeError] = field(default_factory=list)
    effect: OutputEffect = field(default_factory=OutputEffect)  # float16 vs float32 final outputs
    float16_tensors: int = 0  # observed intermediate tensors of the float16 model stored as float16
    float_tensors: int = 0  # all its observed floating-point intermediate tensors

    @property
    def output_greatest_abs(self) -> float:
        return self.effect.greatest_abs

    @property
    def top1_agree(self) -> int:
        return self.effect.top1_agree

    @property
    def stored_as_float16(self) -> bool:
        """Whether the EP really kept the float16 model's tensors in float16 (most of them)."""
        return self.float_tensors > 0 and self.float16_tensors * 2 >= self.float_tensors

    def note(self) -> str:
        if self.stored_as_float16:
            return f"{self.float16_tensors} of {self.float_tensors} intermediate tensors were float16 on this EP"
        return (
            f"only {self.float16_tensors} of {self.float_tensors} intermediate tensors were float16: this EP computed "
            "the float16 model in float32, so NaN/Inf from float16 storage cannot show here; the overflow check "
            "(float32 values beyond 65504) still applies"
        )

    @property
    def passed(self) -> bool:
        return self.first_nonfinite is None and self.first_overflow is None

    def __bool__(self) -> bool:
        return self.passed



def convert_to_fp16(source: Path, target: Path, options: Fp16Options = Fp16Options()) -> int:
    """Write the float16 model; returns how many constants the converter clamped into float16's range."""
    from onnxconverter_common import float16

    model = read_onnx(source, external_data=True)
    if not any(init.data_type == onnx.TensorProto.FLOAT for init in model.graph.initializer) and not any(
        v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in model.graph.input
    ):
        raise UnsupportedModelError(f"{source} has no float32 tensors to convert; `precision` fp16 needs the float model")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = float16.convert_float_to_float16(model, keep_io_types=options.keep_io_types)
        except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions
            raise UnsupportedModelError(f"onnxconverter-common cannot convert {source} to float16: {exc}") from None
    truncated = sum(1 for w in caught if "truncated" in str(w.message))
    onnx.save(converted, str(target))
    return truncated


class _Tracker:
    """Earliest finding in topological order over all samples."""

    def __init__(self) -> None:
        self.best: tuple[int, Finding] | None = None
        self.tensors: set[str] = set()

    def offer(self, position: int, finding: Finding) -> None:
        self.tensors.add(finding.tensor)
        if self.best is None or position < self.best[0]:
            self.best = (position, finding)


@ort_logged()  # one capture for all its sessions and runs
def analyse_fp16(
    model_path: Path,
    samples: Sequence[dict[str, np.ndarray]],
    execution: ExecutionOptions = ExecutionOptions(graph_optimization_level=FP16_LEVEL),
    options: Fp16Options = Fp16Options(),
    progress: Progress = NULL_PROGRESS,
) -> Fp16Report:
    """Convert ``model_path`` to float16 and compare it with the float32 model on ``samples``."""
    if not samples:
        raise ConfigError("the fp16 analysis needs at least one input sample")
    with scratch_dir("qconsist-fp16-") as tmp:
        fp16_path = Path(tmp) / "model.fp16.onnx"
        truncated = convert_to_fp16(Path(model_path), fp16_path, options)
        ref = Observer(Path(model_path), execution, Path(tmp) / "fp32")
        half = Observer(fp16_path, execution, Path(tmp) / "fp16")
        try:
            return _compare(str(model_path), execution, samples, ref, half, truncated, options, progress)
        finally:
            ref.close()
            half.close()


def _order(observer: Observer) -> list[tuple[str, str, str]]:
    """(tensor, label, op) of every node output in topological order."""
    return [(out, node.label, node.op_type) for node in observer.graph.nodes for out in node.outputs]


def _in_original_order(observer: Observer, arrays: dict) -> dict:
    """Tensors ORT holds in another axis order than their original (``TensorOrigin.layout``) put back in it: the
    float32 and float16 graphs are compared through the original model's tensors."""
    for t in observer.plan.tensors:
        if t.layout and t.name in arrays:
            arrays[t.name] = to_original(arrays[t.name], t.layout)
    return arrays


def _covers(observer: Observer) -> dict[str, tuple[str, ...]]:
    return {t.name: tuple(t.covers) for t in observer.plan.tensors}


def _compare(model: str, execution: ExecutionOptions, samples: Sequence[dict[str, np.ndarray]], ref: Observer,
             half: Observer, truncated: int, options: Fp16Options, progress: Progress) -> Fp16Report:
    ref_order, half_order = _order(ref), _order(half)
    ref_covers, half_covers = _covers(ref), _covers(half)
    ref_original = {t.name: t.original for t in ref.plan.tensors}
    half_original = {t.name: t.original for t in half.plan.tensors}
    twin = {orig: name for name, orig in ref_original.items() if orig}
    half_by_original = {orig: name for name, orig in half_original.items() if orig}
    nonfinite, overflow = _Tracker(), _Tracker()
    errors: dict[str, NodeError] = {}
    ref_session, half_session = ref.fresh_session(), half.fresh_session()
    effect = OutputEffect()
    outputs = list(ref.graph.outputs)
    with progress.task("fp16 vs fp32", len(samples)) as handle:
        for s, sample in enumerate(samples):
            a = _in_original_order(ref, Observer.observe(ref_session, sample).arrays)
            b = _in_original_order(half, Observer.observe(half_session, sample).arrays)
            for position, (name, label, op) in enumerate(ref_order):
                x = a.get(name)
                if x is None or x.dtype.kind != "f" or x.size == 0:
                    continue
                peak = float(np.max(np.abs(x[np.isfinite(x)]))) if np.isfinite(x).any() else 0.0
                if peak > options.overflow_limit:
                    overflow.offer(position, Finding(label, name, op, s, max_abs_fp32=peak, covers=ref_covers.get(name, ())))
            for position, (name, label, op) in enumerate(half_order):
                y = b.get(name)
                if y is None or y.dtype.kind != "f" or y.size == 0 or np.isfinite(y).all():
                    continue
                counterpart = a.get(twin.get(half_original.get(name) or "", ""))
                if counterpart is not None and not np.isfinite(counterpart).all():
                    continue  # float32 is not finite either: not float16's doing
                nan = int(np.isnan(y).sum())
                overflow_peak = float(np.max(np.abs(counterpart))) if counterpart is not None and counterpart.size else 0.0
                nonfinite.offer(position, Finding(label, name, op, s, nan=nan, inf=int((~np.isfinite(y)).sum()) - nan,
                                                  max_abs_fp32=overflow_peak, covers=half_covers.get(name, ())))
            _node_errors(a, b, ref_order, ref_original, half_by_original, errors)
            out_a = [a[o] for o in outputs]
            out_b = [b[o] for o in outputs if o in b]
            if len(out_b) == len(out_a):
                effect.add(effect.samples, out_a, out_b)
            handle.advance()
    worst = sorted(errors.values(), key=lambda e: e.max_rel, reverse=True)[:5]
    final = set(outputs)
    kinds = [dtype for dtype, t in zip(half.plan.dtypes, half.plan.tensors) if t.name not in final
             and dtype in ("float16", "float32", "float64", "bfloat16")]
    return Fp16Report(
        model=model, execution=execution.to_json(), samples=effect.samples or len(samples), truncated_constants=truncated,
        first_nonfinite=nonfinite.best[1] if nonfinite.best else None,
        first_overflow=overflow.best[1] if overflow.best else None,
        nonfinite_tensors=len(nonfinite.tensors), overflow_tensors=len(overflow.tensors),
        worst_nodes=worst, effect=effect,
        float16_tensors=sum(1 for k in kinds if k == "float16"), float_tensors=len(kinds),
    )


def _node_errors(a: dict, b: dict, ref_order: list, ref_original: dict, half_by_original: dict, errors: dict) -> None:
    """Greatest float16-vs-float32 differences of tensors that exist in both graphs (matched by the original
    tensor they stand for); the relative difference is to the tensor's largest float32 magnitude."""
    for name, label, _ in ref_order:
        x = a.get(name)
        original = ref_original.get(name)
        y = b.get(half_by_original.get(original, "")) if original else None
        if x is None or y is None or x.shape != y.shape or x.dtype.kind != "f" or x.size == 0:
            continue
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        finite = np.isfinite(x64) & np.isfinite(y64)
        if not finite.any():
            continue
        delta = np.abs(x64[finite] - y64[finite])
        scale = float(np.max(np.abs(x64[finite])))
        max_abs = float(delta.max())
        max_rel = max_abs / scale if scale > 0 else 0.0
        known = errors.get(name)
        if known is None or max_rel > known.max_rel:
            errors[name] = NodeError(label, name, max_abs, max_rel)
