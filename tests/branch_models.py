"""Models built in code whose work happens inside ``If`` branches (the dump observes inside them): seeded.

``gated_model``: x [1, 8] -> ReduceSum 'total' -> Greater than the constant ``threshold`` 'positive' -> ``If`` 'gate':

* then: Mul by the outer constant ``w`` 'then_mul' -> ``If`` 'inner' on the outer tensor ``wide`` (then: Mul by the
  outer constant ``w2`` 'inner_mul' -> Relu 'inner_relu'; else: Neg 'inner_neg') -> Add 'then_add' (reads the outer
  tensor ``x`` too);
* else: Neg 'else_neg' -> Add the outer constant ``bias`` 'else_add',

then Add 'after' of the ``If``'s output and ``scaled`` (main graph: x·3) -> y. ``wide``: ReduceMax(x) > 1.

Two copies that differ in one outer constant have the same structure (only initializer values differ): ``w`` changes
the then branch's first node, ``w2`` the nested branch's Mul, ``threshold`` the condition (the runs then take
different branches)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 8


# what a dump of gated_model records inside its branches: name, label, branches it needs
GATED_BRANCH_TENSORS = [
    ("gate/then/then_scaled", "gate/then/then_mul", ["gate/then"]),
    ("gate/then/inner/then/inner_m", "gate/then/inner/then/inner_mul", ["gate/then", "gate/then/inner/then"]),
    ("gate/then/inner/then/inner_r", "gate/then/inner/then/inner_relu", ["gate/then", "gate/then/inner/then"]),
    ("gate/then/inner/else/inner_n", "gate/then/inner/else/inner_neg", ["gate/then", "gate/then/inner/else"]),
    ("gate/then/inner/then_taken", "gate/then/inner/then_taken", ["gate/then"]),
    ("gate/then/nested", "gate/then/inner", ["gate/then"]),
    ("gate/then/then_out", "gate/then/then_add", ["gate/then"]),
    ("gate/else/negated", "gate/else/else_neg", ["gate/else"]),
    ("gate/else/else_out", "gate/else/else_add", ["gate/else"]),
    ("gate/then_taken", "gate/then_taken", []),
]


def gated_model(path: Path, w: float = 0.7, w2: float = 1.3, threshold: float = 0.0, bias: float = 0.25) -> Path:
    rng = np.random.default_rng(11)
    weights = rng.uniform(0.5, 1.5, WIDTH).astype(np.float32)
    inits = [
        numpy_helper.from_array((weights * np.float32(w)).astype(np.float32), "w"),
        numpy_helper.from_array(np.full(WIDTH, w2, np.float32), "w2"),
        numpy_helper.from_array(np.array(threshold, np.float32), "threshold"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.full(WIDTH, bias, np.float32), "bias"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three"),
    ]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, WIDTH])  # noqa: E731
    inner_then = helper.make_graph([helper.make_node("Mul", ["then_scaled", "w2"], ["inner_m"], name="inner_mul"),
                                    helper.make_node("Relu", ["inner_m"], ["inner_r"], name="inner_relu")],
                                   "inner_then", [], [value("inner_r")])
    inner_else = helper.make_graph([helper.make_node("Neg", ["then_scaled"], ["inner_n"], name="inner_neg")],
                                   "inner_else", [], [value("inner_n")])
    then = helper.make_graph([
        helper.make_node("Mul", ["x", "w"], ["then_scaled"], name="then_mul"),
        helper.make_node("If", ["wide"], ["nested"], name="inner", then_branch=inner_then, else_branch=inner_else),
        helper.make_node("Add", ["nested", "x"], ["then_out"], name="then_add"),
    ], "then", [], [value("then_out")])
    otherwise = helper.make_graph([
        helper.make_node("Neg", ["x"], ["negated"], name="else_neg"),
        helper.make_node("Add", ["negated", "bias"], ["else_out"], name="else_add"),
    ], "else", [], [value("else_out")])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "threshold"], ["cond"], name="positive"),
        helper.make_node("ReduceMax", ["x"], ["peak"], name="peak", keepdims=0),
        helper.make_node("Greater", ["peak", "one"], ["wide"], name="wide"),
        helper.make_node("Mul", ["x", "three"], ["scaled"], name="triple"),
        helper.make_node("If", ["cond"], ["gated"], name="gate", then_branch=then, else_branch=otherwise),
        helper.make_node("Add", ["gated", "scaled"], ["y"], name="after"),
    ]
    graph = helper.make_graph(nodes, path.stem, [value("x")], [value("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def gated_inputs(path: Path) -> Path:
    """Six samples [6, 8]: 0-1 sum > 0 with a peak > 1 (gate/then, inner/then), 2-3 sum > 0 with every value
    below 1 (gate/then, inner/else), 4-5 sum < 0 (gate/else); sample 2's sum is 0.4, the one a threshold of 0.5 sends
    to the else branch."""
    rng = np.random.default_rng(12)
    samples = [rng.uniform(0.2, 2.0, WIDTH), rng.uniform(0.5, 3.0, WIDTH), np.full(WIDTH, 0.05), rng.uniform(0.3, 0.9, WIDTH),
               rng.uniform(-2.0, -0.1, WIDTH), rng.uniform(-1.0, 0.5, WIDTH) - 0.6]
    arrays = np.stack([np.asarray(s, np.float32) for s in samples])
    np.save(path, arrays)
    return path


def saturating_branch_model(path: Path) -> Path:
    """``isa_models.saturating_qdq_model``'s QDQ Conv 1×1 (u8·s8 products that AVX2 without VNNI saturates) inside the
    then branch of an ``If`` 'gate' (cond: the mean of x > 0), its nodes named ``sat_*``; the else branch: a float
    Conv 'else_conv' of the same weights → Neg 'else_neg'; the If's output → Identity 'out' → y. At level all ORT fuses
    the then branch into a QLinearConv inside the branch (the QDQ constants are the branch's own initializers)."""
    from isa_models import CHANNELS_IN, CHANNELS_OUT, SIZE, saturating_qdq_model

    flat = onnx.load(str(saturating_qdq_model(path)))
    then_nodes = []
    for node in flat.graph.node:
        node.name = f"sat_{node.name}"
        then_nodes.append(node)
    weights = numpy_helper.to_array(next(i for i in flat.graph.initializer if i.name == "w_q")).astype(np.float32) / 127
    # the QDQ constants inside the branch: ORT fuses a QDQ group only where its constants are the branch's own
    then = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                             list(flat.graph.initializer))
    otherwise = helper.make_graph([helper.make_node("Conv", ["x", "w_float"], ["else_c"], name="else_conv"),
                                   helper.make_node("Neg", ["else_c"], ["else_y"], name="else_neg")], "else", [],
                                  [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", keepdims=0),
             helper.make_node("Greater", ["mean", "zero"], ["cond"], name="positive"),
             helper.make_node("If", ["cond"], ["gated"], name="gate", then_branch=then, else_branch=otherwise),
             helper.make_node("Identity", ["gated"], ["out"], name="out")]
    inits = [numpy_helper.from_array(weights, "w_float"),
                                            numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    graph = helper.make_graph(nodes, "saturating_branch",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS_IN, SIZE, SIZE])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, CHANNELS_OUT, SIZE, SIZE])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qconsist-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def saturating_branch_inputs(path: Path) -> Path:
    """``isa_models.saturating_inputs``' two samples (then branch) and the first one negated (else branch)."""
    from isa_models import saturating_inputs

    samples = np.load(saturating_inputs(path))
    np.save(path, np.concatenate([samples, -samples[:1]]))
    return path
