"""Tensor layouts from the graph: in which axis order ORT's optimized graph holds a tensor of the original model.

On the CPU EP onnxruntime changes layouts: the NHWC transformer runs QLinearConv, MaxPool, AveragePool… with
``channels_last = 1`` (com.microsoft) and moves the Transposes it inserts through element-wise ops,
DequantizeLinear and PRelu, cancelling pairs; the NCHWc transformer (com.microsoft.nchwc) holds channels in
blocks padded to the vector width. A tensor that keeps its original name can then hold the original's values in
another axis order — with the same shape when C == H == W. qconsist never decides a layout from shapes; it
labels every axis of every tensor, in both graphs, from the graph inputs forward:

* a graph input's axes are labelled by the input (``Whole(name)``: all of its axes, in order);
* ops that keep their input's axes in place (element-wise ops, Q/DQ, Cast, Conv and pooling in whatever layout
  they run — an NHWC QLinearConv keeps NHWC positions —, normalization, Softmax, Concat, Slice, Pad, Resize,
  reductions with ``keepdims``…) give their output the labels of their data input (the longest activation
  input for broadcasting element-wise ops);
* Transpose permutes its input's labels; Squeeze and Unsqueeze remove or insert labels (axes from the node);
* com.microsoft.nchwc ops and what is computed from their output before a ReorderOutput hold channel blocks,
  which no permutation turns into the original: *blocked*;
* any other op (Reshape, Flatten, MatMul, Gemm, Shape…) computes a new value, in its canonical order (ORT
  lays out only through the ops above): its output gets new labels, named after it.

A tensor's layout relative to an original tensor is the permutation ``p`` with ``observed =
numpy.transpose(original, p)``: it exists when both label tuples are known and name the same axes of the same
values (values are matched one to one by the axes they contribute: the two graphs name them differently).
Otherwise — NCHWc blocks, an unknown op's layout, axes that do not correspond — the layout cannot be
established, and the tensor is not compared with the original.

**NCHWc blocks.** onnxruntime's NchwcTransformer (``onnxruntime/core/optimizer/nchwc_transformer.cc``) holds a
float activation of C channels as (N, Cp, H, W), Cp = C rounded up to the block MLAS chose for this processor
(``MlasNchwcGetBlockSize``: 16 with AVX-512F, 8 with AVX2/AVX/SSE), its memory ordered (N, Cp/b, H, W, b) and the
padding channels zero-filled. The same values are then held in another layout on another processor, so the dump
records such a tensor in one canonical layout (``unblock``: NCHW, the padding channels left out) when its real
channel count C is established from the graph (``GraphLayout.channels``: the channel count of ReorderInput's input,
ReorderOutput's ``channels`` attribute, the original model's tensor an NCHWc Conv is named after, carried through
the ops that keep channels), and measures the block size itself (``block_size``). A filter ORT reordered for an
NCHWc Conv (OIHWBiBo or OIHWBo, ``nchwc_filters``) is compared by value through ``unblock_filter``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

_ONNX = ("", "ai.onnx")
_MS = "com.microsoft"
_NCHWC = "com.microsoft.nchwc"
# the CUDA EP with prefer_nhwc runs ONNX ops channels last in this domain (Conv, MaxPool… keep NHWC positions), between
# the Transposes its layout transformer inserts
_NHWC = "com.ms.internal.nhwc"

# ops whose output keeps the axes of their data input (input 0), in any layout they run in
_POSITIONAL = frozenset({
    "Conv", "ConvTranspose", "ConvInteger", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
    "GlobalMaxPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LRN", "LayerNormalization",
    "GroupNormalization", "Softmax", "LogSoftmax", "Hardmax", "Concat", "Split", "Slice", "Pad", "Resize", "Upsample",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Cast", "CastLike", "Clip", "Relu", "LeakyRelu",
    "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Softsign", "Gelu", "Mish",
    "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Erf", "Not", "IsNaN",
    "IsInf", "Identity", "Dropout", "Shrink", "ThresholdedRelu", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
    "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Tile", "CumSum", "TopK", "DepthToSpace", "SpaceToDepth",
    "LpNormalization", "MeanVarianceNormalization",
    # com.microsoft kernels ORT fuses or re-lays out (QLinearConv & co. with channels_last keep NHWC positions)
    "QLinearConv", "QLinearAveragePool", "QLinearGlobalAveragePool", "NhwcMaxPool", "NhwcConv", "NhwcFusedConv",
    "FusedConv", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "FastGelu", "BiasGelu", "QuickGelu",
    "QLinearReduceMean",
})
# element-wise ops with broadcasting: the labels of the longest activation input
_BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "PRelu", "Equal", "Greater", "Less",
    "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod", "BitShift", "Where", "BiasAdd", "QLinearAdd",
    "QLinearMul", "QLinearWhere",
})
_REDUCE = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                     "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"})
# where the data input of an op is, when it is not input 0
_DATA_INPUT = {"QLinearConcat": 2}
# NCHWc: ops that keep a blocked tensor's channels (com.microsoft.nchwc pools and upsampling; the ONNX ops ORT runs on
# blocked tensors: activations it did not fuse, element-wise sums and products of blocked tensors, its own Reshapes)
_NCHWC_KEEP = frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool", "Upsample"})
_BLOCKED_KEEP = frozenset({"Relu", "Sigmoid", "Tanh", "Reshape", "Add", "Sum", "Mul"})
# the node name NchwcTransformer gives an NCHWc Conv: the original output's name, "_nchwc" (BatchNormalization:
# "_bn_nchwc"), and "_token_N" where the name was taken (Graph::GenerateNodeName)
_NCHWC_NAME = re.compile(r"^(?P<tensor>.+?)(?:_bn)?_nchwc(?:_token_\d+)?$")


@dataclass(frozen=True)
class Whole:
    """Every axis of the value ``key``, in its canonical order (the rank need not be known)."""

    key: str


Labels = "tuple[tuple[str, int], ...] | Whole | None"


def _expand(labels, rank: int):
    return tuple((labels.key, i) for i in range(rank)) if isinstance(labels, Whole) else labels


def permutation(observed, original) -> tuple[int, ...] | None:
    """``p`` with ``observed = transpose(original, p)`` (``()``: the same order), or ``None``: not established.

    Labels name the value they come from (a graph input, or the output of an op that computes a new value); the
    two graphs name the same value differently (ORT renames and fuses), so values are matched by the axes they
    contribute, one to one, in order of appearance."""
    if observed is None or original is None:
        return None
    if isinstance(observed, Whole) and isinstance(original, Whole):
        return ()
    if isinstance(observed, Whole):
        observed = _expand(observed, len(original))
    if isinstance(original, Whole):
        original = _expand(original, len(observed))
    if len(observed) != len(original) or len(set(observed)) != len(observed) or len(set(original)) != len(original):
        return None
    renamed = _rename(observed, original)
    if renamed is None:
        return None
    perm = tuple(original.index(label) for label in renamed)
    return () if perm == tuple(range(len(perm))) else perm


def _rename(observed: tuple, original: tuple) -> tuple | None:
    """``observed`` with each value's name replaced by the original's value that contributes the same axes."""
    def values(labels: tuple) -> dict:
        found: dict = {}
        for key, axis in labels:
            found.setdefault(key, set()).add(axis)
        return found

    mine, theirs = values(observed), values(original)
    if len(mine) != len(theirs):
        return None
    names: dict = {}
    free = list(theirs)
    for key, axes in mine.items():
        match = next((other for other in free if theirs[other] == axes), None)
        if match is None:
            return None
        names[key] = match
        free.remove(match)
    return tuple((names[key], axis) for key, axis in observed)


def to_original(array: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    """An observed tensor in its original's axis order (contiguous), given ``permutation(observed, original)``."""
    if not perm:
        return array
    if array.ndim != len(perm):
        raise ValueError(f"a tensor of rank {array.ndim} cannot take the layout permutation {perm}")
    return np.ascontiguousarray(np.transpose(array, np.argsort(perm)))


