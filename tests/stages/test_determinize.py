"""Stage determinize: every ConvTranspose geometry rewritten into the sub-pixel form and compared, on
another seeded input than the stage's own check, with onnxruntime's CPU ConvTranspose.

Tolerance of the comparison: |rewritten - original| <= 1e-6 + 1e-5 * peak, peak = max |original|
(float32 on both sides; only the order of the additions differs).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import CONV_TRANSPOSE_GEOMETRIES, conv_transpose_model

from qconsist.errors import ConfigError, FidelityError, InputError, UnsupportedModelError
from qconsist.stages.determinize import DeterminizeOptions, DeterminizeResult, determinize, determinize_model

RTOL, ATOL = 1e-5, 1e-6


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


# geometry id, the replacement's op types, the sub-pixel Conv's kernel
EXPECTED = {
    "k4s2p1": (["Conv", "DepthToSpace"], [3, 3]),
    "k8s4p2": (["Conv", "DepthToSpace"], [3, 3]),
    "k16s8p4": (["Conv", "DepthToSpace"], [3, 3]),
    "k3s2p1 output_padding 1": (["Conv", "DepthToSpace"], [3, 3]),
    "k4s2p0 + crop 1 (folded)": (["Conv", "DepthToSpace"], [3, 3]),
    "k8s4p0 + crop 2 (folded)": (["Conv", "DepthToSpace"], [3, 3]),
    "k4s2p0 uncropped": (["Conv", "DepthToSpace"], [2, 2]),
    "no bias": (["Conv", "DepthToSpace"], [3, 3]),
    "batch 3": (["Conv", "DepthToSpace"], [3, 3]),
    "non-square input": (["Conv", "DepthToSpace"], [3, 3]),
    "non-square kernel and stride": (["Conv", "Reshape", "Transpose", "Reshape"], [3, 1]),
    "kernel 5 stride 2 (not a multiple)": (["Conv", "DepthToSpace"], [3, 3]),
    "asymmetric pads": (["Conv", "DepthToSpace", "Slice"], [3, 4]),
    "pads beyond the kernel": (["Slice", "Conv", "DepthToSpace", "Slice"], [3, 2]),
    "dilation 2": (["Conv", "DepthToSpace", "Slice"], [3, 3]),
    "group 2": (["Conv", "DepthToSpace"], [3, 3]),
    "depthwise": (["Conv", "DepthToSpace"], [3, 3]),
    "stride 1": (["Conv"], [3, 3]),
}
GEOMETRIES = [(case_id, CONV_TRANSPOSE_GEOMETRIES[case_id], *EXPECTED[case_id]) for case_id in CONV_TRANSPOSE_GEOMETRIES]


def test_every_shared_geometry_has_its_expectation():
    assert set(EXPECTED) == set(CONV_TRANSPOSE_GEOMETRIES)


@pytest.mark.parametrize("case_id, kwargs, ops, window", GEOMETRIES, ids=[g[0] for g in GEOMETRIES])
def test_geometry_matches_onnxruntime_conv_transpose(case_id, kwargs, ops, window):
    model = conv_transpose_model(**kwargs)
    rewritten, result = determinize_model(model)
    assert [n.op_type for n in rewritten.graph.node] == ops
    onnx.checker.check_model(rewritten, full_check=True)
    (rewrite,) = result.rewritten
    assert rewrite.name == "up" and rewrite.form == "sub-pixel Conv + DepthToSpace (CRD)"
    assert rewrite.details["conv_kernel"] == window
    assert rewrite.folded == (["crop"] if "crop" in kwargs else [])
    assert rewrite.attributes["kernel_shape"] == list(kwargs.get("kernel", (4, 4)))
    assert [op for _, op in rewrite.new_nodes] == ops
    assert result.passed and rewrite.check.passed and rewrite.check.max_abs <= rewrite.check.tolerance
    assert rewrite.check.tolerance == pytest.approx(ATOL + RTOL * rewrite.check.peak)
    # independently of the stage's own check: another input, both models as they are, optimizations on
    shape = [kwargs.get("batch", 1), kwargs.get("cin", 16), *kwargs.get("size", (14, 14))]
    x = np.random.default_rng(99).standard_normal(shape).astype(np.float32)
    want, got = run(model, x), run(rewritten, x)
    assert got.shape == want.shape
    diff = float(np.abs(got.astype(np.float64) - want).max())
    assert diff <= ATOL + RTOL * float(np.abs(want).max()), f"{case_id}: {diff:.3g}"


def test_random_geometries():
    """80 seeded geometries: kernel 1-8, stride 1-4, dilation 1-2, pads 0-4, output_padding < stride, group 1/2/4,
    with and without bias, batch 2; each rewritten one agrees with onnxruntime's ConvTranspose."""
    checked = 0
    for seed in range(80):
        rng = np.random.default_rng(seed)
        kernel, strides, dilations = (tuple(int(v) for v in rng.integers(low, high, 2)) for low, high in ((1, 9), (1, 5), (1, 3)))
        output_padding = tuple(int(rng.integers(0, s)) for s in strides)
        pads, size = tuple(int(v) for v in rng.integers(0, 5, 4)), tuple(int(v) for v in rng.integers(2, 9, 2))
        extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
        if min(s * (n - 1) + op + e - pads[a] - pads[a + 2]
               for a, (s, n, op, e) in enumerate(zip(strides, size, output_padding, extent))) < 1:
            continue
        model = conv_transpose_model(cin=8, cout=8, size=size, kernel=kernel, strides=strides, pads=pads, batch=2,
                                     output_padding=output_padding, dilations=dilations, group=int(rng.choice([1, 2, 4])),
                                     bias=bool(seed % 2), seed=seed)
        rewritten, result = determinize_model(model, DeterminizeOptions(check=False))
        if not result.rewritten:
            assert result.left_alone[0].reason.startswith("windows do not overlap")
            continue
        x = rng.standard_normal((2, 8, *size)).astype(np.float32)
        want, got = run(model, x), run(rewritten, x)
        assert got.shape == want.shape, seed
        assert np.abs(got - want).max() <= ATOL + RTOL * np.abs(want).max(), seed
        checked += 1
    assert checked >= 60


