"""The dump observes inside ``If`` branches (issue 27's leftover): the tensors the branch that ran computed are
recorded under their paths (``gate/then/then_scaled``), those of the branch that did not run as not computed; the
origin rule works inside (a node in the taken branch is an origin only where all it reads, the If's condition
included, was observed equal), runs that took different branches are said to, and ``Loop`` bodies are recorded as
not observed. Models built in code (``branch_models.py``), run with ORT CPU."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from branch_models import GATED_BRANCH_TENSORS as BRANCH_TENSORS
from branch_models import gated_inputs, gated_model, saturating_branch_inputs, saturating_branch_model
from qconsist.cli import app
from qconsist.diff import diff_runs
from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inputs import open_input_set



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("branches")
    inputs = open_input_set(str(gated_inputs(folder / "x.npy")), None, "x")
    made = {}
    for run_id, changed in (("a", {}), ("w", {"w": 0.7001}), ("w2", {"w2": 1.3001}), ("threshold", {"threshold": 0.5})):
        model = gated_model(folder / f"{run_id}.onnx", **changed)
        made[run_id] = run_inference(resolve_model(model), inputs, RunRequest(ExecutionOptions(), dump=True, raw=RawSelection.parse("all")),
                                     folder / "runs", run_id=run_id).run_dir
    made["model"], made["inputs"] = folder / "a.onnx", np.load(folder / "x.npy")
    return made


def _raw(run, sample: int) -> dict[str, np.ndarray]:
    names = [t["name"] for t in json.loads((run / "dump" / "index.json").read_text())["tensors"]]
    with np.load(run / "dump" / "raw" / f"{sample:06d}.npz") as raw:
        return {name: raw[f"t{c}"] for c, name in enumerate(names)}


def test_the_dump_records_what_the_branch_that_ran_computed_under_its_path(runs):
    index = json.loads((runs["a"] / "dump" / "index.json").read_text())
    inner = [(t["name"], t["label"], t["branch"]) for t in index["tensors"] if t["how"] == "branch"]
    assert inner == [(n, label, branch) for n, label, branch in BRANCH_TENSORS]
    assert index["left_out"] == {}
    manifest = json.loads((runs["a"] / "manifest.json").read_text())
    assert manifest["sections"]["dump"]["faithful"] is True and manifest["sections"]["dump"]["samples_checked"] == 6
    model, x = onnx.load(str(runs["model"])), runs["inputs"]
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w"))
    session = ort.InferenceSession(str(runs["model"]), providers=["CPUExecutionProvider"])
    for sample in range(6):
        raw = _raw(runs["a"], sample)
        # the final output as plain onnxruntime computes it, bit for bit
        assert raw["y"].tobytes() == session.run(None, {"x": x[sample:sample + 1]})[0].tobytes()
        then = float(x[sample].sum()) > 0
        assert raw["gate/then_taken"].shape == () and bool(raw["gate/then_taken"]) is then
        if then:  # the then branch ran: its tensors hold its values (a float32 Mul is exact per element)
            np.testing.assert_array_equal(raw["gate/then/then_scaled"], x[sample:sample + 1] * w)
            np.testing.assert_array_equal(raw["gate/then/then_out"], raw["gated"])
            assert raw["gate/else/else_out"].shape == (0,) and raw["gate/else/negated"].shape == (0,)
            wide = bool(x[sample].max() > 1)
            assert bool(raw["gate/then/inner/then_taken"]) is wide
            assert raw["gate/then/inner/else/inner_n"].shape == ((0,) if wide else (1, 8))
            assert raw["gate/then/inner/then/inner_r"].shape == ((1, 8) if wide else (0,))
        else:  # the else branch ran: the then branch's tensors, the nested If's marker included, were not computed
            np.testing.assert_array_equal(raw["gate/else/negated"], -x[sample:sample + 1])
            np.testing.assert_array_equal(raw["gate/else/else_out"], raw["gated"])
            assert all(raw[n].shape == (0,) for n, _, branch in BRANCH_TENSORS if branch and branch[0] == "gate/then")
    assert [bool(_raw(runs["a"], s)["gate/then_taken"]) for s in range(6)] == [True, True, True, True, False, False]


def test_diff_names_the_node_inside_the_branch_as_origin_not_the_if(runs, monkeypatch):
    result = diff_runs(runs["a"], runs["w"]).tensors
    assert result.first.label == "gate/then/then_mul"
    assert [(n.label, n.origin_samples, n.initializers_changed, n.inputs, n.given) for n in result.origins] == [
        ("gate/then/then_mul", [0, 1, 2, 3], ["w"], ["cond"], ["x"])]
    assert [n.label for n in result.nodes] == ["gate/then/then_mul", "gate/then/inner/then/inner_mul", "gate/then/inner/then/inner_relu",
                                               "gate/then/inner/else/inner_neg", "gate/then/inner", "gate/then/then_add", "gate", "after"]
    # the inner tensors differ only where the branch ran in both runs: inner_mul in 0-1, inner_neg in 2-3, none in 4-5
    assert {n.label: n.samples for n in result.nodes}["gate/then/inner/then/inner_mul"] == [0, 1]
    assert {n.label: n.samples for n in result.nodes}["gate/then/inner/else/inner_neg"] == [2, 3]
    assert result.branches_apart == [] and result.spans == []
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["diff", str(runs["a"]), str(runs["w"])])
    assert out.exit_code == 1, out.output
    assert ("origin gate/then/then_mul: outputs differ while every input it reads was compared (1 observed input(s) "
            "bit-identical (cond); graph input(s) x from the same input set; constant(s) differ: w; samples [0, 1, 2, 3])") in out.stdout
    assert "first diverging node: gate/then/then_mul; origin nodes: 1" in out.stdout


def test_replay_of_a_node_inside_a_branch_says_why_it_cannot(runs, monkeypatch):
    """--replay cuts an origin out of a graph to run it alone; a node inside an If branch is not a node of the
    graph: the replay says where it runs and what the evidence is, not 'no node of the model computes ...'."""
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["diff", str(runs["a"]), str(runs["w"]), "--replay"])
    assert out.exit_code == 1, out.output
    assert ("replay gate/then/then_mul: cannot replay: it runs inside gate/then (a branch of an If): a node inside a "
            "subgraph is not replayed on its own; the dumps' recorded values of it and of everything it reads are the "
            "evidence") in out.stdout


def test_a_plan_without_branches_notes_each_if_as_opaque(tmp_path):
    """The plan of a dump fingerprinted on the GPU (``expose_plan(..., branches=False)``): no tensor inside a
    branch is exposed, the If's own outputs are, and ``left_out`` says why for the top-level If."""
    from qconsist.inference.branches import NOT_ON_DEVICE
    from qconsist.inference.dump import expose_plan

    model = gated_model(tmp_path / "gated.onnx")
    with_branches = expose_plan(model, ExecutionOptions(), tmp_path / "with")
    without = expose_plan(model, ExecutionOptions(), tmp_path / "without", branches=False)
    names = {"with": [t.name for t in with_branches.tensors], "without": [t.name for t in without.tensors]}
    inside = [n for n in names["with"] if "/" in n]
    assert inside == [name for name, _, _ in BRANCH_TENSORS]
    assert [n for n in names["without"] if "/" in n] == []
    assert set(names["without"]) == set(names["with"]) - set(inside)
    assert without.left_out == {"gate/branches": NOT_ON_DEVICE}


