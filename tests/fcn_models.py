"""FCN-style Caffe models written in code (seeded weights): the 2x upsampling by a Deconvolution with
overlapping windows whose cuDNN kernels give a different output on every run on ONNX Runtime's CUDA EP.

* ``fcn_head``: Convolution 3→64 → ReLU → Deconvolution 64→32 kernel 4 stride 2 pad 1 (56 → 112) →
  Convolution 32→21 (1x1): a segmentation head as the ``Deconvolution`` of Caffe writes it with pad.
* ``fcn_skip``: an FCN-8s-like network with one skip connection, in Caffe's own FCN style: score layers at
  1/8 and 1/4 of the image, Deconvolutions *without* pad (kernel 4 stride 2: 7 → 16; kernel 8 stride 4:
  14 → 60), ``Crop`` layers to align them (offset 1 onto the 1/4 scores, offset 2 onto the image, 21
  class channels kept), ``Eltwise SUM`` to fuse.

Both take a 1×3×56×56 image; ``batch`` changes the first dimension.
"""

from __future__ import annotations

from caffe_builder import NetBuilder

CLASSES = 21
IMAGE = (3, 56, 56)


def fcn_head(seed: int = 0, batch: int = 1) -> NetBuilder:
    net = NetBuilder(name="fcn_head", seed=seed)
    x = net.input((batch, *IMAGE))
    x = net.relu(net.conv(x, 64, kernel_size=3, pad=1, top="conv1"))
    x = net.conv(x, 32, kernel_size=4, stride=2, pad=1, deconv=True, top="upscore")
    net.conv(x, CLASSES, kernel_size=1, top="score")
    return net


def fcn_skip(seed: int = 0, batch: int = 1) -> NetBuilder:
    net = NetBuilder(name="fcn_skip", seed=seed)
    data = net.input((batch, *IMAGE))
    x = net.pool(net.relu(net.conv(data, 16, kernel_size=3, pad=1, top="conv1")), kernel_size=2, stride=2, top="pool1")  # 28
    pool2 = net.pool(net.relu(net.conv(x, 32, kernel_size=3, pad=1, top="conv2")), kernel_size=2, stride=2, top="pool2")  # 14
    x = net.pool(net.relu(net.conv(pool2, 64, kernel_size=3, pad=1, top="conv3")), kernel_size=2, stride=2, top="pool3")  # 7
    score_fr = net.conv(x, CLASSES, kernel_size=1, top="score_fr")
    upscore2 = net.conv(score_fr, CLASSES, kernel_size=4, stride=2, bias=False, deconv=True, top="upscore2")  # 16
    score_pool2 = net.conv(pool2, CLASSES, kernel_size=1, top="score_pool2")  # 14
    fuse = net.eltwise([net.crop(upscore2, score_pool2, offset=1, top="upscore2c"), score_pool2])
    upscore4 = net.conv(fuse, CLASSES, kernel_size=8, stride=4, bias=False, deconv=True, top="upscore4")  # 60
    net.crop(upscore4, data, offset=2, top="score")  # 56, 21 channels
    return net


FCN_MODELS = {"fcn_head": fcn_head, "fcn_skip": fcn_skip}
