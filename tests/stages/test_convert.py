"""Stage convert on the real open_nsfw model (photographs, dynamic batch, the recorded check) and on bad
input: every refusal is one line naming the problem, and nothing is written."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import pytest
from caffe_builder import NetBuilder

from qconsist.errors import ConfigError, FidelityError, InputError, UnsupportedModelError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inputs.preprocess import ChannelOrder
from qconsist.models import fetch_model
from qconsist.stages.caffe import reference
from qconsist.stages.caffe.fidelity import FidelityCheck, onnx_session
from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt
from qconsist.stages.convert import ConvertOptions, ConvertResult, convert_caffe

NSFW_PREPROCESS = Preprocess(resize=(256, 256), crop=(224, 224), channel_order=ChannelOrder.BGR, mean=(104.0, 117.0, 123.0))


@pytest.fixture(scope="module")
def nsfw_files():
    return fetch_model("open_nsfw")


@pytest.fixture(scope="module")
def nsfw(nsfw_files, tmp_path_factory):
    """open_nsfw converted with the default options (fidelity check on) and with a dynamic batch."""
    root = tmp_path_factory.mktemp("nsfw")
    fixed = convert_caffe(nsfw_files["prototxt"], nsfw_files["caffemodel"], root / "nsfw.onnx")
    dynamic = convert_caffe(nsfw_files["prototxt"], nsfw_files["caffemodel"], root / "nsfw-dyn.onnx",
                            ConvertOptions(dynamic_batch=True, check=False))
    net, weights = read_prototxt(nsfw_files["prototxt"]), read_caffemodel(nsfw_files["caffemodel"])
    return {"fixed": fixed, "dynamic": dynamic, "net": net, "weights": weights}


# --- open_nsfw --------------------------------------------------------------------------------------------


def test_open_nsfw_converts_checks_and_records(nsfw):
    result: ConvertResult = nsfw["fixed"]
    model = onnx.load(result.path)
    onnx.checker.check_model(model, full_check=True)
    assert (result.opset, result.ir_version) == (17, 8)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)] and model.ir_version == 8
    assert [i.name for i in model.graph.input] == ["data_input"]
    assert [o.name for o in model.graph.output] == ["prob"]
    assert not any(n.op_type == "Pad" for n in model.graph.node)  # the -inf Pad (NaN quantization scale) is gone
    assert not any(t.name == "pool1_constant_value" for t in model.graph.initializer)
    assert any(r.startswith("BatchNorm statistics") and "(53 layers)" in r for r in result.repairs)
    assert any("Pad node folded" in r and "pool1" in r for r in result.repairs)
    assert result.check.passed and result.check.max_abs < 1e-6
    assert result.convert_seconds < result.seconds


def test_open_nsfw_result_round_trips_through_json(nsfw):
    result: ConvertResult = nsfw["fixed"]
    data = json.loads(json.dumps(result.to_json()))
    assert data["check"]["schema"] == "qconsist.convert-check/1"
    assert data["check"]["outputs"][0]["name"] == "prob"
    again = ConvertResult.from_json(data)
    assert again.to_json() == result.to_json()
    assert FidelityCheck.from_json(data["check"]).passed


def test_open_nsfw_matches_reference_on_photographs(nsfw, tmp_path):
    """Three photographs, Caffe preprocessing: the logits (fc_nsfw) and probabilities of the converted model
    against the numpy reference. The logits are exposed as an extra output of a copy of the model."""
    photos = open_input_set("package:photos", NSFW_PREPROCESS, "data_input").subset(0, 3)
    batch = np.concatenate([sample["data_input"] for sample in photos])
    assert batch.shape == (3, 3, 224, 224)
    blobs = reference.forward(nsfw["net"], nsfw["weights"], {"data": batch}, dtype=np.float32, keep_all=True)
    model = onnx.load(nsfw["dynamic"].path)
    model.graph.output.append(onnx.helper.make_tensor_value_info("fc_nsfw", onnx.TensorProto.FLOAT, None))
    exposed = tmp_path / "logits.onnx"
    onnx.save(model, exposed)
    prob, logits = onnx_session(exposed).run(["prob", "fc_nsfw"], {"data_input": batch})
    peak = float(np.abs(blobs["fc_nsfw"]).max())
    assert peak > 1.0  # real logits, not a degenerate input
    assert np.abs(logits - blobs["fc_nsfw"]).max() <= 1e-4 * (1 + peak)
    assert np.abs(prob - blobs["prob"]).max() <= 1e-5
    np.testing.assert_allclose(prob.sum(axis=1), 1.0, rtol=1e-5)
    assert len({round(float(p), 4) for p in prob[:, 1]}) == 3  # three different photographs, three scores


def test_open_nsfw_dynamic_batch_matches_batch_one(nsfw):
    session = onnx_session(nsfw["dynamic"].path)
    assert session.get_inputs()[0].shape == ["batch", 3, 224, 224]
    assert session.get_outputs()[0].shape == ["batch", 2]
    photos = open_input_set("package:photos", NSFW_PREPROCESS, "data_input")
    samples = [photos.sample(i)["data_input"] for i in range(3)]
    singles = [session.run(None, {"data_input": s})[0] for s in samples]
    for n in (2, 3):
        (batched,) = session.run(None, {"data_input": np.concatenate(samples[:n])})
        np.testing.assert_allclose(batched, np.concatenate(singles[:n]), rtol=1e-5, atol=1e-6)
    assert "dynamic batch dimension 'batch' on inputs and outputs" in nsfw["dynamic"].repairs


def test_fixed_batch_model_refuses_other_batches(nsfw):
    session = onnx_session(nsfw["fixed"].path)
    assert session.get_inputs()[0].shape == [1, 3, 224, 224]


# --- options ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 12, 22, 28])
def test_unsupported_opset_is_refused(opset):
    with pytest.raises(ConfigError, match=rf"^convert.opset {opset} is not supported; choose one of 13, 14, .*, 21$"):
        ConvertOptions(opset=opset)


def test_options_are_typed():
    with pytest.raises(ConfigError, match=r"^convert.check must be true or false, got 'yes'$"):
        ConvertOptions(check="yes")
    with pytest.raises(ConfigError, match=r"^convert.opset True is not supported"):
        ConvertOptions(opset=True)


@pytest.mark.parametrize("opset", [13, 21])
def test_other_opsets_convert(tmp_path, opset):
    net = NetBuilder(seed=2)
    net.softmax(net.pool(net.conv(net.input((1, 3, 8, 8)), 4, kernel_size=3), "AVE", kernel_size=2, stride=2))
    prototxt, caffemodel = net.write(tmp_path)
    result = convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx", ConvertOptions(opset=opset))
    assert onnx.load(result.path).opset_import[0].version == opset and result.check.passed


def test_check_can_be_switched_off(tmp_path):
    net = NetBuilder(seed=2)
    net.relu(net.input((1, 2, 3, 3)))
    prototxt, caffemodel = net.write(tmp_path)
    result = convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx", ConvertOptions(check=False))
    assert result.check is None and result.passed and result.to_json()["check"] is None


def test_fidelity_error_when_a_repair_is_missing(tmp_path, monkeypatch):
    """Without the Eltwise repair the coefficients are lost: the stage's own check catches it."""
    from qconsist.stages.caffe import repair

    monkeypatch.setattr(repair, "repair_eltwise", lambda g: [])
    net = NetBuilder(seed=4)
    x = net.input((1, 2, 4, 4))
    net.eltwise([net.conv(x, 2, kernel_size=1), x], coeff=[1.0, -1.0])
    prototxt, caffemodel = net.write(tmp_path)
    out = tmp_path / "m.onnx"
    with pytest.raises(FidelityError, match=r"^converted model differs from the numpy Caffe reference: output 'eltwise2': "
                                            r"greatest absolute difference [0-9.e+-]+ at \[.*\] .*tolerance"):
        convert_caffe(prototxt, caffemodel, out)
    assert not out.exists()