def test_a_nested_if_is_observed_and_its_node_named(runs):
    result = diff_runs(runs["a"], runs["w2"]).tensors
    assert [(n.label, n.origin_samples, n.initializers_changed, n.inputs) for n in result.origins] == [
        ("gate/then/inner/then/inner_mul", [0, 1], ["w2"], ["gate/then/then_scaled", "cond", "wide"])]
    assert [n.label for n in result.nodes] == ["gate/then/inner/then/inner_mul", "gate/then/inner/then/inner_relu", "gate/then/inner",
                                               "gate/then/then_add", "gate", "after"]


def test_runs_that_took_different_branches_are_said_to_and_the_condition_is_the_origin(runs, monkeypatch):
    result = diff_runs(runs["a"], runs["threshold"]).tensors
    assert result.branches_apart == [{"node": "gate", "count": 1, "samples": [2], "a": "then", "b": "else"}]
    assert [(n.label, n.origin_samples, n.initializers_changed) for n in result.origins] == [("positive", [2], ["threshold"])]
    # the branches' tensors are never reported as diverging values where one run did not compute them
    assert [n.label for n in result.nodes] == ["positive", "gate", "gate/then_taken", "after"]
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["diff", str(runs["a"]), str(runs["threshold"])])
    assert out.exit_code == 1, out.output
    assert ("branches: the runs took different branches of If gate in 1 sample(s) [2] (A then, B else in sample 2): its "
            "condition differs upstream; the tensors of its branches are not compared there") in out.stdout


