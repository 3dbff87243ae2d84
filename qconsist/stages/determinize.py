"""Stage determinize: rewrite the operators whose CUDA kernels give a different output on every run into
equivalent forms that do not, on a float ONNX model (between optimize and quantize).

* ``ConvTranspose`` whose windows overlap (two kernel taps reach one output: kernel > stride on some
  axis, e.g. FCN's 2x upsampling, kernel 4 stride 2 pad 1). ONNX Runtime's CUDA EP runs it as a cuDNN
  backward-data convolution whose engines for EXHAUSTIVE and HEURISTIC accumulate with atomics (20
  distinct outputs in 20 runs on an H100; ``use_deterministic_compute`` does not change the choice).
  Rewritten as a sub-pixel Conv + DepthToSpace (``rewrites/subpixel.py``), folding a spatial Slice (a
  Caffe ``Crop``) that follows it. A ConvTranspose whose windows do not overlap (kernel == stride) is
  left alone: measured bit-stable.
* ``ScatterElements(reduction="add")``: atomic adds; rewritten as a one-hot MatMul while the index range
  is small (``rewrites/scatter_add.py``). ``reduction="mul"`` and ``ScatterND`` with ``add`` / ``mul``
  have no rewrite and are refused (``UnsupportedModelError``, one line naming the node), or listed in
  ``DeterminizeResult.refused`` with ``skip_unsupported``. Reductions ``none`` / ``min`` / ``max`` are left alone.

Refused ConvTranspose: not 2-D; ``auto_pad`` SAME_*; ``output_shape`` set; weight or bias computed at
run time (neither an initializer nor a Constant); different strides per axis on an input of unknown
spatial size. The equivalence holds for finite inputs (the sub-pixel Conv multiplies zero taps).

Check (``check=True``): on the CPU, seeded inputs, every replacement against the tensor the original node
produced from the same input, and every model output against the original's; per check the greatest
absolute difference, its tolerance ``atol + rtol · peak`` (``peak`` = greatest magnitude of the original
tensor) and the verdict. A failed check raises ``FidelityError``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qconsist.errors import ConfigError, FidelityError, InputError, UnsupportedModelError
from qconsist.onnxfile import ai_onnx_opset, node_label, read_onnx
from qconsist.stages.caffe.fidelity import OutputCheck
from qconsist.stages.rewrites import equivalence
from qconsist.stages.rewrites.emit import Emitter, attributes_of
from qconsist.stages.rewrites.scatter_add import emit_scatter_add
from qconsist.stages.rewrites.subpixel import emit_subpixel, geometry_of, overlapping_axes
from qconsist.store.atomic import write_bytes_atomic
from qconsist.tomlfile import guard
from qconsist.compare import compare_outputs
from qconsist.inference.session import outputs_of
from qconsist.stages.base import StageRecord
from qconsist.store.hashing import hash_artifact
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

SCHEMA = "qconsist.determinize/1"
MIN_OPSET = 13  # Unsqueeze / Squeeze with axes as an input, DepthToSpace's CRD mode


@serialized
@dataclass(frozen=True)
class DeterminizeOptions:
    conv_transpose: bool = True  # rewrite overlapping ConvTranspose
    scatter_add: bool = True  # rewrite ScatterElements(reduction="add")
    fold_crops: bool = True  # fold a spatial Slice after a ConvTranspose into its pads
    max_one_hot_elements: int = 1 << 24  # largest one-hot tensor of a ScatterElements rewrite (64 MiB of float32)
    skip_unsupported: bool = False  # list what cannot be rewritten instead of raising
    check: bool = True
    seed: int = 0
    batch: int = 1  # the check's size for a dynamic first dimension
    rtol: float = 1e-5
    atol: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("conv_transpose", "scatter_add", "fold_crops", "skip_unsupported", "check"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"determinize.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("max_one_hot_elements", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"determinize.{name} must be a whole number >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"determinize.seed must be a whole number, got {self.seed!r}")
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"determinize.{name} must be a number >= 0, got {value!r}")


@serialized
@dataclass
class NodeRewrite:
    name: str
    op_type: str
    form: str
    attributes: dict[str, Any]  # the original node's
    new_nodes: list[tuple[str, str]]  # (name, op_type), in order
    details: dict[str, Any] = field(default_factory=dict)
    folded: list[str] = field(default_factory=list)  # nodes folded into the rewrite (a crop's Slice)
    check: OutputCheck | None = None


@dataclass
class NodeNote:
    """A node determinize looked at and did not rewrite, and why."""

    name: str
    op_type: str
    reason: str


@serialized(
    schema=SCHEMA, derived=("passed", "max_abs"), error=InputError,
    refused="not a determinize result of schema {schema}: {found!r}",
    malformed="determinize result is malformed: {exc}",
)
@dataclass
class DeterminizeResult:
    rewritten: list[NodeRewrite]
    left_alone: list[NodeNote]
    refused: list[NodeNote]  # only with skip_unsupported
    outputs: list[OutputCheck]  # the rewritten model's outputs against the original's (empty without check)
    options: DeterminizeOptions
    seconds: float = 0.0  # the rewrite
    check_seconds: float = 0.0
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    path: Path | None = None

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.outputs) and all(r.check is None or r.check.passed for r in self.rewritten)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def max_abs(self) -> float:
        checks = [r.check for r in self.rewritten if r.check] + self.outputs
        return max((c.max_abs for c in checks), default=0.0)


# --- the model as the rewrites see it ---------------------------------------------------------------------


class _Model:
    """Look-ups over one model: constants, shapes and element types (after shape inference), consumers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
            inferred = model
        self.shapes: dict[str, tuple] = {}
        self.types: dict[str, int] = {}
        for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            tensor = value.type.tensor_type
            self.types[value.name] = tensor.elem_type
            if tensor.HasField("shape"):
                self.shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                                for d in tensor.shape.dim)
        self.constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        for name, array in self.constants.items():
            self.shapes[name] = tuple(array.shape)
            self.types[name] = helper.np_dtype_to_tensor_dtype(array.dtype)
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in model.graph.output}
        self.names = {n.name for n in model.graph.node} | {o for n in model.graph.node for o in n.output} | set(self.constants)

    def prefix(self, node: onnx.NodeProto, index: int) -> str:
        base = node.name or f"{node.op_type}_{index}"
        prefix = base
        while any(name.startswith(prefix + "_") for name in self.names):
            prefix += "_det"
        return prefix


