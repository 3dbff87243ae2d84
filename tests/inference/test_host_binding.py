"""The host dump's binding (``host_binding.HostBinding``): onnxruntime writes every exposed output into the reused
buffer bound to it, also where a kernel could hand its input's buffer on (Identity, Reshape, Flatten, an outer
input passed through an ``If`` branch) — so the arrays a step returns are that step's tensors, never a previous
step's left in a buffer ORT did not write. Issue 31 item 4 asked whether the planner honours the binding for every
tensor; these tests keep asking it of each onnxruntime the lock brings."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qconsist.inference.host_binding import SLOTS, HostBinding
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session


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