# --- bad input --------------------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path):
    net = NetBuilder(seed=1)
    net.softmax(net.conv(net.input((1, 3, 6, 6)), 4, kernel_size=3))
    return net, *net.write(tmp_path)


def test_missing_prototxt(tmp_path, small):
    _, _, caffemodel = small
    with pytest.raises(InputError, match=rf"^prototxt {tmp_path / 'nope.prototxt'} does not exist$"):
        convert_caffe(tmp_path / "nope.prototxt", caffemodel, tmp_path / "m.onnx")


def test_missing_caffemodel(tmp_path, small):
    _, prototxt, _ = small
    with pytest.raises(InputError, match=rf"^caffemodel {tmp_path / 'nope.caffemodel'} does not exist$"):
        convert_caffe(prototxt, tmp_path / "nope.caffemodel", tmp_path / "m.onnx")


def test_truncated_caffemodel(tmp_path, nsfw_files):
    cut = tmp_path / "cut.caffemodel"
    cut.write_bytes(nsfw_files["caffemodel"].read_bytes()[: 5_000_001])
    out = tmp_path / "m.onnx"
    with pytest.raises(InputError, match=rf"^caffemodel {cut} is truncated or corrupt \(.*\); download it again$"):
        convert_caffe(nsfw_files["prototxt"], cut, out)
    assert not out.exists()