def test_the_same_model_twice_agrees_inside_the_branches_too(runs, tmp_path):
    inputs = open_input_set(str(gated_inputs(tmp_path / "x.npy")), None, "x")
    again = run_inference(resolve_model(runs["model"]), inputs, RunRequest(ExecutionOptions(), dump=True), tmp_path / "runs", run_id="again").run_dir
    result = diff_runs(runs["a"], again).tensors
    assert result.nodes == [] and result.branches_apart == [] and result.compared == 17


def test_a_loop_body_is_recorded_as_not_observed(tmp_path):
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["acc", "x"], ["acc_next"], name="body_add")], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 4])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("acc_next", TensorProto.FLOAT, [1, 4])])
    graph = helper.make_graph([helper.make_node("Loop", ["trips", "", "x"], ["y"], name="repeat", body=body)], "loop",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.array(3, np.int64), "trips")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "loop.onnx"))
    np.save(tmp_path / "x.npy", np.arange(8, dtype=np.float32).reshape(2, 4))
    run = run_inference(resolve_model(tmp_path / "loop.onnx"), open_input_set(str(tmp_path / "x.npy"), None, "x"),
                        RunRequest(ExecutionOptions(), dump=True), tmp_path / "runs", run_id="loop").run_dir
    index = json.loads((run / "dump" / "index.json").read_text())
    assert index["left_out"] == {"repeat/body": "a Loop body runs once per iteration: its tensors are not observed (the Loop is "
                                                "one opaque node)"}
    assert [t["name"] for t in index["tensors"]] == ["y"]


@pytest.mark.slow
def test_a_kernel_that_differs_inside_a_branch_is_the_origin_not_the_if(tmp_path, monkeypatch):
    """The QDQ Conv inside the then branch runs as a QLinearConv whose u8·s8 sums AVX2 without VNNI saturates: natively
    (VNNI, exact) and under an emulated Haswell the same optimized graph gives other integers, and ``diff`` names the
    QLinearConv inside the branch, the original investigation's sentence one level down; checked on the raw tensors."""
    from qconsist.cpu import instruction_set

    model, arrays = saturating_branch_model(tmp_path / "sat.onnx"), saturating_branch_inputs(tmp_path / "sat.npy")
    common = [str(model), "--inputs", str(arrays), "--threads", "1", "--dump", "--raw", "all", "--runs-dir", str(tmp_path / "runs")]
    for run_id, extra in (("native", []), ("haswell", ["--isa", "haswell"])):
        out = CliRunner().invoke(app, ["run", *common, "--run-id", run_id, *extra])
        assert out.exit_code == 0, out.output
        assert "dump faithful: final outputs bit-identical to production in 3 samples" in out.output
    native, haswell = tmp_path / "runs" / "native", tmp_path / "runs" / "haswell"
    result = diff_runs(native, haswell).tensors
    if instruction_set().saturates:  # this processor saturates too: the same integers
        assert result.nodes == []
        return
    conv = next(n for n in result.nodes if n.finding)
    assert (conv.label, conv.op_a, conv.finding, conv.origin_samples) == ("gate/then/sat_conv_token_3", "com.microsoft:QLinearConv", "origin", [0, 1])
    assert conv.inputs == ["gate/then/Transpose_out0", "cond"] and conv.key == "gate/then/sat_conv"
    assert [n.label for n in result.nodes] == ["gate/then/sat_conv_token_3", "gate/then/Transpose_token_2", "gate/then/sat_dequantize_output", "out"]
    for sample in (0, 1):  # on the raw tensors: the QLinearConv's input identical, its output not; sample 2 ran the else branch
        a, b = _raw(native, sample), _raw(haswell, sample)
        assert a["gate/then/Transpose_out0"].tobytes() == b["gate/then/Transpose_out0"].tobytes()
        assert a["gate/then/sat_conv"].dtype == np.uint8 and (a["gate/then/sat_conv"] != b["gate/then/sat_conv"]).any()
    assert _raw(native, 2)["gate/then/sat_conv"].shape == (0,) and _raw(haswell, 2)["gate/else/else_y"].shape == (1, 8, 6, 6)
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["diff", str(native), str(haswell)])
    assert out.exit_code == 1
    assert ("origin gate/then/sat_conv_token_3: outputs differ while every input it reads is identical (2 observed input(s) "
            "bit-identical (gate/then/Transpose_out0, cond); 7 constant(s) identical by value; samples [0, 1])") in out.stdout


