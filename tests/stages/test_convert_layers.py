"""Layer by layer: every supported Caffe layer type and its parameter variants (``caffe_builder.LAYER_CASES``),
converted by ``convert_caffe`` and run in onnxruntime, against the independent numpy reference of Caffe.

Also the evidence for each caffe2onnx 2.0.1 defect qconsist repairs: the same model through caffe2onnx
alone (opset re-stamped, weights out of the inputs, nothing else) crashes, is invalid, or computes
something else than Caffe — recorded per case as ``Case.alone``.

Tolerance: |onnx - reference| <= 1e-5 * (1 + peak), peak = max |reference| (float64 reference, float32 ONNX).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from caffe_builder import LAYER_CASES, Case, NetBuilder, caffe2onnx_alone, run, session, tolerance, verdict_alone

from qconsist.stages.caffe import reference
from qconsist.stages.caffe.fidelity import seeded_inputs
from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt
from qconsist.stages.convert import ConvertOptions, convert_caffe


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each case's Caffe files, ONNX conversion (check on) and float64 reference outputs, once."""
    root = tmp_path_factory.mktemp("layers")
    out = {}
    for i, case in enumerate(LAYER_CASES):
        net = case.network(seed=i)
        prototxt, caffemodel = net.write(root, f"case{i}")
        result = convert_caffe(prototxt, caffemodel, root / f"case{i}.onnx")
        inputs = seeded_inputs(net.net, seed=100 + i)
        expected = list(reference.forward(read_prototxt(prototxt), read_caffemodel(caffemodel), inputs, dtype=np.float64).values())
        out[case.id] = (prototxt, caffemodel, result, inputs, expected)
    return out


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c.id for c in LAYER_CASES])
def test_layer_matches_caffe_reference(case: Case, built):
    _, _, result, inputs, expected = built[case.id]
    for optimize in (True, False):  # a fix must not depend on onnxruntime's graph optimiser
        actual = run(session(result.path, optimize), inputs)
        assert len(actual) == len(expected)
        for got, want in zip(actual, expected):
            assert got.shape == want.shape
            diff = float(np.abs(got.astype(np.float64) - want).max())
            assert diff <= tolerance(want), f"{case.id}: max abs diff {diff:.3g} > {tolerance(want):.3g}"
    assert result.check is not None and result.check.passed
    assert result.check.max_abs <= result.check.outputs[0].tolerance


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c.id for c in LAYER_CASES])
def test_repair_recorded(case: Case, built):
    repairs = built[case.id][2].repairs
    if case.repair is None:
        semantic = [r for r in repairs if not r.startswith(("removed", "outputs named"))]
        assert semantic == [], f"{case.id}: unexpected repairs {semantic}"
    else:
        assert any(case.repair in line for line in repairs), f"{case.id}: no repair mentioning {case.repair!r} in {repairs}"


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c.id for c in LAYER_CASES])
def test_caffe2onnx_alone(case: Case, built):
    """The finding behind each repair: what caffe2onnx 2.0.1 does with this layer without qconsist."""
    prototxt, caffemodel, _, inputs, expected = built[case.id]
    assert verdict_alone(case, prototxt, caffemodel, inputs, expected) == case.alone


def test_every_supported_layer_type_is_covered():
    from qconsist.stages.convert import SUPPORTED_LAYERS

    covered = {c.layer for c in LAYER_CASES} | {"Input"}
    assert SUPPORTED_LAYERS <= covered


def test_caffe2onnx_alone_divides_variance_by_factor_plus_1e5(tmp_path):
    """caffe2onnx writes var / (factor + 1e-5): with factor 1 the variance is 1e-5 (relative) off, below
    the layer tolerance but a systematic error; qconsist writes var / factor exactly."""
    net = NetBuilder(seed=6)
    x = net.input((1, 3, 4, 4))
    net.scale(net.batch_norm(x, factor=1.0))
    prototxt, caffemodel = net.write(tmp_path)
    stored = net.blobs["batchnorm1"][1]
    alone = caffe2onnx_alone(prototxt, caffemodel)
    var_alone = next(onnx.numpy_helper.to_array(t) for t in alone.graph.initializer if t.name == "batchnorm1_var")
    np.testing.assert_allclose(var_alone, stored / (1 + 1e-5), rtol=1e-7)
    assert np.abs(var_alone / stored - 1).max() > 9e-6
    result = convert_caffe(prototxt, caffemodel, tmp_path / "bn.onnx")
    model = onnx.load(result.path)
    var = next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "batchnorm1_var")
    np.testing.assert_array_equal(var, stored)


def test_batchnorm_factor_zero_gives_zero_statistics(tmp_path):
    """Caffe: a zero moving-average factor scales the statistics by 0 (mean 0, variance 0): y = x / sqrt(eps)."""
    net = NetBuilder(seed=5)
    x = net.input((1, 3, 4, 4))
    net.batch_norm(x, factor=0.0, eps=1e-2)
    prototxt, caffemodel = net.write(tmp_path)
    result = convert_caffe(prototxt, caffemodel, tmp_path / "bn.onnx")
    data = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    (got,) = run(session(result.path), {"data": data})
    np.testing.assert_allclose(got, data / np.sqrt(1e-2), rtol=1e-6)


def test_dynamic_batch_on_generated_model(tmp_path):
    case = next(c for c in LAYER_CASES if c.id == "resnet block")
    net = case.network(seed=3)
    prototxt, caffemodel = net.write(tmp_path)
    result = convert_caffe(prototxt, caffemodel, tmp_path / "dyn.onnx", ConvertOptions(dynamic_batch=True))
    sess = session(result.path)
    assert sess.get_inputs()[0].shape[0] == "batch"
    data = np.random.default_rng(1).standard_normal((5, *case.shape[1:])).astype(np.float32)
    (batched,) = run(sess, {"data": data})
    singles = np.concatenate([run(sess, {"data": data[i : i + 1]})[0] for i in range(5)])
    np.testing.assert_allclose(batched, singles, rtol=1e-5, atol=1e-5)
    expected = reference.forward(net.net, net.blobs, {"data": data}, dtype=np.float64)
    np.testing.assert_allclose(batched, list(expected.values())[0], atol=tolerance(list(expected.values())[0]))