def original_shape(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``to_original(array, perm)`` gives an array of ``shape``, without computing it."""
    if not perm:
        return tuple(shape)
    if len(shape) != len(perm):
        raise ValueError(f"a tensor of rank {len(shape)} cannot take the layout permutation {perm}")
    return tuple(int(shape[axis]) for axis in np.argsort(perm))


def describe(perm: tuple[int, ...] | None) -> str:
    if perm is None:
        return "unknown"
    if not perm:
        return "original"
    if perm == (0, 2, 3, 1):
        return "NHWC"
    if len(perm) >= 3 and perm == (0, *range(2, len(perm)), 1):
        return "channels last"
    return "permuted " + ",".join(map(str, perm))


def _broadcast(candidates: list, ranks: list):
    """The labels of a broadcasting op's output: those of its first input of the highest rank (inputs of lower
    rank — a bias, a dynamic scale — broadcast into it; one of the same rank is aligned axis by axis). Not
    established where an input of unknown rank could be the highest, or where two inputs hold the same value in
    two axis orders."""
    known = [r for r in ranks if r is not None]
    if len(known) < len(ranks):
        wholes = {c for c in candidates if isinstance(c, Whole)}
        return candidates[0] if len(set(map(str, candidates))) == 1 or (len(wholes) == 1 and len(candidates) == 1) else None
    top = max(known)
    full = [_expand(c, top) if isinstance(c, Whole) else c for c, r in zip(candidates, ranks) if r == top]
    first = full[0]
    for other in full[1:]:
        if other != first and {k for k, _ in other} == {k for k, _ in first}:
            return None
    return first


def _attribute(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _axes(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> list[int] | None:
    """A Squeeze's, Unsqueeze's or reduction's axes: the attribute (older opsets) or the constant input; ArgMax's
    and ArgMin's ``axis``."""
    if node.op_type in ("ArgMax", "ArgMin"):
        return [int(_attribute(node, "axis", 0))]
    given = _attribute(node, "axes")
    if given is not None:
        return [int(a) for a in given]
    if len(node.input) > 1 and node.input[1]:
        value = constants.get(node.input[1])
        return None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
    return None


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    found = {}
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.INT64:
            found[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = _attribute(node, "value")
            if isinstance(value, onnx.TensorProto) and value.data_type == onnx.TensorProto.INT64:
                found[node.output[0]] = numpy_helper.to_array(value)
    return found


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    produced = {out for node in graph.node for out in node.output if out}
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    pending, order = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(not i or i in ready or i not in produced for i in node.input):
                order.append(node)
                ready.update(o for o in node.output if o)
            else:
                rest.append(node)
        if len(rest) == len(pending):  # a cycle: keep the file's order for the rest
            order.extend(rest)
            break
        pending = rest
    return order


class GraphLayout:
    """The axis labels of every tensor of one graph (see the module docstring), and which are blocked."""

    def __init__(self, model: onnx.ModelProto, ranks: dict[str, int] | None = None,
                 dims: dict[str, tuple] | None = None, named: dict[str, int] | None = None) -> None:
        """``dims``: tensor shapes where known (an unknown dimension ``None``), ``named``: the channel counts of the
        original model's tensors (an NCHWc Conv is named after one): both only for ``channels``."""
        graph = model.graph
        self.ranks = dict(ranks or {})
        self.labels: dict[str, object] = {}
        self.blocked: set[str] = set()
        self._initializers = {i.name for i in graph.initializer}
        self._constants = _constants(graph)
        for value in graph.input:
            if value.name not in self._initializers:
                self.labels[value.name] = Whole(value.name)
        # values computed from constants alone (Constant nodes, shape arithmetic on them) are no activations
        self._static = set(self._initializers)
        order = _topological(graph)
        for node in order:
            if all(not i or i in self._static for i in node.input):
                self._static.update(o for o in node.output if o)
            self._visit(node)
        # the real channel count of each blocked tensor, where the graph establishes it
        self.channels: dict[str, int] = _channels(order, self.blocked, dims or {}, named or {}) if self.blocked else {}

    def _rank(self, name: str) -> int | None:
        labels = self.labels.get(name)
        if labels is not None and not isinstance(labels, Whole):
            return len(labels)
        return self.ranks.get(name)

    def _activation(self, name: str) -> bool:
        return bool(name) and name not in self._static

    def _visit(self, node: onnx.NodeProto) -> None:
        op, domain = node.op_type, node.domain
        outputs = [o for o in node.output if o]
        data = node.input[_DATA_INPUT.get(op, 0)] if len(node.input) > _DATA_INPUT.get(op, 0) else ""
        source, blocked = self.labels.get(data), data in self.blocked
        if domain == _NCHWC:
            labels = source
            if op in ("ReorderInput", "ReorderOutput") and _attribute(node, "channels_last", 0) and source is not None:
                # ReorderInput reads NHWC positions into NCHW ones; ReorderOutput writes NCHW positions as NHWC
                labels = self._permuted(source, (0, 3, 1, 2) if op == "ReorderInput" else (0, 2, 3, 1))
            self._set(outputs, labels, blocked=op != "ReorderOutput")
            return
        if domain not in (*_ONNX, _MS, _NHWC):
            self._fresh(outputs)
            return
        if op == "Transpose":
            perm = _attribute(node, "perm")
            if source is None or blocked:
                self._set(outputs, None)
            elif perm is None:
                self._set(outputs, tuple(reversed(source)) if not isinstance(source, Whole) else None)
            else:
                self._set(outputs, self._permuted(source, tuple(int(p) for p in perm)))
            return
        if op in ("Squeeze", "Unsqueeze") or (op in _REDUCE and not _attribute(node, "keepdims", 1)):
            if op in _REDUCE and _axes(node, self._constants) is None:
                self._fresh(outputs)  # every axis reduced: a scalar
            else:
                self._set(outputs, self._squeezed(node, source), blocked=blocked)
            return
        if op in _BROADCASTING:
            names = [i for i in node.input if self._activation(i)]
            candidates = [self.labels.get(i) for i in names]
            if not candidates or any(c is None for c in candidates):
                self._set(outputs[:1], None)
                return
            self._set(outputs[:1], _broadcast(candidates, [self._rank(i) for i in names]),
                      blocked=any(i in self.blocked for i in node.input))
            return
        if op == "Reshape" and blocked:
            # ORT's own Reshapes of a blocked tensor (to (N, Cp/b, H, W, b) and back, NchwcTransformer's
            # InsertReshape): the same blocks
            self._set(outputs, None, blocked=True)
            return
        if op in _POSITIONAL or op in _REDUCE:
            if not self._activation(data):
                self._fresh(outputs)
                return
            # Split, TopK, DynamicQuantizeLinear…: only outputs of the data's rank keep its labels
            first = outputs[:1] if op in ("DynamicQuantizeLinear", "TopK", "Dropout") else outputs
            self._set(first, source, blocked=blocked)
            if op == "TopK" and len(outputs) > 1:
                self._set(outputs[1:], source, blocked=blocked)
            elif first is not outputs:
                self._fresh(outputs[1:])
            return
        self._fresh(outputs)

    def _permuted(self, source, perm: tuple[int, ...]):
        expanded = _expand(source, len(perm))
        if len(expanded) != len(perm) or sorted(perm) != list(range(len(perm))):
            return None
        return tuple(expanded[p] for p in perm)

    def _squeezed(self, node: onnx.NodeProto, source):
        axes = _axes(node, self._constants)
        if isinstance(source, Whole) and self.ranks.get(node.input[0]) is not None:
            source = _expand(source, self.ranks[node.input[0]])
        if source is None or axes is None or isinstance(source, Whole):
            return None
        labels = list(source)
        if node.op_type == "Unsqueeze":
            rank = len(labels) + len(axes)
            for axis in sorted(a % rank for a in axes):
                labels.insert(axis, (f"{node.output[0]}:new", axis))
            return tuple(labels)
        rank = len(labels)
        drop = {a % rank for a in axes}
        return tuple(label for i, label in enumerate(labels) if i not in drop)

    def _set(self, outputs: Iterable[str], labels, blocked: bool = False) -> None:
        for out in outputs:
            self.labels[out] = labels
            if blocked:
                self.blocked.add(out)

    def _fresh(self, outputs: Iterable[str]) -> None:
        """A new value: labelled after its own tensor."""
        for out in outputs:
            self.labels[out] = Whole(out)


@dataclass
class Layouts:
    """Labels of the original model and of ORT's optimized graph: the layout of any observed tensor against any
    original tensor."""

    original: GraphLayout
    optimized: GraphLayout

    @classmethod
    def of(cls, original: onnx.ModelProto, optimized: onnx.ModelProto, original_ranks: dict[str, int] | None = None,
           optimized_ranks: dict[str, int] | None = None, original_dims: dict[str, tuple] | None = None,
           optimized_dims: dict[str, tuple] | None = None) -> "Layouts":
        """``*_ranks``: tensor ranks where known (shape inference; onnxruntime's types); ``*_dims``: shapes where
        known, for the channel counts of NCHWc-blocked tensors."""
        named = {name: int(shape[1]) for name, shape in (original_dims or {}).items()
                 if len(shape) == 4 and isinstance(shape[1], int) and shape[1] > 0}
        return cls(GraphLayout(original, original_ranks),
                   GraphLayout(optimized, optimized_ranks, optimized_dims, named))

    def permutation(self, observed: str, original: str) -> tuple[int, ...] | None:
        """``p`` with ``observed = transpose(original, p)``; ``()`` the same order; ``None`` not established
        (unknown labels, other labels, or NCHWc blocks)."""
        if observed in self.optimized.blocked or original in self.original.blocked:
            return None
        return permutation(self.optimized.labels.get(observed), self.original.labels.get(original))

    def blocked(self, observed: str) -> bool:
        return observed in self.optimized.blocked

    def channels(self, observed: str) -> int:
        """The real channel count of a blocked tensor of the optimized graph; 0 where the graph does not establish it."""
        return self.optimized.channels.get(observed, 0)


def _channels(order: list[onnx.NodeProto], blocked: set[str], dims: dict[str, tuple],
              named: dict[str, int]) -> dict[str, int]:
    """The real channel count of each blocked tensor that the graph establishes (NchwcTransformer's ``channels_``,
    which it writes only on ReorderOutput): forward from ReorderInput's input (its channel axis), an NCHWc Conv's
    namesake in the original model and the 4th input a Sum was fused through, through the ops that keep channels
    (sums over Concat); backward from ReorderOutput's ``channels``. A tensor two rules give two counts is left out."""
    known: dict[str, int] = {}
    torn: set[str] = set()

    def put(name: str, value) -> None:
        if not name or name not in blocked or name in torn or not isinstance(value, int) or value <= 0:
            return
        if known.setdefault(name, value) != value:
            torn.add(name)
            del known[name]

    def axis(name: str, index: int):
        shape = dims.get(name)
        return shape[index] if shape is not None and len(shape) == 4 else None

    for _ in range(3):  # forward and backward, until the counts carry through chains of both
        for node in order:
            op, outputs = node.op_type, [o for o in node.output if o]
            if not outputs:
                continue
            out, data = outputs[0], node.input[0] if node.input else ""
            if node.domain == _NCHWC:
                if op == "ReorderInput":
                    put(out, axis(data, 3 if _attribute(node, "channels_last", 0) else 1))
                elif op == "ReorderOutput":
                    put(data, _attribute(node, "channels"))
                elif op == "Conv":
                    found = _NCHWC_NAME.match(node.name or "")
                    put(out, named.get(found.group("tensor")) if found else None)
                    if len(node.input) > 3 and node.input[3]:  # Conv + Sum: the sum's other addend
                        put(out, known.get(node.input[3]))
                elif op in _NCHWC_KEEP:
                    put(out, known.get(data))
            elif out in blocked and op in _BLOCKED_KEEP:
                addends = [i for i in node.input if i in blocked] if op != "Reshape" else [data]
                counts = {known.get(i) for i in addends}
                if len(counts) == 1:
                    put(out, counts.pop())
            elif out in blocked and op == "Concat":
                counts = [known.get(i) for i in node.input if i]
                if counts and all(counts):
                    put(out, sum(counts))
        for node in reversed(order):  # backward through the ops that keep channels
            op, outputs = node.op_type, [o for o in node.output if o]
            if not outputs or outputs[0] not in known:
                continue
            keeps = (node.domain == _NCHWC and op in _NCHWC_KEEP) or (node.domain in _ONNX and op in _BLOCKED_KEEP)
            if keeps:
                for i in ([node.input[0]] if op == "Reshape" or node.domain == _NCHWC else node.input):
                    if i not in known:
                        put(i, known[outputs[0]])
    return known


def unblock(array: np.ndarray, block: int, channels: int) -> np.ndarray:
    """An NCHWc-blocked tensor (N, Cp, H, W) — or ORT's (N, Cp/b, H, W, b) view of it — in NCHW with its ``channels``
    real channels (contiguous): the layout every processor's tensor has, whatever its block."""
    n, groups, h, w = _blocks(array.shape, block, channels)
    padded = groups * block
    view = array.reshape(n, groups, h, w, block).transpose(0, 1, 4, 2, 3).reshape(n, padded, h, w)
    return np.ascontiguousarray(view[:, :channels])


def unblocked_shape(shape: tuple[int, ...], block: int, channels: int) -> tuple[int, ...]:
    """The shape ``unblock`` gives a blocked tensor of ``shape``, without computing it (its errors alike)."""
    n, _, h, w = _blocks(tuple(shape), block, channels)
    return (n, channels, h, w)


def _blocks(shape: tuple[int, ...], block: int, channels: int) -> tuple[int, int, int, int]:
    """N, channel groups, H, W of a tensor held in NCHWc blocks of ``block`` that holds ``channels`` channels."""
    if len(shape) == 5 and shape[-1] == block:
        n, groups, h, w = shape[:4]
    elif len(shape) == 4 and block > 0 and shape[1] % block == 0:
        n, padded, h, w = shape
        groups = padded // block
    else:
        raise ValueError(f"a tensor of shape {tuple(shape)} is not held in NCHWc blocks of {block}")
    padded = groups * block
    if not padded - block < channels <= padded:
        raise ValueError(f"a tensor of {padded} NCHWc channels (blocks of {block}) cannot hold {channels} channels")
    return int(n), int(groups), int(h), int(w)


def holds(padded: int | None, block: int, channels: int) -> bool:
    """Whether a blocked tensor of ``padded`` channels (its runtime channel axis) holds ``channels`` real ones in
    blocks of ``block``: ``padded`` is ``channels`` rounded up to the block."""
    return isinstance(padded, int) and block > 0 and padded % block == 0 and padded - block < channels <= padded


def nchwc_filters(model: onnx.ModelProto) -> dict[str, str]:
    """The constants ORT reordered for its NCHWc Convs, each with its format: ``OIHWBo`` (a Conv reading an NCHW input
    directly, and depthwise Convs) or ``OIHWBiBo`` (``MlasReorderFilterOIHWBo`` / ``…OIHWBiBo``)."""
    graph = model.graph
    layout_blocked = GraphLayout(model).blocked
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    found: dict[str, str] = {}
    for node in graph.node:
        if node.domain != _NCHWC or node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in shapes:
            continue
        dims = shapes[node.input[1]]
        depthwise = int(_attribute(node, "group", 1)) > 1 and len(dims) == 4 and dims[1] == 1
        found[node.input[1]] = "OIHWBo" if depthwise or node.input[0] not in layout_blocked else "OIHWBiBo"
    return found


def unblock_filter(weights: np.ndarray, block: int, form: str) -> np.ndarray | None:
    """A filter ORT reordered for an NCHWc Conv (``nchwc_filters``) back in OIHW (padding included), or ``None``
    where its shape does not divide into blocks of ``block``. OIHWBiBo holds [O/b][I/b][H][W][bi][bo], OIHWBo
    [O/b][I][H][W][bo] (onnxruntime/core/mlas/lib/reorder.cpp)."""
    if weights.ndim != 4 or block <= 0:
        return None
    o, i, h, w = weights.shape
    if o % block or (form == "OIHWBiBo" and i % block):
        return None
    if form == "OIHWBo":
        return np.ascontiguousarray(weights.reshape(o // block, i, h, w, block).transpose(0, 4, 1, 2, 3).reshape(o, i, h, w))
    view = weights.reshape(o // block, i // block, h, w, block, block)
    return np.ascontiguousarray(view.transpose(0, 5, 1, 4, 2, 3).reshape(o, i, h, w))


@lru_cache(maxsize=1)
def block_size() -> int:
    """The NCHWc block this process's onnxruntime uses (``MlasNchwcGetBlockSize``), measured: a ReorderInput of 4
    channels pads them to one block. 0 where onnxruntime has no NCHWc kernels."""
    import onnxruntime as ort

    node = onnx.helper.make_node("ReorderInput", ["x"], ["y"], domain=_NCHWC)
    graph = onnx.helper.make_graph([node], "qconsist_nchwc_block",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 1, 1])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13), onnx.helper.make_opsetid(_NCHWC, 1)])
    model.ir_version = 7
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return int(session.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})[0].shape[1])
    except Exception:  # noqa: BLE001 - a build without the NCHWc kernels (onnxruntime raises its own types)
        return 0