def test_the_figures_of_the_fcn_upsampling():
    """The 2x upsampling of an FCN head (64 -> 32 channels, 56x56): 128 output channels of a 3x3 Conv."""
    model = conv_transpose_model(cin=64, cout=32, size=(56, 56), seed=3)
    rewritten, result = determinize_model(model)
    conv = rewritten.graph.node[0]
    weights = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    assert weights[conv.input[1]].shape == (128, 64, 3, 3) and weights[conv.input[2]].shape == (128,)
    # 4 of the 9 taps of each phase are real, the others zeros: 64*32*16 weights out of 128*64*9
    assert np.count_nonzero(weights[conv.input[1]]) == 64 * 32 * 16
    assert helper.get_attribute_value(rewritten.graph.node[1].attribute[0]) in (2, b"CRD")
    assert result.rewritten[0].check.max_abs < 5e-6 and result.outputs[0].max_abs < 5e-6
    assert result.seconds < 1.0


def test_dynamic_batch_is_checked_at_the_given_batch_and_runs_at_any():
    model = conv_transpose_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    rewritten, result = determinize_model(model, DeterminizeOptions(batch=2))
    assert result.input_shapes == {"x": [2, 16, 14, 14]}
    x = np.random.default_rng(5).standard_normal((5, 16, 14, 14)).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x), run(model, x), rtol=0, atol=ATOL + RTOL * 10)


def test_weights_and_crop_from_constant_nodes():
    """As exporters write them: the weight and the Slice's bounds as Constant nodes, which go with the nodes they fed."""
    model = conv_transpose_model(pads=(0, 0, 0, 0), crop=([1, 1], [29, 29]))
    constants = []
    for tensor in list(model.graph.initializer):
        constants.append(helper.make_node("Constant", [], [tensor.name], name=f"const_{tensor.name}", value=tensor))
        model.graph.initializer.remove(tensor)
    model.graph.node.insert(0, constants[0])
    for node in constants[1:]:
        model.graph.node.insert(0, node)
    rewritten, result = determinize_model(model)
    assert [n.op_type for n in rewritten.graph.node] == ["Conv", "DepthToSpace"]
    assert result.rewritten[0].folded == ["crop"] and result.passed
    x = np.random.default_rng(4).standard_normal((1, 16, 14, 14)).astype(np.float32)
    assert np.abs(run(rewritten, x) - run(model, x)).max() <= ATOL + RTOL * np.abs(run(model, x)).max()


def test_non_overlapping_conv_transpose_is_left_alone():
    model = conv_transpose_model(kernel=(2, 2), pads=(0, 0, 0, 0))
    rewritten, result = determinize_model(model)
    assert rewritten.SerializeToString() == model.SerializeToString()
    assert result.rewritten == [] and result.outputs == [] and result.passed
    (note,) = result.left_alone
    assert (note.name, note.op_type) == ("up", "ConvTranspose")
    assert note.reason.startswith("windows do not overlap")


def test_dilated_kernel_whose_taps_never_meet_is_left_alone():
    """Kernel 2, dilation 3, stride 2: taps 0 and 3 land on even and odd outputs, never on the same one."""
    _, result = determinize_model(conv_transpose_model(kernel=(2, 2), dilations=(3, 3), pads=(0, 0, 0, 0)))
    assert [n.name for n in result.left_alone] == ["up"] and result.rewritten == []


def test_result_json_round_trip(tmp_path):
    source = tmp_path / "up.onnx"
    onnx.save(conv_transpose_model(pads=(0, 0, 0, 0), crop=([1, 1], [29, 29])), source)
    result = determinize(source, tmp_path / "det.onnx")
    data = json.loads(json.dumps(result.to_json()))
    assert data["schema"] == "qconsist.determinize/1" and data["passed"] is True
    assert data["rewritten"][0]["details"]["folded_crop"] == {"begin": [1, 1], "end": [1, 1]}
    again = DeterminizeResult.from_json(data)
    assert again.to_json() == result.to_json()
    assert again.rewritten[0].check == result.rewritten[0].check
    assert onnx.load(str(tmp_path / "det.onnx")).graph.output[0].name == "y"


