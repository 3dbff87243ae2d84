"""qconsist's post-conversion pass over caffe2onnx's output: fixes of its layer-mapping bugs.

Each repair returns a line saying what it changed; the lines are recorded in the manifest.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def fold_maxpool_padding(model: onnx.ModelProto) -> list[str]:
    """caffe2onnx pads before MaxPool with an explicit Pad(constant=-inf) node.

    MaxPool's own ``pads`` attribute has the same meaning (padding never wins a max), and the -inf constant
    becomes a NaN quantization scale (``pool1_constant_value_scale``). Fold the Pad into the MaxPool.
    """
    inits = _initializers(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    done = []
    remove = []
    for node in model.graph.node:
        if node.op_type != "Pad" or len(node.input) < 2:
            continue
        users = consumers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "MaxPool":
            continue
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
        if mode != b"constant" or node.input[1] not in inits:
            continue
        value = -math.inf
        if len(node.input) > 2 and node.input[2]:
            if node.input[2] not in inits:
                continue
            value = float(numpy_helper.to_array(inits[node.input[2]]).reshape(-1)[0])
        if value != -math.inf:
            continue
        pads = numpy_helper.to_array(inits[node.input[1]]).astype(np.int64).tolist()
        rank = len(pads) // 2
        begin, end = pads[:rank], pads[rank:]
        if any(begin[:2]) or any(end[:2]):
            continue
        pool = users[0]
        old = next((a for a in pool.attribute if a.name == "pads"), None)
        old_pads = list(old.ints) if old is not None else [0] * (2 * (rank - 2))
        spatial = [b + o for b, o in zip(begin[2:], old_pads[: rank - 2])] + [
            e + o for e, o in zip(end[2:], old_pads[rank - 2 :])
        ]
        if old is not None:
            pool.attribute.remove(old)
        pool.attribute.append(helper.make_attribute("pads", spatial))
        pool.input[0] = node.input[0]
        remove.append(node)
        done.append(f"folded Pad '{node.name}' (-inf) into MaxPool '{pool.name}' pads={spatial}")
    for node in remove:
        model.graph.node.remove(node)
    _drop_unused_initializers(model)
    return done


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def initializers_out_of_inputs(model: onnx.ModelProto) -> list[str]:
    """caffe2onnx lists every weight as a graph input too; onnxruntime then treats weights as overridable
    inputs (no constant folding) and asks for them at run time. Keep only the real inputs."""
    init_names = {t.name for t in model.graph.initializer}
    used = {name for node in model.graph.node for name in node.input}
    real = [v for v in model.graph.input if v.name not in init_names and v.name in used]
    moved = len(model.graph.input) - len(real)
    if not moved:
        return []
    del model.graph.input[:]
    model.graph.input.extend(real)
    return [f"removed {moved} initializers from the graph inputs"]


def set_dynamic_batch(model: onnx.ModelProto, name: str = "batch") -> list[str]:
    """Make dimension 0 of every graph input and output symbolic."""
    init_names = {t.name for t in model.graph.initializer}
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name in init_names:
            continue
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = name
    del model.graph.value_info[:]
    # Reshape targets with a fixed batch must follow: caffe2onnx writes the batch explicitly.
    done = ["dynamic batch dimension 'batch' on inputs and outputs"]
    inits = _initializers(model)
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] in inits:
            shape = numpy_helper.to_array(inits[node.input[1]]).astype(np.int64)
            if shape.size and shape[0] > 0:
                shape = shape.copy()
                shape[0] = 0  # copy the batch dimension from the input
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
                done.append(f"Reshape '{node.name}' keeps the input's batch dimension")
    return done


def repair_model(model: onnx.ModelProto, net, weights, options) -> list[str]:
    repairs = []
    repairs += fold_maxpool_padding(model)
    repairs += initializers_out_of_inputs(model)
    if options.dynamic_batch:
        repairs += set_dynamic_batch(model)
    return repairs
