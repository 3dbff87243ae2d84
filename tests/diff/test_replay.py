"""Replay in isolation (``qconsist.diff.replay``): nodes cut out of a model as a model of their own, run under
two runs' execution options; and ``diff --replay`` on open_nsfw's QDQ dumps at levels disable and extended."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.diff.replay import ReplayOutcome, boundary, isolate, replay_nodes
from qconsist.errors import ConfigError
from qconsist.explain.confirm import confirm_origins, replay_origin
from qconsist.inference.session import ExecutionOptions, provider_available
from qconsist.store.run import Run

ALL, DISABLE = ExecutionOptions(graph_optimization_level="all"), ExecutionOptions(graph_optimization_level="disable")


def branching_model() -> onnx.ModelProto:
    """x -> Mul (pre) -> t; an If whose branches read the outer t and the outer initializer ``one``; an unnamed
    Mul by a Constant node's output; opsets of two domains."""
    then_branch = helper.make_graph([helper.make_node("Add", ["t", "one"], ["then_out"])], "then", [],
                                    [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 3])])
    else_branch = helper.make_graph([helper.make_node("Sub", ["t", "one"], ["else_out"])], "else", [],
                                    [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2, 3])])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["t"], name="pre"),
        helper.make_node("If", ["cond"], ["branched"], name="branch", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Constant", [], ["k"], name="k_const", value=numpy_helper.from_array(np.float32(0.5).reshape(()), "k")),
        helper.make_node("Mul", ["branched", "k"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "branching",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.float32(2).reshape(()), "two"), numpy_helper.from_array(np.float32(1).reshape(()), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_isolate_feeds_the_outer_tensors_a_subgraph_reads_and_carries_constants():
    model = branching_model()
    small = isolate(model, ["branch", "~Mul_3"])  # the Mul is unnamed: its invented name, marked
    assert small.nodes == ("branch", "~Mul_3")
    assert small.inputs == ("cond", "t") and small.outputs == ("z",)
    assert small.constants == ("one", "k")
    rebuilt = onnx.load_from_string(small.model)
    assert [(o.domain, o.version) for o in rebuilt.opset_import] == [("", 17), ("com.microsoft", 1)]
    assert rebuilt.ir_version == 8 and [n.op_type for n in rebuilt.graph.node] == ["Constant", "If", "Mul"]
    onnx.checker.check_model(rebuilt)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    full = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    alone = ort.InferenceSession(small.model, providers=["CPUExecutionProvider"])
    for cond in (True, False):
        (z,) = full.run(["z"], {"x": x, "cond": np.array(cond)})
        np.testing.assert_array_equal(alone.run(["z"], {"t": x * 2, "cond": np.array(cond)})[0], z)
        assert z.tolist() == ((x * 2 + (1 if cond else -1)) * 0.5).tolist()
    assert boundary(model, ["pre", "branch"]) == (("x", "cond"), ("branched",))


def test_isolate_and_replay_refuse_what_they_cannot_do():
    model = branching_model()
    with pytest.raises(ConfigError, match=r"^replay: the model has no node named 'nope'$"):
        isolate(model, ["pre", "nope"])
    with pytest.raises(ConfigError, match=r"^replay: give at least one node$"):
        isolate(model, [])
    with pytest.raises(ConfigError, match=r"^replay: no node of the set computes 't'$"):
        isolate(model, ["branch"], outputs=["t"])
    x = {"x": np.ones((2, 3), np.float32)}
    with pytest.raises(ConfigError, match=r"^replay: give the execution options \(and models\) of exactly two runs$"):
        replay_nodes(model, ["pre"], {0: x}, [ALL])
    with pytest.raises(ConfigError, match=r"^replay: no sample to replay$"):
        replay_nodes(model, ["pre"], {}, [ALL, DISABLE])
    with pytest.raises(ConfigError, match=r"^replay: no array given for input 'cond' of branch$"):
        replay_nodes(model, ["branch"], {0: {"t": x["x"]}}, [ALL, DISABLE])


def _conv(channels_in: int = 16, channels_out: int = 32) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels_in, 24, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels_out, 24, 24])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (channels_out, channels_in, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 0.1, channels_out).astype(np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_which_session_settings_change_a_lone_conv_on_the_cpu():
    """Measured, not assumed: a float Conv alone on the CPU EP gives other bits at level all than at level
    disable or without the NCHWc transformer (its NCHWc kernel sums in another order), and the same bits with
    deterministic compute on or off, 1 or 2 intra-op threads, level extended or disable."""
    model = _conv()
    x = {s: {"x": np.random.default_rng(s).normal(0, 1, (1, 16, 24, 24)).astype(np.float32)} for s in range(2)}
    nchwc_off = ALL.with_options(disabled_optimizers=("NchwcTransformer",))
    outcomes = {
        "all vs disable": replay_nodes(model, ["conv"], x, [ALL, DISABLE]),
        "all vs NCHWc off": replay_nodes(model, ["conv"], x, [ALL, nchwc_off]),
        "deterministic": replay_nodes(model, ["conv"], x, [ALL, ALL.with_options(deterministic_compute=True)]),
        "threads": replay_nodes(model, ["conv"], x, [ALL.with_options(intra_op_threads=1), ALL.with_options(intra_op_threads=2)]),
        "extended vs disable": replay_nodes(model, ["conv"], x, [ExecutionOptions(graph_optimization_level="extended"), DISABLE]),
    }
    assert {k: r.outcome for k, r in outcomes.items()} == {
        "all vs disable": ReplayOutcome.CONFIRMED, "all vs NCHWc off": ReplayOutcome.CONFIRMED,
        "deterministic": ReplayOutcome.NOT_REPRODUCED, "threads": ReplayOutcome.NOT_REPRODUCED,
        "extended vs disable": ReplayOutcome.NOT_REPRODUCED,
    }
    # the figures are those of plain onnxruntime sessions of the whole (one-node) model, compared with numpy
    confirmed = outcomes["all vs disable"]
    plain = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        plain.append([session.run(None, x[s])[0] for s in range(2)])
    assert confirmed.mismatched == sum(int((a != b).sum()) for a, b in zip(*plain)) > 0
    assert confirmed.max_abs == max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(*plain))
    assert confirmed.elements == 2 * 32 * 24 * 24 and confirmed.differing == [0, 1]


def test_a_provider_this_machine_lacks_is_cannot_replay():
    model = _conv()
    x = {0: {"x": np.zeros((1, 16, 24, 24), np.float32)}}
    replay = replay_nodes(model, ["conv"], x, [ALL, ExecutionOptions("cuda")])
    if provider_available("cuda"):
        assert replay.outcome is not ReplayOutcome.CANNOT
    else:
        assert replay.outcome is ReplayOutcome.CANNOT
        assert replay.reason.startswith("onnxruntime cannot run the isolated nodes here: execution provider cuda "
                                        "(CUDAExecutionProvider) is not in this onnxruntime")
        assert replay.summary() == f"cannot replay: {replay.reason}"


# --- open_nsfw, levels disable and extended (tests/diff/conftest.py) -----------------------------------------------


def _raw(run_dir, tensor: str, samples: int = 4) -> list[np.ndarray]:
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    column = next(i for i, t in enumerate(index["tensors"]) if t["original"] == tensor)
    return [np.load(run_dir / "dump" / "raw" / f"{s:06d}.npz")[f"t{column}"] for s in range(samples)]


def test_open_nsfw_first_conv_is_confirmed_by_replay_as_numpy_sees_the_raw_tensors(level_runs):
    result = diff_runs(level_runs["disable"], level_runs["extended"])
    (replay,) = confirm_origins(result)
    assert replay.label == "conv_1" and replay.outcome is ReplayOutcome.CONFIRMED
    assert replay.nodes == ["ConvBnFusion_BN_B_scale_1_b_DequantizeLinear", "ConvBnFusion_W_conv_1_W_DequantizeLinear",
                            "data_input_QuantizeLinear", "data_input_DequantizeLinear", "conv_1", "relu_1_QuantizeLinear",
                            "relu_1_DequantizeLinear"]
    assert replay.inputs == ["data_input"] and replay.outputs == ["relu_1_DequantizeLinear_Output"]
    assert replay.sources == {"data_input": "the input set, opened again (digest checked)"}
    a, b = _raw(level_runs["disable"], "relu_1_DequantizeLinear_Output"), _raw(level_runs["extended"], "relu_1_DequantizeLinear_Output")
    assert replay.samples == replay.differing == [s for s in range(4) if not np.array_equal(a[s], b[s])] == [0, 1, 2, 3]
    # the fused conv's inputs are not observed at level extended: a span (compare.origin), replayed like an origin
    assert result.tensors.origins == [] and [n.label for n in result.tensors.spans] == ["conv_1"]
    assert replay.mismatched == sum(int((x != y).sum()) for x, y in zip(a, b)) == result.tensors.spans[0].elements.differing
    assert replay.max_abs == max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b))
    assert [side.recorded for side in replay.sides] == ["matches", "matches"]
    out = CliRunner().invoke(app, ["diff", "--replay", str(level_runs["disable"]), str(level_runs["extended"])])
    assert out.exit_code == 1
    assert (f"replay conv_1: {replay.summary()}" in out.output.splitlines()
            and replay.summary().startswith("confirmed in isolation: fed identical inputs (data_input), its 7 nodes "
                                            "(ConvBnFusion_BN_B_scale_1_b_DequantizeLinear, ConvBnFusion_W_conv_1_W_DequantizeLinear, "
                                            "data_input_QuantizeLinear, ...) compute different outputs under the two runs' "
                                            "options (A: --ep cpu --level disable; B: --ep cpu --level extended): 4/4 samples differ"))


