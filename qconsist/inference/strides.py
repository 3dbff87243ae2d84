"""Which spatial sizes a model with a dynamic height and width takes, read from its graph.

Each tensor computed from an image input carries a stride: how many input pixels one of its pixels spans.
Convolutions and pools multiply it by their ``strides``, ``SpaceToDepth`` by its block; ``ConvTranspose``,
``DepthToSpace`` and a ``Resize``/``Upsample`` with constant scales divide it; global pools, ``Flatten`` and
the like end it; every other operator passes on the largest stride of its inputs (where the graph is not
followed, the answer errs towards allowing more sizes, never fewer). A model that upsamples a
tensor of stride ``s`` merges it, as encoder-decoders, feature pyramids and detector necks do, with a tensor
of the same size computed at a finer stride: the sizes agree only when the input's height and width are
multiples of ``s`` (a stride-2 convolution rounds 25 up to 13, which upsamples to 26, not 25). So the model
takes multiples of the largest stride any upsampled tensor has; a model that never upsamples (a classifier)
says nothing about its sizes (``None``).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from qconsist.inputs.inputset import InputSpec

if TYPE_CHECKING:
    import onnx

_DOWN = {"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "MaxRoiPool"}
_ENDS = {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "Flatten", "Gemm", "MatMul", "ReduceMean",
         "ReduceMax", "ReduceSum", "Reshape", "Shape", "Size"}


def _strides(node: onnx.NodeProto) -> int:
    for attribute in node.attribute:
        if attribute.name == "strides" and attribute.ints:
            return max(attribute.ints)
    return 1


def _block(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "blocksize"), 1)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    from onnx import numpy_helper  # onnx is imported by whoever loaded the model

    found = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                found[node.output[0]] = numpy_helper.to_array(value)
    return found


def _scale(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> Fraction | None:
    """The spatial factor of a Resize/Upsample (its largest constant scale), ``None`` when not constant."""
    name = node.input[2] if node.op_type == "Resize" and len(node.input) > 2 else (
        node.input[1] if node.op_type == "Upsample" and len(node.input) > 1 else "")
    scales = constants.get(name)
    if scales is None or scales.size < 3:
        return None
    return Fraction(float(np.max(scales[2:]))).limit_denominator(64)


def spatial_multiple(model: onnx.ModelProto, input_name: str) -> int | None:
    """The multiple of which the input's height and width must be (module docstring), or ``None``."""
    graph = model.graph
    constants = _constants(graph)
    stride: dict[str, Fraction] = {input_name: Fraction(1)}
    multiple = Fraction(0)
    for node in graph.node:
        known = [stride[name] for name in node.input[:1 if node.op_type in _DOWN | {"Resize", "Upsample"} else None]
                 if name in stride]
        if not known or node.op_type in _ENDS:
            continue
        here = max(known)
        factor: Fraction | None = Fraction(1)
        if node.op_type in _DOWN:
            here *= _strides(node)
        elif node.op_type == "SpaceToDepth":
            here *= _block(node)
        elif node.op_type == "ConvTranspose":
            factor = Fraction(_strides(node))
        elif node.op_type == "DepthToSpace":
            factor = Fraction(_block(node))
        elif node.op_type in ("Resize", "Upsample"):
            factor = _scale(node, constants)
        if factor is not None and factor > 1:  # (a Resize to sizes computed at run time adapts to any size)
            multiple = max(multiple, here)  # an upsampled tensor: the sizes must divide by its stride
            here = here / factor
        for output in node.output:
            stride[output] = here
    return int(multiple) if multiple >= 2 and multiple.denominator == 1 else None


def with_multiples(specs: Sequence[InputSpec], graph: Callable[[], onnx.ModelProto]) -> list[InputSpec]:
    """``specs`` with ``multiple`` set for 4-D inputs whose height and width are dynamic (the model from
    ``graph()``, loaded only when such an input exists)."""
    free = [s.name for s in specs if len(s.shape) == 4 and sum(not isinstance(d, int) or d <= 0 for d in s.shape[1:]) >= 2]
    if not free:
        return list(specs)
    model = graph()
    return [replace(s, multiple=spatial_multiple(model, s.name)) if s.name in free else s for s in specs]
