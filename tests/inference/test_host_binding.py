"""The host dump's binding (``host_binding.HostBinding``): onnxruntime writes every exposed output into the reused
buffer bound to it, also where a kernel could hand its input's buffer on (Identity, Reshape, Flatten, an outer
input passed through an ``If`` branch) — so the arrays a step returns are that step's tensors, never a previous
step's left in a buffer ORT did not write. Issue 31 item 4 asked whether the planner honours the binding for every
tensor; these tests keep asking it of each onnxruntime the lock brings.

Tensors inside ``If`` branches (the dump's exposure, ``branches.py``: empty where the other branch ran) and value-
dependent shapes (``NonZero``) change shape from step to step with the same inputs' shapes: ORT refuses the bound
buffers and the binding runs ``session.run`` from then on; each step's tensors are still its own."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from branch_models import gated_inputs, gated_model
from dump_tables import assert_records_alone
from qconsist.inference.dump import plan_dump
from qconsist.inference.host_binding import SLOTS, HostBinding
from qconsist.inference.recording import HostDump
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session, input_specs

# gated_inputs' samples: 0-1 gate/then inner/then, 2-3 gate/then inner/else, 4-5 gate/else; the branches change
# at almost every step, and each kind of change is met once before the order repeats itself
BRANCH_ORDER = [0, 1, 2, 3, 4, 5, 0, 4, 2, 5, 1, 3]


def _session(model: onnx.ModelProto):
    model.ir_version = 8
    # as the dump reloads its exposed graph: optimizations off, idle threads sleeping
    return create_session(model.SerializeToString(), ExecutionOptions(), level=OptimizationLevel.DISABLE, spinning=False)


def aliasing_model() -> onnx.ModelProto:
    """x (2, 3) -> Relu r; r -> Identity i, Reshape re (3, 2), Flatten f; x -> Identity ix: every node an output."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, 2])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Reshape", ["r", "shape"], ["re"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Identity", ["x"], ["ix"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("r", "i", "re", "f", "ix")]
    graph = helper.make_graph(nodes, "aliasing", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], outputs, [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def branch_model() -> onnx.ModelProto:
    """If c: then Neg(x), else Identity(x) (the outer input itself) -> y; Identity(y) -> z."""
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other), helper.make_node("Identity", ["y"], ["z"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    return helper.make_model(helper.make_graph(nodes, "branch", inputs, outputs), opset_imports=[helper.make_opsetid("", 13)])


def run_steps(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> tuple[HostBinding, list, list, list]:
    """Every step through the binding — its arrays as returned, and copied right after the step — and through
    ``session.run``."""
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    binding = HostBinding(session, names, ["float32"] * len(names))
    returned, copied = [], []
    for feed in feeds:
        arrays = binding.run(feed)
        returned.append(arrays)
        copied.append([a.copy() for a in arrays])
    return binding, returned, copied, [session.run(names, feed) for feed in feeds]


@pytest.mark.parametrize("condition", [True, False], ids=["then", "else: the outer input itself"])
@pytest.mark.parametrize("model", ["aliasing", "branch"])
def test_every_output_is_written_into_its_reused_buffer(model, condition):
    rng = np.random.default_rng(31)
    feeds = []
    for _ in range(6):  # each step's values differ from every other's: a buffer left unwritten shows
        feed = {"x": rng.standard_normal((2, 3)).astype(np.float32) + 0.5}
        if model == "branch":
            feed["c"] = np.array(condition)
        feeds.append(feed)
    built = aliasing_model() if model == "aliasing" else branch_model()
    binding, returned, copied, expected = run_steps(built, feeds)
    assert binding.bound_steps == len(feeds) - 1  # the first step learns the shapes with session.run
    for step in range(1, len(feeds) - SLOTS):  # bound steps: SLOTS sets of buffers in turn
        assert all(np.shares_memory(a, b) for a, b in zip(returned[step], returned[step + SLOTS]))
        assert not any(np.shares_memory(a, b) for a, b in zip(returned[step], returned[step + 1]))
    for step, (got, want) in enumerate(zip(copied, expected)):  # each step's arrays, read right after it: its own values
        assert [a.shape for a in got] == [a.shape for a in want]
        for mine, theirs in zip(got, want):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step}")


def test_each_step_reads_its_own_tensors_while_the_other_slot_is_written():
    """Step k's arrays keep step k's values while step k + 1 is written into the other set (what the fingerprint
    worker relies on), and equal ``session.run`` of step k."""
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(5)]
    session = _session(aliasing_model())
    names = [o.name for o in session.get_outputs()]
    binding = HostBinding(session, names, ["float32"] * len(names))
    binding.run(feeds[0])
    for step in range(1, len(feeds) - 1):
        arrays = binding.run(feeds[step])
        binding.run(feeds[step + 1])  # written into the other slot
        for got, want in zip(arrays, session.run(names, feeds[step])):
            np.testing.assert_array_equal(got, want)
    assert binding.bound_steps == 2 * (len(feeds) - 2)  # every step but the first bound, each of the loop's twice


def test_steps_through_changing_branches_give_each_step_its_tensors(tmp_path):
    """A dump's exposed graph of a model whose samples take different ``If`` branches (its branch tensors change shape
    between steps): every step's arrays, read right after it, equal ``session.run``'s, shape and value."""
    model = gated_model(tmp_path / "gated.onnx")
    samples = np.load(gated_inputs(tmp_path / "x.npy"))
    name = input_specs(model)[0].name
    plan = plan_dump(model, ExecutionOptions(), tmp_path / "dump")
    names = [t.name for t in plan.tensors]
    assert any("/" in n for n in names)  # tensors inside the branches are exposed (their paths)
    binding = HostBinding(plan.session, names, plan.dtypes)
    feeds = [{name: samples[i:i + 1]} for i in BRANCH_ORDER]
    copied = [[a.copy() for a in binding.run(feed)] for feed in feeds]
    changing = 0
    for step, (got, feed) in enumerate(zip(copied, feeds)):
        want = plan.session.run(names, feed)
        assert [a.shape for a in got] == [a.shape for a in want], f"step {step}"
        for column, (mine, theirs) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step}, {names[column]}")
        changing += step > 0 and [a.shape for a in got] != [a.shape for a in copied[step - 1]]
    assert changing >= 5  # the branches taken changed at most steps


def test_a_dump_through_changing_branches_records_each_tensor_as_alone(tmp_path):
    """The whole host dump on those steps: faithful, and its records equal each step's tensors of a separate
    ``session.run`` fingerprinted alone, byte for byte."""
    model = gated_model(tmp_path / "gated.onnx")
    samples = np.load(gated_inputs(tmp_path / "x.npy"))
    name = input_specs(model)[0].name
    options = ExecutionOptions()
    plan = plan_dump(model, options, tmp_path / "dump")
    production = create_session(model, options)
    feeds = [{name: samples[i:i + 1]} for i in BRANCH_ORDER]
    recorder = HostDump(plan, options, tmp_path / "run", len(feeds), set(), {}, None)
    try:
        for index, feed in enumerate(feeds):
            recorder.before(feed, 1)
            recorder.after(index, production.run(None, feed), 1)
        summary = recorder.finish(len(feeds), lambda sample: 1)
    finally:
        recorder.close()
    assert summary.faithful and summary.samples_checked == len(feeds)
    assert_records_alone(plan, feeds, tmp_path / "run")


def test_a_value_dependent_shape_gives_each_step_its_tensors():
    """``NonZero``'s output has as many columns as the step has non-zero values: every step's arrays, read right
    after it, equal ``session.run``'s (the binding is refused at the first change and runs ``session.run`` after)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Neg", ["r"], ["n"])]
    outputs = [helper.make_tensor_value_info("r", TensorProto.FLOAT, None), helper.make_tensor_value_info("nz", TensorProto.INT64, None),
               helper.make_tensor_value_info("n", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], outputs)
    session = _session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    names = [o.name for o in session.get_outputs()]
    binding = HostBinding(session, names, ["float32", "int64", "float32"])
    rng = np.random.default_rng(9)
    feeds = [{"x": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(8)]
    assert [int((feed["x"] > 0).sum()) for feed in feeds] == [3, 3, 4, 3, 2, 2, 5, 1]  # nz's shape (2, count) changes
    for step, feed in enumerate(feeds):
        got = [a.copy() for a in binding.run(feed)]
        want = session.run(names, feed)
        assert [a.shape for a in got] == [a.shape for a in want], f"step {step}"
        for mine, theirs in zip(got, want):
            np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step}")
    assert binding.bound_steps == 1  # step 1 bound (the same count as step 0's); refused at step 2, session.run after
