"""The numpy Caffe reference itself, checked without ONNX: hand-worked Caffe results and naive loops.

The layer tests compare ONNX with this reference, and the repairs share its geometry module, so a wrong
rule here could hide in both; these tests pin the rules to values worked out from Caffe's layer code.
"""

from __future__ import annotations

import numpy as np
import pytest
from caffe_builder import NetBuilder

from qconsist.errors import InputError
from qconsist.stages.caffe import geometry, reference


def forward(net: NetBuilder, data: np.ndarray) -> np.ndarray:
    (out,) = reference.forward(net.net, net.blobs, {"data": data}, dtype=np.float64).values()
    return out


@pytest.mark.parametrize(
    ("size", "kernel", "pad", "stride", "ceil", "expected"),
    [
        (112, 3, 0, 2, True, 56),  # open_nsfw pool1: ceil(109 / 2) + 1
        (112, 3, 0, 2, False, 55),
        (9, 2, 1, 2, True, 5),  # ceil(9 / 2) + 1 = 6, but window 5 would start at 10 - 1 = 9 >= 9 + 1 - 1: dropped
        (10, 3, 1, 2, True, 6),  # ceil(9 / 2) + 1 = 6, window 5 starts at 9 < 11: kept
        (7, 7, 0, 1, True, 1),  # open_nsfw's global-like AVE pool
        (6, 3, 1, 3, True, 3),  # ceil(5 / 3) + 1 = 3; window 2 starts at 6 - 1 = 5 < 7: kept
    ],
)
def test_pooled_size_follows_caffe(size, kernel, pad, stride, ceil, expected):
    assert geometry.pooled_size(size, kernel, pad, stride, ceil, padded=pad > 0) == expected


def test_ave_pool_divides_by_window_clipped_to_padded_image():
    """3x3 of ones, kernel 2, stride 2, pad 1 (Caffe: 2x2 out). Window (0, 0) covers rows/cols -1..0: one
    image pixel, pool size 2x2 = 4 -> 1/4. Window (0, 1) covers cols 1..2: two pixels, size 4 -> 2/4."""
    net = NetBuilder()
    net.pool(net.input((1, 1, 3, 3)), "AVE", kernel_size=2, stride=2, pad=1)
    np.testing.assert_allclose(forward(net, np.ones((1, 1, 3, 3)))[0, 0], [[0.25, 0.5], [0.5, 1.0]])


def test_ave_pool_partial_window_past_the_padding():
    """10 wide, kernel 3, stride 2, pad 1: the last window starts at 9, ends at 12, clipped to 11 (image +
    pad): pool size 2 along that axis, one image pixel -> 1/2; first window -1..1 holds 2 of 3 -> 2/3."""
    net = NetBuilder()
    net.pool(net.input((1, 1, 1, 10)), "AVE", kernel_h=1, kernel_w=3, stride_h=1, stride_w=2, pad_h=0, pad_w=1)
    np.testing.assert_allclose(forward(net, np.ones((1, 1, 1, 10)))[0, 0, 0], [2 / 3, 1, 1, 1, 1, 1 / 2])


def test_max_pool_ignores_padding():
    net = NetBuilder()
    net.pool(net.input((1, 1, 3, 3)), "MAX", kernel_size=2, stride=2, pad=1)
    data = -np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    np.testing.assert_allclose(forward(net, data)[0, 0], [[-1, -2], [-4, -5]])


def _naive_conv(x, w, b, stride, pad, dilation, group):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    y = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // (o // group)
        for i in range(oh):
            for j in range(ow):
                for ci in range(cg):
                    for a in range(kh):
                        for bb in range(kw):
                            y[:, oc, i, j] += w[oc, ci, a, bb] * xp[:, g * cg + ci, i * stride[0] + a * dilation[0], j * stride[1] + bb * dilation[1]]
        y[:, oc] += b[oc]
    return y


def test_convolution_matches_naive_loops():
    net = NetBuilder(seed=9)
    net.conv(net.input((2, 4, 7, 6)), 6, kernel_h=3, kernel_w=2, pad_h=1, pad_w=2, stride_h=2, stride_w=1, dilation=[1, 2], group=2)
    data = np.random.default_rng(1).standard_normal((2, 4, 7, 6))
    weight, bias = net.blobs["convolution1"]
    expected = _naive_conv(data, weight.astype(np.float64), bias, (2, 1), (1, 2), (1, 2), 2)
    np.testing.assert_allclose(forward(net, data), expected, rtol=1e-10, atol=1e-10)


