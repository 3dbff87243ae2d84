"""Caffe's Crop through the convert stage: what Caffe refuses is refused with the layer's name, a dynamic
batch is refused where the crop cuts the batch, and the numpy reference crops like Caffe's ``crop_copy``.

The layer variants themselves (against the numpy reference, and what caffe2onnx alone does) are in
``caffe_builder.LAYER_CASES`` / ``test_convert_layers.py``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from caffe_builder import NetBuilder, run, session

from qconsist.errors import ConfigError, InputError
from qconsist.stages.caffe import reference
from qconsist.stages.convert import ConvertOptions, convert_caffe


def _cropped(tmp_path, shape=(1, 3, 9, 9), **crop):
    net = NetBuilder(seed=4)
    x = net.input(shape)
    like = net.conv(x, 2, kernel_size=3)  # (N, 2, 7, 7)
    net.crop(x, like, **crop)
    return net, *net.write(tmp_path)


def test_reference_takes_the_window_at_the_offsets():
    net = NetBuilder(seed=1)
    x = net.input((2, 5, 8, 9))
    like = net.conv(x, 3, kernel_size=3)  # (2, 3, 6, 7)
    net.crop(x, like, axis=1, offset=[2, 1, 0])
    data = np.arange(2 * 5 * 8 * 9, dtype=np.float32).reshape(2, 5, 8, 9)
    (got,) = reference.forward(net.net, net.blobs, {"data": data}).values()
    np.testing.assert_array_equal(got, data[:, 2:5, 1:7, 0:7])


def test_crop_of_a_deconvolution_keeps_its_channels(tmp_path):
    """FCN's last layer: 21-class scores upsampled, then cropped to the 3-channel image; 21 channels stay."""
    net = NetBuilder(seed=2)
    x = net.input((1, 3, 8, 8))
    scores = net.conv(x, 21, kernel_size=1)
    up = net.conv(scores, 21, kernel_size=4, stride=2, bias=False, deconv=True)  # 8 -> 18
    net.crop(up, x, offset=5)  # 18 -> 8 at offset 5, like FCN's offset 19 / 31 on real images
    prototxt, caffemodel = net.write(tmp_path)
    result = convert_caffe(prototxt, caffemodel, tmp_path / "fcn_end.onnx")
    model = onnx.load(result.path)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 21, 8, 8]
    assert [n.op_type for n in model.graph.node] == ["Conv", "ConvTranspose", "Slice"]
    assert result.check.max_abs <= result.check.tolerance
    data = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (got,) = run(session(result.path), {"data": data})
    (want,) = reference.forward(net.net, net.blobs, {"data": data}, dtype=np.float64).values()
    assert np.abs(got - want).max() < 1e-5 * (1 + np.abs(want).max())
    assert any("axes before it kept" in line for line in result.repairs)


@pytest.mark.parametrize(
    "crop, message",
    [
        ({"offset": 3}, r"^Crop 'crop2': axis 2 of size 9 cannot give 7 from offset 3$"),
        ({"offset": [1, 1, 1]}, r"^Crop 'crop2' gives 3 offsets for the 2 axes it crops \(from axis 2\); give one, or one per cropped axis$"),
        ({"axis": 4}, r"^Crop 'crop2': axis 4 does not fit a 4-D bottom$"),
    ],
)
def test_what_caffe_refuses_is_refused(tmp_path, crop, message):
    _, prototxt, caffemodel = _cropped(tmp_path, **crop)
    with pytest.raises(InputError, match=message):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_crop_needs_two_bottoms(tmp_path):
    net = NetBuilder(seed=4)
    x = net.input((1, 3, 9, 9))
    net.add("Crop", [x], None, crop_param={"axis": 2})
    prototxt, caffemodel = net.write(tmp_path)
    with pytest.raises(InputError, match=r"^layer 'crop1' \(Crop\) has 1 bottom\(s\); Caffe's Crop takes two: the blob to crop "
                                         r"and the blob whose shape it takes$"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")


def test_crop_of_different_ranks_is_refused(tmp_path):
    net = NetBuilder(seed=4)
    x = net.input((1, 3, 9, 9))
    net.crop(x, net.inner_product(x, 4), axis=1)
    prototxt, caffemodel = net.write(tmp_path)
    with pytest.raises(InputError, match=r"Crop 'crop2' crops a 4-D blob to the shape of a 2-D one; both need the same rank$"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")


def test_dynamic_batch_with_a_spatial_crop(tmp_path):
    _, prototxt, caffemodel = _cropped(tmp_path, offset=1)
    result = convert_caffe(prototxt, caffemodel, tmp_path / "dyn.onnx", ConvertOptions(dynamic_batch=True))
    data = np.random.default_rng(5).standard_normal((3, 3, 9, 9)).astype(np.float32)
    (got,) = run(session(result.path), {"data": data})
    np.testing.assert_array_equal(got, data[:, :, 1:8, 1:8])


def test_dynamic_batch_refused_when_the_crop_cuts_the_batch(tmp_path):
    net = NetBuilder(seed=4)
    x = net.input((2, 3, 9, 9))
    net.crop(x, net.input((1, 3, 9, 9), name="like"), axis=0, offset=[1, 0, 0, 0])
    prototxt, caffemodel = net.write(tmp_path)
    with pytest.raises(ConfigError, match=r"^convert.dynamic_batch: Crop 'crop1' cuts the batch dimension \(axis 0\) to a fixed "
                                          r"size; convert with a fixed batch \(dynamic_batch = false\)$"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx", ConvertOptions(dynamic_batch=True))