def test_unknown_layer_type(tmp_path, small):
    net, _, caffemodel = small
    net.add("Swish", "softmax3")
    prototxt, _ = net.write(tmp_path, "swish")
    with pytest.raises(UnsupportedModelError, match=r"^layer 'swish3' has type 'Swish', which qconsist cannot convert "
                                                    r"faithfully \(supported: BatchNorm, Concat, .*, Softmax\)$"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")


def test_prototxt_syntax_error(tmp_path, small):
    _, prototxt, caffemodel = small
    broken = tmp_path / "broken.prototxt"
    broken.write_text(prototxt.read_text().replace("layer {", "layer {{", 1))
    expected = f"prototxt {broken} is not a valid Caffe network definition: 2:8 : 'layer {{{{': Expected identifier or number, got {{."
    with pytest.raises(InputError, match="^" + re.escape(expected) + "$"):
        convert_caffe(broken, caffemodel, tmp_path / "m.onnx")


def test_prototxt_and_caffemodel_do_not_match(tmp_path, small):
    _, _, caffemodel = small
    other = NetBuilder(seed=1)
    other.softmax(other.conv(other.input((1, 3, 6, 6)), 4, kernel_size=3))
    other.net.layer[1].name = "conv_other"  # same network, but its weights are saved under another name
    prototxt, _ = other.write(tmp_path, "other")
    with pytest.raises(InputError, match=r"^caffemodel holds 0 blob\(s\) for layer 'conv_other' \(Convolution\), which needs 2; "
                                         r"do the prototxt and caffemodel belong together\?$"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")


def test_layer_reading_an_unknown_blob(tmp_path, small):
    net, _, caffemodel = small
    net.add("ReLU", "nowhere")
    prototxt, _ = net.write(tmp_path, "dangling")
    with pytest.raises(InputError, match=r"^layer 'relu3' reads blob\(s\) \['nowhere'\] that no earlier layer or input produces$"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")


def _refused(tmp_path, build, match):
    net = NetBuilder(seed=0)
    build(net, net.input((1, 4, 9, 9)))
    prototxt, caffemodel = net.write(tmp_path)
    out = tmp_path / "m.onnx"
    with pytest.raises(UnsupportedModelError, match=match):
        convert_caffe(prototxt, caffemodel, out)
    assert not out.exists()


def test_refuses_batch_statistics(tmp_path):
    _refused(tmp_path, lambda n, x: n.batch_norm(x, use_global_stats=False),
             r"^layer 'batchnorm1' \(BatchNorm\): use_global_stats: false normalises each batch with its own statistics")


def test_refuses_stochastic_pooling(tmp_path):
    _refused(tmp_path, lambda n, x: n.pool(x, "STOCHASTIC", kernel_size=2, stride=2),
             r"^layer 'pooling1' \(Pooling\): STOCHASTIC pooling has no ONNX equivalent$")


def test_refuses_window_outside_the_image(tmp_path):
    _refused(tmp_path, lambda n, x: n.pool(x, "MAX", kernel_size=1, stride=5),
             r"^layer 'pooling1' \(Pooling\): its last window starts outside the image \(size 9, kernel 1, stride 5\)")


def test_refuses_ave_pool_onnx_cannot_agree_on(tmp_path):
    # 9x9, kernel 2 / stride 2 / pad 1 drops a window in H; kernel 2 / stride 2 / pad 0 overhangs in W
    _refused(tmp_path, lambda n, x: n.pool(x, "AVE", kernel_h=2, kernel_w=2, stride_h=2, stride_w=2, pad_h=1, pad_w=0),
             r"^layer 'pooling1' \(Pooling\): AVE pooling of 9x9 .* has no ONNX form that onnx and onnxruntime agree on$")


def test_refuses_scale_from_a_second_bottom(tmp_path):
    _refused(tmp_path, lambda n, x: n.add("Scale", [x, n.conv(x, 4, kernel_size=1)], scale_param={"axis": 0}),
             r"^layer 'scale2' \(Scale\): takes its scale from a second bottom")


def test_refuses_phase_rules(tmp_path):
    def build(n, x):
        n.relu(x, in_place=False)
        n.net.layer[-1].include.add().phase = 0

    _refused(tmp_path, build, r"^layer 'relu1' \(ReLU\): has include/exclude phase rules")


def test_dynamic_batch_refused_when_the_batch_is_reshaped(tmp_path):
    net = NetBuilder(seed=0)
    net.reshape(net.input((2, 4, 3, 3)), [-1, 36], axis=0)
    prototxt, caffemodel = net.write(tmp_path)
    with pytest.raises(ConfigError, match=r"^convert.dynamic_batch: Reshape 'reshape1' folds the batch dimension"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx", ConvertOptions(dynamic_batch=True))
    assert convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx").check.passed  # fixed batch converts


def test_output_written_atomically_only_on_success(tmp_path, small):
    _, prototxt, caffemodel = small
    out = tmp_path / "sub" / "m.onnx"
    out.parent.mkdir()
    result = convert_caffe(prototxt, caffemodel, out)
    assert result.path == out and out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx"]
    shutil.rmtree(out.parent)


def _legacy(tmp_path, names):
    net = NetBuilder(seed=0)
    x = net.input((1, 3, 8, 8))
    net.softmax(net.conv(x, 4, kernel_size=3))
    del net.net.layer[0]  # the Input layer becomes the legacy "input:" / "input_shape" header
    for name in names:
        net.net.input.append(name)
        net.net.input_shape.add().dim.extend([1, 3, 8, 8])
    return net.write(tmp_path)


def test_legacy_input_header_converts(tmp_path):
    prototxt, caffemodel = _legacy(tmp_path, ["data"])
    result = convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")
    model = onnx.load(result.path)
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["softmax2"]
    assert result.check.passed and result.check.max_abs < 1e-6


def test_legacy_input_header_with_two_inputs_is_refused(tmp_path):
    prototxt, caffemodel = _legacy(tmp_path, ["data", "extra"])
    with pytest.raises(UnsupportedModelError, match=r"^the network declares 2 inputs in the legacy 'input:' form"):
        convert_caffe(prototxt, caffemodel, tmp_path / "m.onnx")


def test_empty_caffemodel(tmp_path, small):
    _, prototxt, _ = small
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=rf"^caffemodel {empty} holds no layers; is it a Caffe weights file\?$"):
        convert_caffe(prototxt, empty, tmp_path / "m.onnx")