def test_deconvolution_matches_naive_scatter():
    """Caffe's Deconvolution: every input pixel scatters weight[c_in, c_out] into the output at
    (i * stride + a * dilation - pad); weights are (C_in, C_out / group, kh, kw)."""
    net = NetBuilder(seed=4)
    net.conv(net.input((1, 4, 3, 4)), 6, kernel_size=3, stride=2, pad=1, dilation=2, group=2, deconv=True)
    data = np.random.default_rng(2).standard_normal((1, 4, 3, 4))
    weight, bias = (b.astype(np.float64) for b in net.blobs["deconvolution1"])
    oh, ow = 2 * (3 - 1) + 2 * 2 + 1 - 2, 2 * (4 - 1) + 2 * 2 + 1 - 2
    full = np.zeros((1, 6, oh + 2, ow + 2))
    for c in range(4):
        g = c // 2
        for i in range(3):
            for j in range(4):
                for a in range(3):
                    for bb in range(3):
                        full[0, g * 3 : g * 3 + 3, i * 2 + a * 2, j * 2 + bb * 2] += data[0, c, i, j] * weight[c, :, a, bb]
    expected = full[:, :, 1:-1, 1:-1] + bias.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(forward(net, data), expected, rtol=1e-10, atol=1e-10)


def test_batchnorm_divides_statistics_by_the_factor():
    net = NetBuilder(seed=3)
    net.batch_norm(net.input((1, 2, 1, 1)), factor=4.0, eps=0.0)
    mean, var, _ = (b.astype(np.float64) for b in net.blobs["batchnorm1"])
    data = np.array([5.0, -3.0]).reshape(1, 2, 1, 1)
    expected = (data.reshape(-1) - mean / 4.0) / np.sqrt(var / 4.0)
    np.testing.assert_allclose(forward(net, data).reshape(-1), expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("dims", "axis", "num_axes", "expected"),
    [
        ([0, -1], 0, -1, (2, 60)),
        ([0, 0, -1], 0, -1, (2, 3, 20)),
        ([-1], 1, -1, (2, 60)),  # flatten from axis 1
        ([2, 2], 2, 1, (2, 3, 2, 2, 5)),  # split dim 2 (4) into 2 x 2
        ([1], 1, 0, (2, 1, 3, 4, 5)),  # insert a dim of 1 at axis 1
        ([1], -1, 0, (2, 3, 4, 5, 1)),  # axis -1: append
        ([-1, 10], 2, 2, (2, 3, 2, 10)),
    ],
)
def test_reshape_target_follows_caffe(dims, axis, num_axes, expected):
    bottom = (2, 3, 4, 5)
    net = NetBuilder()
    net.reshape(net.input(bottom), dims, axis=axis, num_axes=num_axes)
    assert geometry.reshape_target(net.net.layer[-1], bottom) == expected


def test_reshape_that_does_not_fit_is_an_input_error():
    net = NetBuilder()
    net.reshape(net.input((2, 3, 4, 5)), [2, 2], axis=3, num_axes=1)  # 5 cannot become 2 x 2
    with pytest.raises(InputError, match=r"^Reshape 'reshape1' cannot turn \[2, 3, 4, 5\] into \[2, 3, 4, 2, 2\]$"):
        geometry.reshape_target(net.net.layer[-1], (2, 3, 4, 5))


def test_flatten_end_axis():
    net = NetBuilder()
    net.flatten(net.input((2, 3, 4, 5)), axis=1, end_axis=2)
    assert geometry.flatten_target(net.net.layer[-1], (2, 3, 4, 5)) == (2, 12, 5)


def test_outputs_are_unconsumed_blobs_in_place_included():
    net = NetBuilder()
    x = net.input((1, 2, 3, 3))
    a = net.conv(x, 2, kernel_size=1)
    net.relu(a)  # in place: the output blob keeps the name of the convolution's top
    net.softmax(x)
    assert geometry.output_blobs(net.net) == [a, "softmax3"]