class _Refusal(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- one node ---------------------------------------------------------------------------------------------


def _crop_after(m: _Model, node: onnx.NodeProto, out_size: tuple[int, int] | None):
    """The spatial Slice that alone reads ``node``'s output, as (slice, rows/columns cut at the start, at the end)."""
    output = node.output[0]
    readers = m.consumers.get(output, [])
    if out_size is None or output in m.outputs or len(readers) != 1 or readers[0].op_type != "Slice":
        return None
    crop = readers[0]
    if crop.input[0] != output or any(name and name not in m.constants for name in crop.input[1:]):
        return None
    values = [m.constants[name].reshape(-1).tolist() if name else None for name in list(crop.input[1:]) + [None] * (4 - len(crop.input[1:]))]
    starts, ends, axes, steps = values[:4]
    axes = [a % 4 for a in (axes if axes is not None else range(len(starts)))]
    if any(a not in (2, 3) for a in axes) or any(s != 1 for s in steps or []):
        return None
    begin, end = [0, 0], [0, 0]
    for axis, start, stop in zip(axes, starts, ends):
        size = out_size[axis - 2]
        start, stop = (v + size if v < 0 else v for v in (start, stop))
        start, stop = min(max(start, 0), size), min(max(stop, 0), size)
        if start >= stop:
            return None
        begin[axis - 2], end[axis - 2] = start, size - stop
    return crop, (begin[0], begin[1]), (end[0], end[1])


def _rewrite_conv_transpose(m: _Model, node: onnx.NodeProto, out: Emitter, options: DeterminizeOptions):
    """(form, details, folded nodes) or None when the node needs no rewrite; ``_Refusal`` when it cannot be."""
    weight_name = node.input[1]
    if weight_name not in m.constants:
        raise _Refusal(f"its weight '{weight_name}' is computed at run time, not an initializer")
    weight = m.constants[weight_name]
    geometry = geometry_of(attributes_of(node), weight.shape)
    if not overlapping_axes(geometry):
        return None
    bias = None
    if len(node.input) > 2 and node.input[2]:
        if node.input[2] not in m.constants:
            raise _Refusal(f"its bias '{node.input[2]}' is computed at run time, not an initializer")
        bias = m.constants[node.input[2]]
    shape = m.shapes.get(node.input[0], ())
    spatial = tuple(d if isinstance(d, int) and d > 0 else None for d in shape[2:4]) if len(shape) == 4 else (None, None)
    out_size = geometry.output_size(spatial) if None not in spatial else None  # type: ignore[arg-type]
    output, folded = node.output[0], []
    crop = _crop_after(m, node, out_size) if options.fold_crops else None
    if crop is not None:
        slice_node, begin, end = crop
        geometry = geometry.with_crop(begin, end)
        output, folded = slice_node.output[0], [slice_node]
    details = emit_subpixel(out, node.input[0], output, geometry, weight, bias, spatial)  # type: ignore[arg-type]
    details["overlapping_axes"] = [a + 2 for a in overlapping_axes(geometry)]
    if folded:
        details["folded_crop"] = {"begin": list(crop[1]), "end": list(crop[2])}  # type: ignore[index]
    return "sub-pixel Conv + DepthToSpace (CRD)", details, folded


def _rewrite_scatter(m: _Model, node: onnx.NodeProto, out: Emitter, options: DeterminizeOptions):
    attributes = attributes_of(node)
    reduction = attributes.get("reduction", "none")
    if node.op_type == "ScatterND":
        if reduction in ("add", "mul"):
            raise _Refusal(f"reduction '{reduction}' runs on CUDA atomics in any order and qconsist has no "
                           "deterministic ONNX form for ScatterND")
        return None
    if reduction == "mul":
        raise _Refusal("reduction 'mul' multiplies with CUDA atomics in any order; no deterministic ONNX form")
    if reduction != "add" or not options.scatter_add:
        return None
    data, indices, updates = node.input[:3]
    if data not in m.shapes or indices not in m.shapes or indices not in m.types:
        raise _Refusal("the shapes of its data and indices are not known (run shape inference or give static shapes)")
    details = emit_scatter_add(
        out, [data, indices, updates], node.output[0], int(attributes.get("axis", 0)), m.shapes[data], m.shapes[indices],
        helper.tensor_dtype_to_np_dtype(m.types[indices]), m.types.get(data, onnx.TensorProto.FLOAT),
        options.max_one_hot_elements, options.batch,
    )
    return "one-hot MatMul", details, []


_REWRITES = {"ConvTranspose": _rewrite_conv_transpose, "ScatterElements": _rewrite_scatter, "ScatterND": _rewrite_scatter}
_LEFT_ALONE = {
    "ConvTranspose": "windows do not overlap (no output receives two kernel taps): measured bit-stable on CUDA",
    "ScatterElements": "reduction none / min / max: the same result in any order (none: while indices are unique, as ONNX requires)",
    "ScatterND": "reduction none / min / max: the same result in any order (none: while indices are unique, as ONNX requires)",
}


# --- the model --------------------------------------------------------------------------------------------


def determinize_model(model: onnx.ModelProto, options: DeterminizeOptions = DeterminizeOptions(),
                      inputs: dict[str, np.ndarray] | None = None) -> tuple[onnx.ModelProto, DeterminizeResult]:
    """The rewritten model (a copy) and what was done; ``inputs``: the check's values for inputs that
    cannot be drawn at random (integer inputs, dynamic dimensions)."""
    start = time.perf_counter()
    opset = ai_onnx_opset(model) or 0
    if opset < MIN_OPSET:
        raise UnsupportedModelError(f"determinize needs opset {MIN_OPSET} or newer; the model has opset {opset}")
    m = _Model(model)
    rewritten, left_alone, refused = [], [], []
    replacements: dict[str, Emitter] = {}  # by the first output of the node replaced
    removed: set[str] = set()  # first outputs of the nodes replaced (ConvTranspose, a folded Slice)
    for index, node in enumerate(model.graph.node):
        rewrite = _REWRITES.get(node.op_type)
        if rewrite is None:
            continue
        name = node_label(node, index)
        if node.op_type == "ConvTranspose" and not options.conv_transpose:
            left_alone.append(NodeNote(name, node.op_type, "conv_transpose rewriting is off"))
            continue
        out = Emitter(m.prefix(node, index))
        try:
            done = rewrite(m, node, out, options)
        except (_Refusal, UnsupportedModelError) as exc:
            reason = exc.reason if isinstance(exc, _Refusal) else str(exc)
            if not options.skip_unsupported:
                raise UnsupportedModelError(f"node '{name}' ({node.op_type}) cannot be made deterministic: {reason}") from None
            refused.append(NodeNote(name, node.op_type, reason))
            continue
        if done is None:
            reason = _LEFT_ALONE[node.op_type]
            if node.op_type == "ScatterElements" and attributes_of(node).get("reduction") == "add":
                reason = "scatter_add rewriting is off"
            left_alone.append(NodeNote(name, node.op_type, reason))
            continue
        form, details, folded = done
        replacements[node.output[0]] = out
        removed.update(n.output[0] for n in [node, *folded])
        rewritten.append(NodeRewrite(name=name, op_type=node.op_type, form=form, attributes=attributes_of(node),
                                     new_nodes=[(n.name, n.op_type) for n in out.nodes], details=details,
                                     folded=[n.name for n in folded]))
        log.info("determinize: %s '%s' -> %s", node.op_type, name, ", ".join(n.op_type for n in out.nodes))
    result_model = _apply(model, replacements, removed)
    result = DeterminizeResult(rewritten, left_alone, refused, [], options, seconds=time.perf_counter() - start)
    if options.check and rewritten:
        _check(model, result_model, replacements, result, inputs)
    return result_model, result


def _apply(model: onnx.ModelProto, replacements: dict[str, Emitter], removed: set[str]) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes = []
    for node in model.graph.node:
        key = node.output[0] if node.output else ""
        if key in replacements:
            nodes.extend(replacements[key].nodes)
        elif key not in removed:
            nodes.append(node)
    consumed_before = {name for node in model.graph.node for name in node.input}
    consumed_now = {name for node in nodes for name in node.input} | {o.name for o in model.graph.output}
    nodes = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] in consumed_before - consumed_now)]
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    result.graph.initializer.extend(t for out in replacements.values() for t in out.initializers)
    used = {name for node in result.graph.node for name in node.input} | {o.name for o in result.graph.output}
    produced = {o for node in result.graph.node for o in node.output} | {i.name for i in result.graph.input}
    keep = [t for t in result.graph.initializer if t.name in used]
    del result.graph.initializer[:]
    result.graph.initializer.extend(keep)
    produced |= {t.name for t in keep}
    stale = [v for v in result.graph.value_info if v.name not in produced]
    for value in stale:
        result.graph.value_info.remove(value)
    try:
        onnx.checker.check_model(result, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        try:
            onnx.checker.check_model(model, full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as before:
            raise InputError(f"the model fails onnx.checker before any rewrite: {before}") from None
        raise UnsupportedModelError(f"determinized model fails onnx.checker: {exc}") from None
    return result


def _check(original: onnx.ModelProto, rewritten: onnx.ModelProto, replacements: dict[str, Emitter],
           result: DeterminizeResult, inputs: dict[str, np.ndarray] | None) -> None:
    start = time.perf_counter()
    options = result.options
    feeds = equivalence.seeded_feeds(original, options.seed, options.batch, inputs)
    result.input_shapes = {k: list(v.shape) for k, v in feeds.items()}
    m = _Model(original)
    initializers = {t.name for t in original.graph.initializer}
    wanted = []
    for out in replacements.values():
        own = {o for node in out.nodes for o in node.output} | {t.name for t in out.initializers}
        wanted += [name for node in out.nodes for name in node.input if name and name not in own | initializers]
        wanted.append(out.nodes[-1].output[0])
    tensors = equivalence.capture(original, list(dict.fromkeys(wanted)), feeds, m.types)
    for rewrite, out in zip(result.rewritten, replacements.values()):
        output = out.nodes[-1].output[0]
        rewrite.check = equivalence.check_replacement(original, out.nodes, out.initializers, tensors, output, options.rtol, options.atol)
    names = [o.name for o in original.graph.output]
    result.outputs = equivalence.compare_outputs(tensors, equivalence.run_model(rewritten, feeds), names, options.rtol, options.atol)
    result.check_seconds = time.perf_counter() - start
    failed = [(r.name, r.check) for r in result.rewritten if r.check and not r.check.passed] + [
        ("model", c) for c in result.outputs if not c.passed]
    if failed:
        where, check = failed[0]
        raise FidelityError(f"determinized {where} differs from the original: {check.describe()}")


def determinize(source: Path, output: Path, options: DeterminizeOptions = DeterminizeOptions(),
                inputs: dict[str, np.ndarray] | None = None) -> DeterminizeResult:
    """Rewrite the model at ``source`` into ``output`` (written atomically, only once every check passed)."""

    source = Path(source)
    if not source.is_file():
        raise InputError(f"model {source} does not exist")
    model = read_onnx(source, external_data=True)
    rewritten, result = determinize_model(model, options, inputs)
    write_bytes_atomic(Path(output), rewritten.SerializeToString())
    result.path = Path(output)
    return result


class DeterminizeStage:
    """Optional, between optimize and quantize: ``[determinize]`` in a pipeline file turns it on (its keys are
    ``DeterminizeOptions``' fields). The rewrite's own check runs on the first evaluation input, then every
    model output is compared with the previous stage's on all the evaluation inputs."""

    name = "determinize"
    order = 25
    optional = True
    produces_float = True
    options_type = DeterminizeOptions

    def parse(self, table, base: Path) -> DeterminizeOptions:
        if table is None:
            return DeterminizeOptions()
        kinds = {bool: bool, int: int, float: float}
        values = {}
        for f in fields(DeterminizeOptions):
            default = getattr(DeterminizeOptions, f.name)
            value = table.get(f.name, kinds[type(default)])
            if value is not None:
                values[f.name] = value
        options = guard(table, lambda: DeterminizeOptions(**values))
        table.finish()
        return options

    def run(self, source: Path | None, target: Path, options: DeterminizeOptions, context):  # -> StageRecord
        start = time.perf_counter()
        evaluation = context.evaluation(source) if context.evaluation else None
        first = evaluation.sample(0) if evaluation is not None and len(evaluation) else None
        result = determinize(source, target, options, first)
        checks: dict[str, Any] = {"rewrite": result.to_json()}
        if evaluation is not None:
            comparison = compare_outputs(outputs_of(source, evaluation), outputs_of(target, evaluation), options.atol, options.rtol)
            checks[f"outputs_vs_{context.previous}"] = comparison.to_json()
            if not comparison.passed:
                raise FidelityError(f"determinize changed the model's outputs beyond tolerance: {comparison.summary()}")
        params = {**options.to_json(), "rewritten": [r.name for r in result.rewritten],
                  "left_alone": [n.name for n in result.left_alone], "refused": [n.name for n in result.refused]}
        return StageRecord(self.name, target, params, hash_artifact(target, context.root), checks,
                           time.perf_counter() - start, result=result)


STAGE = DeterminizeStage()
