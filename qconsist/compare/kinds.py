"""What each final output of a model is, and so how it is judged: its kind, declared or read from the graph.

Kinds (``OutputKind``):

* ``class-scores``: one score per class for each sample, one distribution per sample (a classifier's
  probabilities or logits). Judged by top-1 agreement (and accuracy, with labels) besides the figures below;
* ``map``: a value per position (segmentation scores per pixel, a text-detection or heat map);
* ``regression``: numbers in units of their own (box coordinates, embeddings, any other value).

Every output, whatever its kind (none too: an output neither declared nor inferred), is judged by SQNR, cosine
similarity and greatest difference against its reference (``qconsist.compare.noise``); only class scores get
a top-1, because only there does the arg-max mean the model's answer.

**Inferred only from the graph**, never from shapes or from being first (``judged_outputs``):

* produced by a ``Softmax`` / ``LogSoftmax`` — through nothing but ops that only rearrange values (Identity,
  Flatten, Reshape, Squeeze, Unsqueeze, a Transpose keeping axis 0) — whose normalized axis is not the batch
  axis: ``class-scores`` when it normalizes one distribution per sample (every other axis but the batch has
  size 1; below opset 13, Softmax normalizes the flattened axes from ``axis`` on, so the axes between the batch
  and ``axis`` must have size 1), with at least two classes and the batch kept as axis 0 after it; ``map`` when
  it normalizes one distribution per position (a class axis at every pixel). A Softmax over one class (always
  1), over the batch axis, or whose shape is not known is not inferred;
* ``Sigmoid`` is not inferred: its probabilities are independent (several or none may hold), so an arg-max
  among them is no decision of the model; declare such an output;
* anything else is not inferred (the reason is recorded: "produced by Conv 'conv4'"). Declare it: a pipeline's
  ``[evaluation] outputs = {prob = "class-scores", "conv4-2" = "regression"}``.

**Parts**: an output made by a ``Concat`` of inputs whose sizes along its axis are known (a detector's boxes and
class scores in one tensor) is also judged part by part (``output0[:, 4:22]``), each part's kind inferred from
the tensor that fills it: a part can be destroyed by quantization (its values rounded to zero in a scale set
by another part's range) while the whole output's SQNR, dominated by the larger part, looks healthy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from qconsist.errors import ConfigError
from qconsist.onnxfile import ai_onnx_opset, node_label


class OutputKind(str, Enum):
    CLASS_SCORES = "class-scores"
    MAP = "map"
    REGRESSION = "regression"


KINDS = tuple(kind.value for kind in OutputKind)
_REARRANGING = {"Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose"}
_NORMALIZING = {"Softmax", "LogSoftmax"}


@dataclass(frozen=True)
class JudgedOutput:
    """One final output (``axis`` None), or one part of it (elements ``start:stop`` along ``axis``), with its
    kind (None: neither declared nor inferred) and how that kind is known."""

    output: str
    kind: OutputKind | None
    why: str
    axis: int | None = None
    start: int = 0
    stop: int = 0
    source: str = ""  # a part: the tensor that fills it (an input of the Concat that makes the output)
    class_axis: int | None = None  # a map: the axis its Softmax normalizes (the classes at each position), from the graph

    @property
    def label(self) -> str:
        if self.axis is None:
            return self.output
        return f"{self.output}[{':, ' * self.axis}{self.start}:{self.stop}]"

    @property
    def kind_name(self) -> str:
        return self.kind.value if self.kind is not None else "undeclared"

    def select(self, values: np.ndarray) -> np.ndarray:
        """This output's (or part's) values of an array of the whole output."""
        values = np.asarray(values)
        if self.axis is None:
            return values
        if values.ndim <= self.axis or values.shape[self.axis] < self.stop:
            raise ValueError(f"{self.label}: output {self.output} has shape {values.shape}")
        return values[(slice(None),) * self.axis + (slice(self.start, self.stop),)]

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "label": self.label, "kind": self.kind.value if self.kind else None,
                "why": self.why, "part": [self.axis, self.start, self.stop] if self.axis is not None else None,
                **({"source": self.source} if self.source else {}),
                **({"class_axis": self.class_axis} if self.class_axis is not None else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JudgedOutput":
        part = data.get("part")
        axis, start, stop = part if part else (None, 0, 0)
        kind = data.get("kind")
        class_axis = data.get("class_axis")
        return cls(str(data["output"]), OutputKind(kind) if kind else None, str(data.get("why", "")), axis, start, stop,
                   str(data.get("source", "")), None if class_axis is None else int(class_axis))


def parse_kinds(data: Any, where: str) -> dict[str, OutputKind]:
    """Declared kinds (``{output name: kind}``) from a config table; a wrong value is a ``ConfigError``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a table of output name = kind ({', '.join(KINDS)})")
    kinds = {}
    for name, value in data.items():
        if not isinstance(value, str) or value not in KINDS:
            raise ConfigError(f"{where}: output {name!r} has kind {value!r}; kinds: {', '.join(KINDS)}")
        kinds[str(name)] = OutputKind(value)
    return kinds


