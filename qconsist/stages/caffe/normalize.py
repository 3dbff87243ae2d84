"""Rewrite copies of the Caffe network and weights into a form caffe2onnx 2.0.1 maps without crashing.

Some layers make caffe2onnx crash (``np.float`` under numpy 2, a division by a zero BatchNorm factor, a
mis-shaped Scale blob, an assertion on Flatten's axis, a typo in its Eltwise PROD / MAX shape code, a
negative Crop axis); others it maps to the wrong ONNX. This pass never changes what the network computes:
it only moves each such layer onto a caffe2onnx code path that works, and ``repair.py`` then gives the
resulting ONNX nodes their exact Caffe semantics from the *original* network. The original messages are never modified.
"""

from __future__ import annotations

import numpy as np

from qconsist.stages.caffe.geometry import Shape, blob_array, infer_shapes, layers_of, reshape_target

IDENTITY_SCALE_SUFFIX = "__qconsist_scale"
ELTWISE_SUM = 1


def _set_blob(blob, array: np.ndarray) -> None:
    blob.Clear()
    blob.shape.dim.extend(array.shape)
    blob.data.extend(np.asarray(array, dtype=np.float32).reshape(-1).tolist())


def reshape_dims(layer, bottom: Shape) -> list[int]:
    """A Caffe Reshape / Flatten as full ONNX Reshape dims, Caffe's ``axis``, ``num_axes`` and ``end_axis``
    resolved. Dims a layer copies keep ONNX's ``0`` (so a dynamic batch stays dynamic); caffe2onnx itself
    ignores ``axis`` / ``num_axes`` / ``end_axis`` and writes a fixed batch."""
    rank = len(bottom)
    if layer.type == "Flatten":
        start, end = layer.flatten_param.axis % rank, layer.flatten_param.end_axis % rank
        return [0] * start + [-1] + list(bottom[end + 1 :])
    param = layer.reshape_param
    reshape_target(layer, bottom)  # validates
    start = param.axis if param.axis >= 0 else param.axis + rank + 1
    end = rank if param.num_axes == -1 else start + int(param.num_axes)
    middle = [int(d) for d in param.shape.dim]  # Caffe's 0 copies the bottom dim of the same index, as ONNX's
    aligned = len(middle) == end - start
    suffix = [0 if aligned else d for d in bottom[end:]]
    return [0] * start + middle + suffix


def _fusable_scale(net_layers: list, index: int, consumers: dict[str, int]):
    """The Scale layer caffe2onnx will fuse into BatchNorm ``index`` (it fuses whatever comes next), when
    the fusion is exact: it reads the BatchNorm's output, has one bottom, scales channels (axis 1)."""
    bn = net_layers[index]
    if index + 1 >= len(net_layers):
        return None
    nxt = net_layers[index + 1]
    if nxt.type != "Scale" or list(nxt.bottom) != [bn.top[0]] or len(nxt.bottom) != 1:
        return None
    if nxt.scale_param.axis not in (1, -3) or nxt.scale_param.num_axes != 1:
        return None
    if nxt.top[0] != bn.top[0] and consumers.get(bn.top[0], 0) > 1:
        return None
    return nxt


