"""Numerical check of a rewritten model against its original on the CPU: seeded inputs, the original's
intermediate tensors captured, each replacement run alone on the very tensors that reached the node it
replaces, and the two models' outputs compared. onnxruntime runs with graph optimizations off, so the
operators compared are the ones written."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qconsist.errors import ConfigError
from qconsist.stages.caffe.fidelity import OutputCheck, compare
from qconsist.inference.session import OptimizationLevel, MEASUREMENT, create_session


def _session(model: onnx.ModelProto):
    """The CPU without graph optimizations, one intra-op thread (``qconsist.threads``)."""
    return create_session(model.SerializeToString(), MEASUREMENT.with_options(graph_optimization_level=OptimizationLevel.DISABLE))


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def seeded_feeds(model: onnx.ModelProto, seed: int, batch: int, given: dict[str, np.ndarray] | None = None
                 ) -> dict[str, np.ndarray]:
    """A standard-normal sample for every float input (a dynamic first dimension becomes ``batch``);
    ``given`` values are used as they are. Integer inputs and other dynamic dimensions must be given."""
    given = dict(given or {})
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph_inputs(model):
        if value.name in given:
            feeds[value.name] = np.asarray(given.pop(value.name))
            continue
        tensor = value.type.tensor_type
        shape = []
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value"):
                shape.append(dim.dim_value)
            elif axis == 0:
                shape.append(batch)
            else:
                raise ConfigError(f"input '{value.name}' has a dynamic dimension {axis} ({dim.dim_param or '?'}); "
                                  "give the check's inputs")
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if dtype.kind != "f":
            raise ConfigError(f"input '{value.name}' is {dtype} and cannot be drawn at random; give the check's inputs")
        feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    if given:
        raise ConfigError(f"check inputs {sorted(given)} are no inputs of the model")
    return feeds


def capture(model: onnx.ModelProto, names: list[str], feeds: dict[str, np.ndarray], types: dict[str, int]
            ) -> dict[str, np.ndarray]:
    """The model's graph outputs and the tensors ``names`` (exposed as extra outputs) on ``feeds``."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name not in present and name not in feeds:
            exposed.graph.output.append(helper.make_tensor_value_info(name, types.get(name, TensorProto.FLOAT), None))
            present.add(name)
    session = _session(exposed)
    wanted = [o.name for o in session.get_outputs()]
    return {**feeds, **dict(zip(wanted, session.run(wanted, feeds)))}


def check_replacement(model: onnx.ModelProto, nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto],
                      tensors: dict[str, np.ndarray], output: str, rtol: float, atol: float) -> OutputCheck:
    """Run ``nodes`` alone on the captured ``tensors`` they read; compare with the captured ``output``."""
    own = {t.name for t in initializers} | {o for n in nodes for o in n.output}
    model_initializers = {t.name: t for t in model.graph.initializer}
    needed = [name for n in nodes for name in n.input if name and name not in own]
    inputs, extra = [], []
    for name in dict.fromkeys(needed):
        if name in model_initializers:
            extra.append(model_initializers[name])
        else:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(tensors[name].dtype), tensors[name].shape))
    expected = tensors[output]
    graph = helper.make_graph(nodes, "replacement", inputs,
                              [helper.make_tensor_value_info(output, helper.np_dtype_to_tensor_dtype(expected.dtype), None)],
                              list(initializers) + extra)
    alone = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    session = _session(alone)
    (actual,) = session.run([output], {v.name: tensors[v.name] for v in inputs})
    return compare(output, actual, expected, rtol, atol)


def compare_outputs(original: dict[str, np.ndarray], rewritten: dict[str, np.ndarray], names: list[str],
                    rtol: float, atol: float) -> list[OutputCheck]:
    return [compare(name, rewritten[name], original[name], rtol, atol) for name in names]


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))
