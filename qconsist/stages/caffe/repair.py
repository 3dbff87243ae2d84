"""qconsist's post-conversion pass over caffe2onnx's output: each Caffe layer's ONNX nodes are given that
layer's exact semantics, read from the *original* network and weights.

Every repair that changes what the model computes (or whether it loads) returns a line saying what it
changed and why; the lines are recorded in ``ConvertResult.repairs`` and the manifest. The caffe2onnx
defects behind them are listed case by case in ``tests/caffe_builder.py`` (``LAYER_CASES``, what caffe2onnx
alone does) and proven by ``tests/stages/test_convert_layers.py::test_caffe2onnx_alone``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qconsist.errors import ConfigError, UnsupportedModelError
from qconsist.stages.caffe.geometry import (
    channel_shape, conv_geometry, crop_offsets, infer_shapes, input_shapes, layers_of, onnx_pool_pads, output_blobs,
    pool_geometry,
)
from qconsist.stages.caffe.normalize import reshape_dims


@dataclass
class Graph:
    """caffe2onnx's model with look-ups by node name, plus the original Caffe network."""

    model: onnx.ModelProto
    net: object
    params: dict[str, list[np.ndarray]]
    shapes: dict = field(default_factory=dict)

    def node(self, name: str) -> onnx.NodeProto | None:
        return next((n for n in self.model.graph.node if n.name == name), None)

    def initializer(self, name: str) -> onnx.TensorProto | None:
        return next((t for t in self.model.graph.initializer if t.name == name), None)

    def set_initializer(self, name: str, array: np.ndarray) -> None:
        tensor = numpy_helper.from_array(np.ascontiguousarray(array), name)
        old = self.initializer(name)
        if old is not None:
            old.CopyFrom(tensor)
        else:
            self.model.graph.initializer.append(tensor)

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.initializer(name))

    def insert_before(self, anchor: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> None:
        index = list(self.model.graph.node).index(anchor)
        for offset, node in enumerate(nodes):
            self.model.graph.node.insert(index + offset, node)


def _set_attribute(node: onnx.NodeProto, name: str, value) -> bool:
    """Set ``name``; True when the value changed."""
    old = next((a for a in node.attribute if a.name == name), None)
    new = helper.make_attribute(name, value)
    if old is not None:
        if helper.get_attribute_value(old) == helper.get_attribute_value(new):
            return False
        node.attribute.remove(old)
    node.attribute.append(new)
    return True


def _drop_attribute(node: onnx.NodeProto, name: str) -> None:
    for attribute in [a for a in node.attribute if a.name == name]:
        node.attribute.remove(attribute)


def _summary(what: str, names: list[str]) -> list[str]:
    if not names:
        return []
    shown = ", ".join(names[:4]) + (f", … ({len(names)} layers)" if len(names) > 4 else "")
    return [f"{what}: {shown}"]


# --- per layer type ---------------------------------------------------------------------------------------


def repair_convolutions(g: Graph) -> list[str]:
    """caffe2onnx repeats a two-valued kernel_size / pad / stride into 4 / 8 values (an invalid model),
    uses only the first dilation, and ignores a lone pad_h or stride_h."""
    changed = []
    for layer in layers_of(g.net):
        if layer.type not in ("Convolution", "Deconvolution"):
            continue
        node = g.node(layer.name)
        geo = conv_geometry(layer.convolution_param)
        (ph, pw) = geo["pad"]
        updates = {
            "kernel_shape": list(geo["kernel"]), "strides": list(geo["stride"]), "dilations": list(geo["dilation"]),
            "pads": [ph, pw, ph, pw], "group": int(layer.convolution_param.group),
        }
        if any([_set_attribute(node, k, v) for k, v in updates.items()]):
            changed.append(layer.name)
    return _summary("Convolution geometry rewritten from Caffe's kernel/pad/stride/dilation (caffe2onnx's was wrong)", changed)


def repair_pooling(g: Graph) -> list[str]:
    """caffe2onnx pads with a separate Pad node (-FLT_MAX for MAX, 0 for AVE) and pools the padded tensor
    with ``pads = 0``. The pool then no longer knows the padding, so Caffe's rule that the last window
    starts inside the image is lost (onnxruntime returns a larger output, unless its optimiser happens to
    fuse the Pad back), and -FLT_MAX becomes a NaN quantization scale. It also drops a lone pad_h / pad_w,
    kernel_h / kernel_w or stride_h / stride_w. Rebuild one pool node from Caffe's parameters."""
    lines, folded = [], []
    for layer in layers_of(g.net):
        if layer.type != "Pooling":
            continue
        param = layer.pooling_param
        pool, pad = g.node(layer.name), g.node(layer.name + "_output")
        if pad is not None and pad.op_type == "Pad":
            pool.input[0] = pad.input[0]
            g.model.graph.node.remove(pad)
            folded.append(layer.name)
        _, _, h, w = g.shapes[(layer.name, layer.bottom[0])]
        is_max = param.pool == 0
        if param.global_pooling:
            pool.op_type = "GlobalMaxPool" if is_max else "GlobalAveragePool"
            del pool.attribute[:]
            continue
        geo = pool_geometry(param, h, w)
        (ph, pw) = geo["pad"]
        ceil_mode, pads = onnx_pool_pads(param, g.shapes[(layer.name, layer.bottom[0])])
        del pool.attribute[:]
        pool.op_type = "MaxPool" if is_max else "AveragePool"
        pool.attribute.extend([
            helper.make_attribute("kernel_shape", list(geo["kernel"])),
            helper.make_attribute("strides", list(geo["stride"])),
            helper.make_attribute("pads", pads),
            helper.make_attribute("ceil_mode", ceil_mode),
        ])
        if not is_max:
            # Caffe divides by the window clipped to the padded image: padding counts.
            pool.attribute.append(helper.make_attribute("count_include_pad", 1))
        if ph or pw or ceil_mode == 0 and param.round_mode == 0:
            lines.append(f"Pooling '{layer.name}': {pool.op_type} pads={pads} ceil_mode={ceil_mode}"
                         + (" count_include_pad=1" if not is_max else "") + " (Caffe's output size and divisor)")
    return _summary("Pooling: caffe2onnx's separate Pad node folded into the pool (before MAX its -FLT_MAX "
                    "becomes a NaN quantization scale; before AVE it loses Caffe's output size)", folded) + lines


def repair_batch_norm(g: Graph) -> list[str]:
    """caffe2onnx divides the stored variance by ``factor + 1e-5`` (the mean by ``factor``), crashes on a
    factor of 0, and reads ``eps`` as given. Write Caffe's exact statistics."""
    changed = []
    for layer in layers_of(g.net):
        if layer.type != "BatchNorm":
            continue
        blobs = g.params[layer.name]
        factor = float(blobs[2].reshape(-1)[0]) if len(blobs) > 2 else 1.0
        inverse = 0.0 if factor == 0 else 1.0 / factor
        node = g.node(layer.name)
        for index, suffix in ((3, "_mean"), (4, "_var")):
            exact = (blobs[index - 3].reshape(-1) * inverse).astype(np.float32)
            name = node.input[index]
            if not np.array_equal(g.array(name), exact):
                changed.append(f"{layer.name}{suffix}")
            g.set_initializer(name, exact)
        _set_attribute(node, "epsilon", float(layer.batch_norm_param.eps))
        _drop_attribute(node, "momentum")  # training only
    layers = sorted({name.rsplit("_", 1)[0] for name in changed})
    return _summary("BatchNorm statistics divided by Caffe's exact moving-average factor (caffe2onnx adds 1e-5 to it)", layers)


def repair_scale(g: Graph) -> list[str]:
    """caffe2onnx shapes a stand-alone Scale's blobs [1, C, 1, 1] whatever the bottom's rank, ``axis`` and
    ``num_axes`` (wrong broadcast on 2-D blobs, a crash or a wrong axis otherwise)."""
    changed = []
    for layer in layers_of(g.net):
        if layer.type != "Scale" or g.node(layer.name + "_mul") is None and g.node(layer.name) is None:
            continue
        bottom = g.shapes[(layer.name, layer.bottom[0])]
        param = layer.scale_param
        axis = param.axis % len(bottom)
        count = len(bottom) - axis if param.num_axes == -1 else int(param.num_axes)
        shape = channel_shape(len(bottom), axis, bottom[axis : axis + count])
        names = [layer.name + "_scale"] + ([layer.name + "_bias"] if param.bias_term else [])
        for name, blob in zip(names, g.params[layer.name]):
            if g.initializer(name) is None:
                continue  # fused into a BatchNormalization node
            if tuple(g.array(name).shape) != shape:
                changed.append(layer.name)
            g.set_initializer(name, blob.reshape(shape).astype(np.float32))
    return _summary("Scale blobs shaped for Caffe's axis/num_axes and the bottom's rank", sorted(set(changed)))


def repair_prelu(g: Graph) -> list[str]:
    """ONNX broadcasts PRelu's slope from the right: caffe2onnx's [C] slope multiplies the width axis
    (onnxruntime refuses it, or silently uses it when W == C). Shape it [C, 1, 1]."""
    changed = []
    for layer in layers_of(g.net):
        if layer.type != "PReLU":
            continue
        bottom = g.shapes[(layer.name, layer.bottom[0])]
        slope = g.params[layer.name][0].reshape(-1)
        shape = (1,) if layer.prelu_param.channel_shared else channel_shape(len(bottom), 1, bottom[1:2])[1:]
        node = g.node(layer.name)
        if tuple(g.array(node.input[1]).shape) != tuple(shape):
            changed.append(layer.name)
        g.set_initializer(node.input[1], slope.reshape(shape).astype(np.float32))
    return _summary("PReLU slope shaped [C, 1, 1] (caffe2onnx's [C] broadcasts over the width)", changed)


def repair_eltwise(g: Graph) -> list[str]:
    """caffe2onnx ignores SUM's ``coeff``, emits a 3-input Add (invalid), and crashes on PROD and MAX
    (``normalize.py`` hands it SUM). Rebuild: coefficients as Mul, then Sum / a Mul chain / Max."""
    lines = []
    for layer in layers_of(g.net):
        if layer.type != "Eltwise":
            continue
        node = g.node(layer.name)
        inputs, output = list(node.input), node.output[0]
        param = layer.eltwise_param
        new: list[onnx.NodeProto] = []
        if param.operation == 1:
            coeff = list(param.coeff) or [1.0] * len(inputs)
            if len(coeff) != len(inputs):
                raise UnsupportedModelError(f"Eltwise '{layer.name}' has {len(coeff)} coefficients for {len(inputs)} bottoms")
            scaled = []
            for i, (name, k) in enumerate(zip(inputs, coeff)):
                if k == 1.0:
                    scaled.append(name)
                    continue
                const = f"{layer.name}_coeff{i}"
                g.set_initializer(const, np.array(k, np.float32))
                new.append(helper.make_node("Mul", [name, const], [f"{layer.name}_scaled{i}"], f"{layer.name}_coeff{i}"))
                scaled.append(new[-1].output[0])
            new.append(helper.make_node("Sum", scaled, [output], layer.name))
            if any(k != 1.0 for k in coeff) or len(inputs) > 2:
                lines.append(f"Eltwise '{layer.name}': SUM over {len(inputs)} bottoms with coefficients {coeff} (caffe2onnx: Add, coefficients ignored)")
        elif param.operation == 0:
            current = inputs[0]
            for i, name in enumerate(inputs[1:], start=1):
                out = output if i == len(inputs) - 1 else f"{layer.name}_prod{i}"
                new.append(helper.make_node("Mul", [current, name], [out], layer.name if out == output else out))
                current = out
            lines.append(f"Eltwise '{layer.name}': PROD built as Mul (caffe2onnx crashes on PROD)")
        else:
            new.append(helper.make_node("Max", inputs, [output], layer.name))
            lines.append(f"Eltwise '{layer.name}': MAX built as Max (caffe2onnx crashes on MAX)")
        g.insert_before(node, new)
        g.model.graph.node.remove(node)
    return lines


def repair_inner_product(g: Graph) -> list[str]:
    """caffe2onnx ignores ``transpose`` (Gemm always transB=1) and ``axis`` (it flattens to 2-D), and
    reshapes with a fixed batch. Gemm for axis 1 (flatten from axis 1, keeping the batch), else MatMul."""
    lines = []
    for layer in layers_of(g.net):
        if layer.type != "InnerProduct":
            continue
        param = layer.inner_product_param
        bottom = g.shapes[(layer.name, layer.bottom[0])]
        axis = param.axis % len(bottom)
        gemm, flatten = g.node(layer.name), g.node(layer.name + "_Reshape")
        blobs = g.params[layer.name]
        num = int(param.num_output)
        weight = blobs[0].reshape(-1, num) if param.transpose else blobs[0].reshape(num, -1)
        weight_nk = (weight.T if param.transpose else weight).astype(np.float32)  # (num_output, K)
        source = flatten.input[0] if flatten is not None else gemm.input[0]
        if flatten is not None:
            g.model.graph.node.remove(flatten)
        reshaped = f"{layer.name}_Reshape"
        shape_name = f"{layer.name}_flatten_shape"
        g.set_initializer(shape_name, np.array([0] * axis + [-1], np.int64))
        reshape = helper.make_node("Reshape", [source, shape_name], [reshaped], reshaped)
        g.insert_before(gemm, [reshape])
        if axis == 1:
            gemm.input[0] = reshaped
            g.set_initializer(gemm.input[1], weight_nk)
            _set_attribute(gemm, "transB", 1)
        else:
            weight_name = gemm.input[1]
            g.set_initializer(weight_name, np.ascontiguousarray(weight_nk.T))
            output = gemm.output[0]
            bias = [gemm.input[2]] if len(gemm.input) > 2 else []
            if bias:
                g.set_initializer(bias[0], blobs[1].reshape(-1).astype(np.float32))
            nodes = [helper.make_node("MatMul", [reshaped, weight_name], [output if not bias else f"{layer.name}_matmul"], f"{layer.name}_matmul")]
            if bias:
                nodes.append(helper.make_node("Add", [nodes[0].output[0], bias[0]], [output], layer.name))
            g.insert_before(gemm, nodes)
            g.model.graph.node.remove(gemm)
        if param.transpose:
            lines.append(f"InnerProduct '{layer.name}': transposed weights (transpose: true) read as stored (caffe2onnx ignores transpose)")
        if axis != 1:
            lines.append(f"InnerProduct '{layer.name}': axis {axis} kept (caffe2onnx flattens everything after the batch)")
    return lines


def repair_reshape_layers(g: Graph) -> list[str]:
    """``normalize.py`` handed caffe2onnx Caffe's Flatten / Reshape as full ONNX dims; say which differ from
    what caffe2onnx would have written (it ignores axis, num_axes and end_axis)."""
    lines = []
    for layer in layers_of(g.net):
        if layer.type == "Flatten" and (layer.flatten_param.axis != 1 or layer.flatten_param.end_axis != -1):
            lines.append(f"Flatten '{layer.name}': axis {layer.flatten_param.axis} .. end_axis {layer.flatten_param.end_axis} honoured")
        elif layer.type == "Reshape" and (layer.reshape_param.axis != 0 or layer.reshape_param.num_axes != -1):
            lines.append(f"Reshape '{layer.name}': axis {layer.reshape_param.axis} / num_axes {layer.reshape_param.num_axes} honoured")
    return lines


def repair_dropout(g: Graph) -> list[str]:
    """caffe2onnx writes Dropout's ``ratio`` attribute, gone since opset 12 (the model fails the checker).
    Caffe's Dropout is the identity at inference (it scales while training): Identity."""
    changed = []
    for node in g.model.graph.node:
        if node.op_type == "Dropout":
            node.op_type = "Identity"
            del node.attribute[:]
            del node.input[1:]
            del node.output[1:]
            changed.append(node.name)
    return _summary("Dropout written as Identity (inference; caffe2onnx's ratio attribute is invalid since opset 12)", changed)


def _slice_arrays(g: Graph, node: onnx.NodeProto) -> list[list[int]] | None:
    """caffe2onnx's (starts, ends, axes) of a Slice node, None when they are not initializers."""
    if node.op_type != "Slice" or len(node.input) < 4 or any(g.initializer(n) is None for n in node.input[1:4]):
        return None
    return [g.array(name).reshape(-1).tolist() for name in node.input[1:4]]


def repair_crop(g: Graph) -> list[str]:
    """caffe2onnx writes Caffe's Crop as a Slice that also cuts the axes *before* ``axis`` to the second
    bottom's size (Caffe keeps them: an FCN's 21 class scores cropped to the 3-channel image keep 21
    channels), crashes on a negative ``axis`` (``normalize.py`` hands it the canonical one), and, since its
    Slice reads only the first bottom, leaves the second bottom (a shape only) as an extra graph output
    that comes first. Write the Slice from Caffe's axis and offsets (Identity when it cuts nothing)."""
    lines = []
    for layer in layers_of(g.net):
        if layer.type != "Crop":
            continue
        node = g.node(layer.name)
        data, size = g.shapes[(layer.name, layer.bottom[0])], g.shapes[(layer.name, layer.bottom[1])]
        offsets = crop_offsets(layer, data, size)
        start = layer.crop_param.axis % len(data)
        axes = [i for i in range(start, len(data)) if offsets[i] or data[i] != size[i]]
        starts, ends = [offsets[i] for i in axes], [offsets[i] + size[i] for i in axes]
        before, source = _slice_arrays(g, node), node.input[0]
        del node.input[:]
        if not axes:
            node.op_type = "Identity"
            node.input.append(source)
            continue
        for suffix, values in (("starts", starts), ("ends", ends), ("axes", axes)):
            g.set_initializer(f"{layer.name}_crop_{suffix}", np.array(values, np.int64))
        node.input.extend([source] + [f"{layer.name}_crop_{suffix}" for suffix in ("starts", "ends", "axes")])
        if before != [starts, ends, axes]:
            caffe2onnx = "none" if before is None else f"axes={before[2]} starts={before[0]} ends={before[1]}"
            lines.append(f"Crop '{layer.name}': Slice axes={axes} starts={starts} ends={ends} from Caffe's axis {layer.crop_param.axis} "
                         f"and offsets, axes before it kept (caffe2onnx: {caffe2onnx})")
    return lines + drop_crop_size_outputs(g)


def drop_crop_size_outputs(g: Graph) -> list[str]:
    """Graph outputs that are no Caffe output: a Crop's second bottom, which only gives a shape; caffe2onnx
    made it an output because its Slice does not read it. Removed, with the nodes that only fed it."""
    wanted = set(output_blobs(g.net))
    tops = {layer.name: list(layer.top) for layer in layers_of(g.net)}
    producer = {out: node.name for node in g.model.graph.node for out in node.output}
    extra = [v for v in g.model.graph.output
             if producer.get(v.name) in tops and not wanted.intersection(tops[producer[v.name]])]
    if not extra:
        return []
    for value in extra:
        g.model.graph.output.remove(value)
    keep = {v.name for v in g.model.graph.output}
    removed: list[str] = []
    while True:
        used = keep | {name for node in g.model.graph.node for name in node.input}
        dead = [node for node in g.model.graph.node if not used.intersection(node.output)]
        if not dead:
            break
        for node in dead:
            g.model.graph.node.remove(node)
            removed.append(node.name)
    names = ", ".join(f"'{producer[v.name]}'" for v in extra)
    return [f"Crop size reference(s) {names}: only a shape in Caffe, an extra graph output in caffe2onnx's model; "
            f"removed with the {len(removed)} node(s) that only computed it"]


def repair_first_layer_inputs(g: Graph) -> list[str]:
    """caffe2onnx feeds the first layer *all* the network's inputs, whatever its bottoms say (a Concat or
    Eltwise of the input with itself gets one input). Give it its bottoms."""
    inputs = input_shapes(g.net)
    first = next((lay for lay in layers_of(g.net) if lay.type != "Input"), None)
    weights = {t.name for t in g.model.graph.initializer}
    onnx_inputs = [v.name for v in g.model.graph.input if v.name not in weights]
    if first is None or len(onnx_inputs) < len(inputs):
        return []
    by_blob = dict(zip(inputs, onnx_inputs))
    wanted = [by_blob[b] for b in first.bottom if b in by_blob]
    node = next((n for n in g.model.graph.node if n.name in (first.name, first.name + "_output", first.name + "_Reshape")), None)
    if node is None or len(wanted) != len(first.bottom):
        return []
    data_inputs = [i for i in node.input if i in onnx_inputs]
    if data_inputs == wanted:
        return []
    params = [i for i in node.input if i not in onnx_inputs]
    del node.input[:]
    node.input.extend(wanted + params)
    return [f"layer '{first.name}' reads its bottoms {list(first.bottom)} (caffe2onnx gave it every network input)"]


# --- graph-wide -------------------------------------------------------------------------------------------


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


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def name_outputs(g: Graph, dynamic_batch: bool) -> list[str]:
    """Graph outputs named after Caffe's output blobs (caffe2onnx names an in-place layer's output after
    the layer) with Caffe's shapes; caffe2onnx's own intermediate shapes (``value_info``) are dropped: they
    come from its arithmetic, which is wrong wherever the repairs above changed a layer."""
    del g.model.graph.value_info[:]
    caffe_outputs = output_blobs(g.net)
    graph_outputs = list(g.model.graph.output)
    if len(graph_outputs) != len(caffe_outputs):
        raise UnsupportedModelError(
            f"caffe2onnx produced {len(graph_outputs)} outputs, the Caffe network has {len(caffe_outputs)} "
            f"({', '.join(caffe_outputs)})"
        )
    renamed, reshaped = [], []
    taken = {v.name for v in g.model.graph.input} | {o for n in g.model.graph.node for o in n.output}
    for value, blob in zip(graph_outputs, caffe_outputs):
        shape = list(g.shapes[blob])
        declared = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if declared != shape:
            reshaped.append(f"{blob} {shape} (caffe2onnx declared {declared})")
        if dynamic_batch:
            shape[0] = "batch"
        if value.name != blob and blob not in taken:  # in-place chains reuse the blob's name inside
            for node in g.model.graph.node:
                node.output[:] = [blob if o == value.name else o for o in node.output]
                node.input[:] = [blob if i == value.name else i for i in node.input]
            renamed.append(f"{value.name} -> {blob}")
            name = blob
        else:
            name = value.name
        value.CopyFrom(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    lines = [f"output shapes from Caffe's shape rules: {', '.join(reshaped)}"] if reshaped else []
    return lines + ([f"outputs named after Caffe's blobs: {', '.join(renamed)}"] if renamed else [])


def _crops_batch(g: Graph, layer) -> bool:
    data, size = g.shapes[(layer.name, layer.bottom[0])], g.shapes[(layer.name, layer.bottom[1])]
    return layer.crop_param.axis % len(data) == 0 and (crop_offsets(layer, data, size)[0] != 0 or data[0] != size[0])


def set_dynamic_batch(g: Graph) -> list[str]:
    """Dimension 0 of every graph input symbolic ('batch'); refused when a layer folds the batch into
    another dimension (its Reshape would need the batch as a number)."""

    for layer in layers_of(g.net):
        if layer.type in ("Reshape", "Flatten"):
            bottom = g.shapes[(layer.name, layer.bottom[0])]
            if reshape_dims(layer, bottom)[0] != 0:
                raise ConfigError(
                    f"convert.dynamic_batch: {layer.type} '{layer.name}' folds the batch dimension into another "
                    "one; convert with a fixed batch (dynamic_batch = false)"
                )
        if layer.type == "Crop" and _crops_batch(g, layer):
            raise ConfigError(
                f"convert.dynamic_batch: Crop '{layer.name}' cuts the batch dimension (axis 0) to a fixed size; "
                "convert with a fixed batch (dynamic_batch = false)"
            )
    for value in g.model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = "batch"
    return ["dynamic batch dimension 'batch' on inputs and outputs"]


def repair_model(model: onnx.ModelProto, net, params: dict[str, list[np.ndarray]], options) -> list[str]:
    """Every repair, in order; ``params``: the original caffemodel's blobs by layer name
    (``reference.weights_by_layer``)."""
    g = Graph(model=model, net=net, params=params, shapes=infer_shapes(net))
    repairs: list[str] = []
    repairs += repair_first_layer_inputs(g)
    for step in (repair_convolutions, repair_pooling, repair_batch_norm, repair_scale, repair_prelu,
                 repair_eltwise, repair_inner_product, repair_reshape_layers, repair_dropout, repair_crop):
        repairs += step(g)
    drop_unused_initializers(model)
    repairs += initializers_out_of_inputs(model)
    if options.dynamic_batch:
        repairs += set_dynamic_batch(g)
    repairs += name_outputs(g, options.dynamic_batch)
    return repairs