def test_a_node_whose_recorded_inputs_differ_is_not_replayed(level_runs):
    """pool1 reads the first conv's dequantized output, which both runs kept raw and which differs: not an origin."""
    replay = replay_origin(Run.open(level_runs["disable"]), Run.open(level_runs["extended"]), ["pool1"], range(4), "pool1")
    assert replay.outcome is ReplayOutcome.CANNOT
    assert replay.reason == "its recorded inputs differ between the runs in samples 0, 1, 2, 3: it is not an origin there"


def test_identical_runs_have_nothing_to_replay(level_runs):
    result = diff_runs(level_runs["extended"], level_runs["extended2"])
    assert confirm_origins(result) == [] and result.replays == []
    out = CliRunner().invoke(app, ["diff", "--replay", str(level_runs["extended"]), str(level_runs["extended2"])])
    assert out.exit_code == 0 and "replay" not in out.output


def test_runs_whose_models_give_the_nodes_other_constants_say_so():
    """Two runs of two quantizations (here: two weight sets) replay each run's own nodes: outputs that differ under
    one and the same options come from the constants, and the replay names them."""
    first, second = _conv(), _conv()
    second.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros(32, np.float32), "b"))
    x = {0: {"x": np.random.default_rng(1).normal(0, 1, (1, 16, 24, 24)).astype(np.float32)}}
    replay = replay_nodes((first, second), ["conv"], x, [DISABLE, DISABLE])
    assert replay.outcome is ReplayOutcome.CONFIRMED and replay.constants_differ == ["b"]
    assert "(A: --ep cpu --level disable; B: --ep cpu --level disable; each run's own model, which differ in b)" in replay.summary()
    assert replay_nodes((first, _conv()), ["conv"], x, [DISABLE, DISABLE]).constants_differ == []


def test_the_report_shows_one_line_per_replayed_origin(level_runs):
    from qconsist.report.html import divergence_section
    from qconsist.store.serde import encode

    result = diff_runs(level_runs["disable"], level_runs["extended"])
    (replay,) = confirm_origins(result)
    html = divergence_section(encode(result))
    assert f"<p>Replay of <code>conv_1</code>: {replay.summary()}</p>".replace("'", "&#x27;") in html