def prepare(net, weights) -> tuple[object, object, list[str]]:
    """Copies of ``net`` and ``weights`` for caffe2onnx (see the module docstring), and a line for each
    rewrite that works around a caffe2onnx crash or mis-fusion."""
    net_copy = type(net)()
    net_copy.CopyFrom(net)
    weights_copy = type(weights)()
    weights_copy.CopyFrom(weights)
    shapes = infer_shapes(net)
    blobs = {layer.name: layer for layer in layers_of(weights_copy)}
    layers = list(net_copy.layer)
    consumers: dict[str, int] = {}
    for layer in layers:
        for bottom in layer.bottom:
            consumers[bottom] = consumers.get(bottom, 0) + 1
    rebuilt, notes = [], []
    for index, layer in enumerate(layers):
        rebuilt.append(layer)
        saved = blobs.get(layer.name)
        if layer.type == "BatchNorm":
            notes += _prepare_batch_norm(layer, saved)
            scale = _fusable_scale(layers, index, consumers)
            if scale is None:
                rebuilt.append(_identity_scale(net_copy, weights_copy, layer, shapes[(layer.name, layer.bottom[0])]))
                notes.append(f"BatchNorm '{layer.name}' without a following channel Scale: converted with scale 1, "
                             "bias 0 (caffe2onnx's own path crashes and adds 0.001)")
            else:
                notes += _prepare_fused_scale(layer, scale, blobs.get(scale.name))
        elif layer.type == "Scale" and saved is not None:
            for blob in saved.blobs:  # 1-D, so caffe2onnx's [1, C, 1, 1] never mis-shapes it; repair reshapes
                _set_blob(blob, blob_array(blob).reshape(-1))
        elif layer.type == "Eltwise":
            layer.eltwise_param.operation = ELTWISE_SUM
            del layer.eltwise_param.coeff[:]
        elif layer.type == "Crop" and layer.crop_param.axis < 0:
            given = layer.crop_param.axis
            layer.crop_param.axis %= len(shapes[(layer.name, layer.bottom[0])])
            notes.append(f"Crop '{layer.name}': axis {given} handed to caffe2onnx as {layer.crop_param.axis} "
                         "(it indexes the offsets with the axis as given and crashes on a negative one)")
        elif layer.type in ("Flatten", "Reshape"):
            dims = reshape_dims(layer, shapes[(layer.name, layer.bottom[0])])
            layer.type = "Reshape"
            layer.ClearField("flatten_param")
            layer.reshape_param.Clear()
            layer.reshape_param.shape.dim.extend(dims)
    del net_copy.layer[:]
    net_copy.layer.extend(rebuilt)
    return net_copy, weights_copy, notes


def _prepare_batch_norm(layer, saved) -> list[str]:
    """Statistics divided by the factor here (0 when the factor is 0, as Caffe does), factor set to 1."""
    if saved is None or len(saved.blobs) < 3:
        return []
    factor = float(blob_array(saved.blobs[2]).reshape(-1)[0])
    inverse = 0.0 if factor == 0 else 1.0 / factor
    for blob in saved.blobs[:2]:
        _set_blob(blob, blob_array(blob).reshape(-1) * inverse)
    _set_blob(saved.blobs[2], np.ones(1))
    if factor == 0:
        return [f"BatchNorm '{layer.name}': moving-average factor 0 means zero statistics, as in Caffe (caffe2onnx divides by it)"]
    return []


def _prepare_fused_scale(bn, scale, saved) -> list[str]:
    notes = []
    if scale.top[0] != bn.top[0]:
        notes.append(f"BatchNorm '{bn.name}' + Scale '{scale.name}' fused under the Scale's top '{scale.top[0]}' "
                     "(caffe2onnx loses it and cannot find it later)")
        # caffe2onnx names the fused node's output after the BatchNorm: let it carry the Scale's top.
        del bn.top[:]
        bn.top.append(scale.top[0])
        del scale.bottom[:]
        scale.bottom.append(scale.top[0])
    if not scale.scale_param.bias_term and saved is not None:
        channels = blob_array(saved.blobs[0]).size
        scale.scale_param.bias_term = True
        _set_blob(saved.blobs.add(), np.zeros(channels))
        notes.append(f"Scale '{scale.name}' after BatchNorm '{bn.name}' has no bias: fused with bias 0 (caffe2onnx asserts)")
    if saved is not None:
        for blob in saved.blobs:
            _set_blob(blob, blob_array(blob).reshape(-1))
    return notes


def _identity_scale(net_copy, weights_copy, bn, bottom_shape: Shape):
    """A Scale (1, 0) after a BatchNorm that has none, so caffe2onnx takes its fused path (its own
    stand-alone BatchNorm path crashes and would add 0.001 to every output)."""
    layer = type(bn)()
    layer.name = bn.name + IDENTITY_SCALE_SUFFIX
    layer.type = "Scale"
    layer.bottom.append(bn.top[0])
    layer.top.append(bn.top[0])
    layer.scale_param.bias_term = True
    saved = weights_copy.layer.add()
    saved.name = layer.name
    saved.type = "Scale"
    channels = bottom_shape[1]
    _set_blob(saved.blobs.add(), np.ones(channels))
    _set_blob(saved.blobs.add(), np.zeros(channels))
    return layer
