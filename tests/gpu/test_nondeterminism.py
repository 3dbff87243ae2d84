"""The table of operators known to vary on ONNX Runtime's CUDA EP, and the nodes of a model that match it:
the FCN-style Caffe models before and after determinize, and small ONNX models built in code (CPU only)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from caffe_builder import NetBuilder
from fcn_models import FCN_MODELS
from onnx import TensorProto, helper, numpy_helper

from qconsist.errors import InputError
from qconsist.locate.nondeterminism import KNOWN, CudaSettings, NondeterminismReport, find_nondeterministic_nodes
from qconsist.inference.session import ConvAlgoSearch
from qconsist.stages.convert import convert_caffe
from qconsist.stages.determinize import determinize

HEURISTIC = CudaSettings(ConvAlgoSearch.HEURISTIC)
TF32_ON = (", use_tf32 on: cuDNN may pick a TF32 engine that is deterministic, as it did on an H100 — the engine record "
           "of locate says which ran)")


@pytest.fixture(scope="module")
def fcn_onnx(tmp_path_factory):
    root = tmp_path_factory.mktemp("fcn-nd")
    out = {}
    for name, build in FCN_MODELS.items():
        prototxt, caffemodel = build(seed=1).write(root)
        out[name] = convert_caffe(prototxt, caffemodel, root / f"{name}.onnx").path
        out[f"{name}_determinized"] = determinize(out[name], root / f"{name}_determinized.onnx").path
    return out


def test_every_row_is_documented_with_a_source():
    assert len({row.id for row in KNOWN}) == len(KNOWN) >= 8
    for row in KNOWN:
        assert row.kind in ("run-to-run", "session-to-session", "data-dependent", "by design")
        assert row.condition and row.mechanism and row.fix
        assert row.sources and all(s.startswith("https://") for s in row.sources)
    conv_transpose = next(r for r in KNOWN if r.id == "conv_transpose_overlapping_windows")
    assert "conv_transpose.cc" in conv_transpose.sources[0]
    assert "60 distinct outputs under EXHAUSTIVE and HEURISTIC with use_tf32=0" in conv_transpose.mechanism
    assert "engine 25" in conv_transpose.mechanism and "use_tf32=1" in conv_transpose.fix
    assert conv_transpose.to_json()["op_types"] == ["ConvTranspose"]


@pytest.mark.parametrize("name, nodes", [
    ("fcn_head", [("deconvolution3", "kernel [4, 4], stride [2, 2], dilation [1, 1]: windows overlap on axis 2, 3 (HEURISTIC search" + TF32_ON)]),
    ("fcn_skip", [("deconvolution11", "kernel [4, 4], stride [2, 2], dilation [1, 1]: windows overlap on axis 2, 3 (HEURISTIC search" + TF32_ON),
                  ("deconvolution15", "kernel [8, 8], stride [4, 4], dilation [1, 1]: windows overlap on axis 2, 3 (HEURISTIC search" + TF32_ON)]),
])
def test_fcn_upsampling_is_found_and_determinize_removes_it(fcn_onnx, name, nodes):
    report = find_nondeterministic_nodes(fcn_onnx[name], HEURISTIC)
    assert [(f.node, f.reason) for f in report.findings] == nodes
    assert {f.row for f in report.findings} == {"conv_transpose_overlapping_windows"}
    assert not report.passed and report.to_json()["passed"] is False
    assert report.findings[0].fix.startswith("qconsist.stages.determinize")
    after = find_nondeterministic_nodes(fcn_onnx[f"{name}_determinized"], HEURISTIC)
    assert after.findings == [] and after.passed


def test_exhaustive_search_also_flags_every_conv_between_sessions(fcn_onnx):
    report = find_nondeterministic_nodes(fcn_onnx["fcn_skip"])  # ORT's defaults: EXHAUSTIVE
    assert report.nodes("run-to-run") == ["deconvolution11", "deconvolution15"]
    convs = [n.name for n in onnx.load(str(fcn_onnx["fcn_skip"])).graph.node if n.op_type == "Conv"]
    assert report.nodes("session-to-session") == convs and len(convs) == 5
    determinized = find_nondeterministic_nodes(fcn_onnx["fcn_skip_determinized"])
    assert determinized.passed and determinized.nodes("run-to-run") == []
    assert len(determinized.nodes("session-to-session")) == 7  # 5 Convs + 2 sub-pixel Convs


def test_report_json_round_trip(fcn_onnx):
    report = find_nondeterministic_nodes(fcn_onnx["fcn_head"], HEURISTIC)
    data = json.loads(json.dumps(report.to_json()))
    assert data["schema"] == "qconsist.nondeterminism/1" and data["settings"]["conv_algo_search"] == "HEURISTIC"
    again = NondeterminismReport.from_json(data)
    assert again.findings == report.findings and again.settings == report.settings
    with pytest.raises(InputError, match=r"^not a non-determinism report of schema qconsist.nondeterminism/1: None$"):
        NondeterminismReport.from_json({})


def test_default_search_is_stable(fcn_onnx):
    report = find_nondeterministic_nodes(fcn_onnx["fcn_head"], CudaSettings(ConvAlgoSearch.DEFAULT))
    assert report.findings == [] and report.passed


def test_non_overlapping_deconvolution_is_not_flagged(tmp_path):
    net = NetBuilder(seed=2)
    x = net.input((1, 4, 8, 8))
    net.conv(x, 4, kernel_size=2, stride=2, deconv=True)
    path = convert_caffe(*net.write(tmp_path), tmp_path / "k2s2.onnx").path
    assert find_nondeterministic_nodes(path, HEURISTIC).findings == []


def _model(nodes, inputs, initializers=(), opset=18, domain_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
                              list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domain_opsets)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def test_scatters():
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, [10]), helper.make_tensor_value_info("u", TensorProto.FLOAT, [4]),
              helper.make_tensor_value_info("i", TensorProto.INT64, [4])]
    repeated = numpy_helper.from_array(np.array([1, 2, 1, 3], np.int64), "repeated")
    unique = numpy_helper.from_array(np.array([1, 2, 0, 3], np.int64), "unique")
    nodes = [
        helper.make_node("ScatterElements", ["data", "i", "u"], ["a"], name="add", reduction="add"),
        helper.make_node("ScatterElements", ["a", "i", "u"], ["b"], name="max", reduction="max"),
        helper.make_node("ScatterElements", ["b", "repeated", "u"], ["c"], name="none_repeated"),
        helper.make_node("ScatterElements", ["c", "unique", "u"], ["d"], name="none_unique"),
        helper.make_node("ScatterElements", ["d", "i", "u"], ["e"], name="none_computed"),
    ]
    report = find_nondeterministic_nodes(_model(nodes, inputs, [repeated, unique]))
    assert [(f.node, f.row, f.kind) for f in report.findings] == [
        ("add", "scatter_elements_atomic_reduction", "run-to-run"),
        ("none_repeated", "scatter_repeated_indices", "data-dependent"),
        ("none_computed", "scatter_repeated_indices", "data-dependent"),
    ]
    assert report.findings[0].reason == "reduction 'add' (float additions / products in the order the atomics land)"
    assert report.findings[1].reason == "reduction 'none' with repeated constant indices: the last write wins in any order"


def test_scatter_nd_add():
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, [10, 3]), helper.make_tensor_value_info("u", TensorProto.FLOAT, [4, 3]),
              helper.make_tensor_value_info("i", TensorProto.INT64, [4, 1])]
    nodes = [helper.make_node("ScatterND", ["data", "i", "u"], ["y"], name="nd", reduction="add")]
    (finding,) = find_nondeterministic_nodes(_model(nodes, inputs)).findings
    assert (finding.node, finding.row) == ("nd", "scatter_nd_atomic_reduction")
    assert finding.fix.startswith("none in qconsist")


def test_reduce_sum_over_leading_axes_unless_deterministic_compute():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 32, 16])
    axes = {name: numpy_helper.from_array(np.array(v, np.int64), name) for name, v in (("lead", [0, 1]), ("last", [2]), ("all_but", [1, 2]))}
    nodes = [helper.make_node("ReduceSum", ["x", name], [f"out_{name}"], name=f"sum_{name}") for name in axes]
    nodes.append(helper.make_node("Identity", ["out_lead"], ["y"], name="id"))
    model = _model(nodes, [x], axes.values())
    report = find_nondeterministic_nodes(model)
    assert [(f.node, f.reason) for f in report.findings] == [
        ("sum_lead", "sums leading axes [0, 1] of a 3-D tensor: ONNX Runtime's fast row reduction adds partial sums with "
                     "atomics (use_deterministic_compute is off)")]
    assert find_nondeterministic_nodes(model, CudaSettings(use_deterministic_compute=True)).findings == []


def test_topk_group_norm_and_random_operators():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4096])
    k = numpy_helper.from_array(np.array([10], np.int64), "k")
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="topk"),
        helper.make_node("RandomNormalLike", ["values"], ["noise"], name="noise"),
        helper.make_node("RandomNormalLike", ["values"], ["seeded"], name="seeded", seed=1.0),
        helper.make_node("Add", ["noise", "seeded"], ["y"], name="sum"),
    ]
    report = find_nondeterministic_nodes(_model(nodes, [x], [k]))
    assert [(f.node, f.row) for f in report.findings] == [("topk", "topk_radix"), ("noise", "random_operators")]
    assert report.findings[0].reason == "axis of 4096 elements (> 1024): the RadixTopK kernel"
    gn = helper.make_node("GroupNorm", ["x4", "gamma", "beta"], ["y"], name="gn", domain="com.microsoft", groups=2)
    model = _model([gn], [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x4", "gamma", "beta")],
                   domain_opsets=["com.microsoft"])
    assert [(f.node, f.row) for f in find_nondeterministic_nodes(model).findings] == [("gn", "group_norm")]


def test_unreadable_model(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(InputError, match=r"^.*bad.onnx is not a readable ONNX model: "):
        find_nondeterministic_nodes(tmp_path / "bad.onnx")


def test_the_conv_transpose_reason_says_what_tf32_does(fcn_onnx):
    off = find_nondeterministic_nodes(fcn_onnx["fcn_head"], CudaSettings(ConvAlgoSearch.HEURISTIC, use_tf32=False))
    assert [f.reason for f in off.findings] == [
        "kernel [4, 4], stride [2, 2], dilation [1, 1]: windows overlap on axis 2, 3 (HEURISTIC search, use_tf32 off)"]
    again = type(off).from_json(off.to_json())
    assert again.settings.use_tf32 is False and again.findings == off.findings