def _if_model(path, then_output: str = "neg", outer_name: str = "gate/then/neg", named: bool = True):
    then = helper.make_graph([helper.make_node("Neg", ["x"], [then_output], name="then_neg")], "then", [],
                             [helper.make_tensor_value_info(then_output, TensorProto.FLOAT, [1, 4])])
    otherwise = helper.make_graph([helper.make_node("Abs", ["x"], ["abs"], name="else_abs")], "else", [],
                                  [helper.make_tensor_value_info("abs", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
             helper.make_node("If", ["cond"], ["gated"], name="gate" if named else "", then_branch=then, else_branch=otherwise),
             helper.make_node("Identity", ["x"], [outer_name], name="copy"),
             helper.make_node("Add", ["gated", outer_name], ["y"], name="after")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_path_the_graph_already_uses_is_not_exposed_and_noted():
    from qconsist.inference.branches import expose_branches
    from qconsist.inference.dump import expose_all

    exposed, inner, notes = expose_branches(expose_all(_if_model(None))[0])
    assert [t.name for t in inner] == ["gate/else/abs", "gate/then_taken"]
    assert notes == {"gate/then/neg": "its path is a tensor name the graph already uses: not observed"}
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    found = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    assert found["gate/else/abs"].shape == (0,) and bool(found["gate/then_taken"]) is True
    np.testing.assert_array_equal(found["y"], -x + x)


def test_the_dump_and_the_diff_name_an_unnamed_if_alike():
    from qconsist.inference.branches import expose_branches, flatten
    from qconsist.inference.dump import expose_all

    model = _if_model(None, outer_name="copied", named=False)
    _, inner, notes = expose_branches(expose_all(model)[0])
    flat = flatten(model.graph)
    produced = {o: n.name for n in flat.nodes for o in n.outputs}
    assert notes == {} and len(inner) == 3
    # every exposed tensor is an output of the flattened graph's node of the same path, under the invented If name
    assert all(produced[t.name] == t.node for t in inner)
    label = next(n.name for n in flat.nodes if n.op_type == "If")
    assert [t.name for t in inner] == [f"{label}/then/neg", f"{label}/else/abs", f"{label}/then_taken"]
    assert next(n for n in flat.nodes if n.name == f"{label}/then/then_neg").reads == ("x", "cond")


def test_runs_of_different_graphs_keep_each_if_whole_and_say_so(tmp_path):
    """Levels all and disable: ORT removes the Identity 'copy' at level all, so the runs ran different graphs and are
    compared through the original model, where the If stays one node; diff says why its branches were not compared."""
    onnx.save(_if_model(None, outer_name="copied"), str(tmp_path / "m.onnx"))
    np.save(tmp_path / "x.npy", np.array([[1.0, -2.0, 3.0, 0.5], [-1.0, -2.0, 0.5, 0.25]], np.float32))
    dumps = [run_inference(resolve_model(tmp_path / "m.onnx"), open_input_set(str(tmp_path / "x.npy"), None, "x"),
                           RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True), tmp_path / "runs",
                           run_id=level).run_dir for level in ("all", "disable")]
    result = diff_runs(*dumps).tensors
    assert result.space == "original" and result.nodes == []
    assert result.branches_unobserved == ("tensors inside If branches (A 3, B 3): the runs ran different graphs, compared "
                                          "through the original model, where each If is one node")