def test_failed_check_raises_and_writes_nothing(tmp_path, monkeypatch):
    from qconsist.stages.rewrites import subpixel

    original = subpixel.subpixel_weights
    monkeypatch.setattr(subpixel, "subpixel_weights", lambda *a: (original(*a)[0] * 1.01, original(*a)[1]))
    source = tmp_path / "up.onnx"
    onnx.save(conv_transpose_model(), source)
    with pytest.raises(FidelityError, match=r"^determinized up differs from the original: output 'y': greatest absolute "
                                            r"difference 0\.0\d+ at \[.*\] \(relative to the output's peak .*\); tolerance \d\.\d+e-05$"):
        determinize(source, tmp_path / "det.onnx")
    assert not (tmp_path / "det.onnx").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"attributes": {"auto_pad": "SAME_UPPER"}, "pads": None}, r"auto_pad SAME_UPPER: write the pads explicitly"),
        ({"attributes": {"output_shape": [28, 28]}}, r"output_shape is set: write pads and output_padding instead"),
        ({"opset": 12}, r"^determinize needs opset 13 or newer; the model has opset 12$"),
    ],
)
def test_refusals(kwargs, message):
    model = conv_transpose_model(**kwargs)
    with pytest.raises(UnsupportedModelError, match=message):
        determinize_model(model)


def test_weight_computed_at_run_time_is_refused_in_one_line():
    model = conv_transpose_model()
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [16, 8, 4, 4]))
    model.graph.initializer.remove(model.graph.initializer[0])
    with pytest.raises(UnsupportedModelError, match=r"^node 'up' \(ConvTranspose\) cannot be made deterministic: its weight "
                                                    r"'W' is computed at run time, not an initializer$"):
        determinize_model(model)


def test_three_d_conv_transpose_is_refused():
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 2, 4, 4, 4)).astype(np.float32), "W")
    node = helper.make_node("ConvTranspose", ["x", "W"], ["y"], name="up3d", strides=[2, 2, 2], pads=[1] * 6)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 5)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UnsupportedModelError, match=r"^node 'up3d' \(ConvTranspose\) cannot be made deterministic: 3-D "
                                                    r"ConvTranspose: only 2-D \(a 4-D input\) is rewritten$"):
        determinize_model(model)
    _, result = determinize_model(model, DeterminizeOptions(skip_unsupported=True))
    assert [(n.name, n.reason) for n in result.refused] == [("up3d", "3-D ConvTranspose: only 2-D (a 4-D input) is rewritten")]


def test_non_square_strides_need_the_spatial_size():
    model = conv_transpose_model(kernel=(4, 3), strides=(2, 3), pads=(1, 0, 1, 0))
    for axis, name in ((2, "H"), (3, "W")):
        model.graph.input[0].type.tensor_type.shape.dim[axis].dim_param = name
    with pytest.raises(UnsupportedModelError, match=r"strides \[2, 3\] differ per axis and the input's spatial size is not known"):
        determinize_model(model)


def test_the_check_needs_values_for_dynamic_spatial_dimensions():
    model = conv_transpose_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    with pytest.raises(ConfigError, match=r"^input 'x' has a dynamic dimension 2 \(H\); give the check's inputs$"):
        determinize_model(model)
    x = np.random.default_rng(1).standard_normal((1, 16, 10, 14)).astype(np.float32)
    _, result = determinize_model(model, inputs={"x": x})
    assert result.passed and result.input_shapes == {"x": [1, 16, 10, 14]}
    with pytest.raises(ConfigError, match=r"^check inputs \['z'\] are no inputs of the model$"):
        determinize_model(model, inputs={"x": x, "z": x})


def test_conv_transpose_rewriting_can_be_turned_off():
    rewritten, result = determinize_model(conv_transpose_model(), DeterminizeOptions(conv_transpose=False))
    assert [n.op_type for n in rewritten.graph.node] == ["ConvTranspose"]
    assert [(n.name, n.reason) for n in result.left_alone] == [("up", "conv_transpose rewriting is off")]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"check": "yes"}, r"^determinize.check must be true or false, got 'yes'$"),
        ({"batch": 0}, r"^determinize.batch must be a whole number >= 1, got 0$"),
        ({"max_one_hot_elements": 2.5}, r"^determinize.max_one_hot_elements must be a whole number >= 1, got 2.5$"),
        ({"rtol": -1.0}, r"^determinize.rtol must be a number >= 0, got -1.0$"),
        ({"seed": True}, r"^determinize.seed must be a whole number, got True$"),
    ],
)
def test_invalid_options(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DeterminizeOptions(**kwargs)


def test_unreadable_model(tmp_path):
    with pytest.raises(InputError, match=r"does not exist$"):
        determinize(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    with pytest.raises(InputError, match=r"^.*bad.onnx is not a readable ONNX model: "):
        determinize(tmp_path / "bad.onnx", tmp_path / "out.onnx")