class _Graph:
    """The model's graph as kind inference reads it: producers, opset, the shapes shape inference knows."""

    def __init__(self, model: onnx.ModelProto) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001 - a model onnx cannot infer: kinds needing a shape are not inferred
            inferred = model
        self.graph = inferred.graph
        self.producer = {out: node for node in self.graph.node for out in node.output}
        self.labels = {id(node): node_label(node, i) for i, node in enumerate(self.graph.node)}
        self.opset = ai_onnx_opset(model) or 0
        self.shapes: dict[str, list[int | str | None]] = {}
        for value in (*self.graph.input, *self.graph.value_info, *self.graph.output):
            tensor = value.type.tensor_type
            if tensor.HasField("shape"):
                self.shapes[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                           for d in tensor.shape.dim]

    def describe(self, node: onnx.NodeProto) -> str:
        return f"{node.op_type} '{self.labels.get(id(node)) or node.name or node.output[0]}'"


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _known(dims: Sequence[Any]) -> bool:
    return all(isinstance(d, int) and d > 0 for d in dims)


def _infer(graph: _Graph, tensor: str) -> tuple[OutputKind | None, str, int | None]:
    """The kind of ``tensor`` from the node that computes it (see the module docstring), why, and for a map the
    axis of its classes (None where the values are rearranged after the Softmax, or it normalizes several
    axes together)."""
    name = tensor
    node = graph.producer.get(name)
    rearranged: list[onnx.NodeProto] = []
    while node is not None and node.op_type in _REARRANGING:
        if node.op_type == "Transpose" and list(_attribute(node, "perm", [0]))[:1] != [0]:
            break  # moves the batch axis
        rearranged.append(node)
        name = node.input[0]
        node = graph.producer.get(name)
    if node is None:
        return None, "not inferred: a graph input or constant", None
    if node.op_type == "Sigmoid":
        return None, (f"not inferred: produced by {graph.describe(node)} (independent probabilities: an arg-max among "
                      "them is no class decision)"), None
    if node.op_type not in _NORMALIZING:
        return None, f"not inferred: produced by {graph.describe(node)}", None
    shape = graph.shapes.get(name)
    if not shape:
        return None, f"not inferred: {graph.describe(node)} has no known shape", None
    rank = len(shape)
    axis = int(_attribute(node, "axis", -1 if graph.opset >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    what = f"{graph.describe(node)} over axis {axis}"
    if rank >= 2 and axis == 0:
        return None, f"not inferred: {what}, the batch axis", None
    rest = shape[1:] if rank >= 2 else []
    if not _known(rest if rank >= 2 else shape):
        return None, f"not inferred: {what}, but its shape {shape} is not known", None
    if graph.opset >= 13 or rank == 1:
        classes = shape[axis]
        positions = math.prod(rest) // classes if rank >= 2 else 1
    else:  # below opset 13 the axes from `axis` on are normalized together
        classes = math.prod(shape[axis:])
        positions = math.prod(shape[1:axis])
    if classes < 2:
        return None, f"not inferred: {what} normalizes a single value (always {'1' if node.op_type == 'Softmax' else '0'})", None
    if positions > 1:
        moved = any(n.op_type != "Identity" for n in rearranged)
        one_axis = graph.opset >= 13 or axis == rank - 1
        return (OutputKind.MAP, f"inferred: {what}, one distribution over {classes} classes at each of {positions} positions",
                axis if one_axis and not moved else None)
    if rearranged:
        after = graph.shapes.get(tensor)
        kept = after is not None and ((len(after) >= 2 and rank >= 2 and after[0] == shape[0] and after[0] is not None)
                                      or (len(after) == 1 and (rank == 1 or shape[0] == 1)))
        if not kept:
            return None, f"not inferred: {what}, then reshaped so that its samples are not told apart", None
    return OutputKind.CLASS_SCORES, f"inferred: {what}, one distribution over {classes} classes per sample", None


def _parts(graph: _Graph, output: str) -> list[JudgedOutput]:
    """The parts of an output made by a Concat whose inputs' sizes along its axis are known."""
    node = graph.producer.get(output)
    if node is None or node.op_type != "Concat" or len(node.input) < 2:
        return []
    shapes = [graph.shapes.get(name) for name in node.input]
    if any(not s for s in shapes) or len({len(s) for s in shapes}) != 1:  # type: ignore[arg-type]
        return []
    rank = len(shapes[0])  # type: ignore[arg-type]
    axis = int(_attribute(node, "axis", 0))
    axis = axis + rank if axis < 0 else axis
    sizes = [s[axis] for s in shapes]  # type: ignore[index]
    if axis == 0 or not _known(sizes):
        return []
    parts, start = [], 0
    for name, size in zip(node.input, sizes):
        kind, why, class_axis = _infer(graph, name)
        parts.append(JudgedOutput(output, kind, f"{why}; a part of {graph.describe(node)}", axis, start, start + size, name,
                                  class_axis))
        start += size
    return parts


def check_declared(outputs: Sequence[str], declared: Mapping[str, Any], where: str = "[evaluation] outputs") -> None:
    """A declared name that is no output of the model is a ``ConfigError`` naming the model's outputs."""
    unknown = sorted(set(declared) - set(outputs))
    if unknown:
        raise ConfigError(f"{where} names {', '.join(repr(n) for n in unknown)}, which the model does not output "
                          f"(its outputs: {', '.join(outputs) or 'none'})")


def judged_outputs(model: onnx.ModelProto, declared: Mapping[str, OutputKind] | None = None,
                   where: str = "[evaluation] outputs") -> list[JudgedOutput]:
    """Every final output of ``model`` with its kind (declared, else inferred), each followed by its parts.
    A declared name that is no output of the model is a ``ConfigError`` (``where`` names the declaration)."""
    declared = dict(declared or {})
    names = [o.name for o in model.graph.output]
    check_declared(names, declared, where)
    graph = _Graph(model)
    judged = []
    for name in names:
        if name in declared:
            judged.append(JudgedOutput(name, declared[name], f"declared in {where}"))
        else:
            kind, why, class_axis = _infer(graph, name)
            judged.append(JudgedOutput(name, kind, why, class_axis=class_axis))
        judged += _parts(graph, name)
    return judged


def class_scores_output(judged: Sequence[JudgedOutput], purpose: str = "labels") -> JudgedOutput:
    """The one output (whole) of kind class-scores, for ``purpose``; none or several is a ``ConfigError`` that
    asks for the declaration."""
    found = [j for j in judged if j.axis is None and j.kind is OutputKind.CLASS_SCORES]
    if len(found) == 1:
        return found[0]
    outputs = [j for j in judged if j.axis is None]
    listed = "; ".join(f"{j.output}: {j.kind_name} ({j.why})" for j in outputs)
    if not found:
        raise ConfigError(f"{purpose} need the model's class-scores output, and none is declared or inferred ({listed}); "
                          f"declare it: [evaluation] outputs = {{{outputs[0].output if outputs else 'NAME'} = \"class-scores\"}}")
    raise ConfigError(f"{purpose} need one class-scores output, and the model has {len(found)} "
                      f"({', '.join(j.output for j in found)}); declare the one the labels are for as class-scores "
                      "and the others as another kind in [evaluation] outputs")
