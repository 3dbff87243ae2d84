"""The origin rule as a proof (issue 27, item 1): a node is an origin only where every input it reads was
observed and is identical; an unobserved input is unknown, never identical, and the finding is a span."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qconsist.compare import UNOBSERVED, ObservedGraph, ObservedNode, origins
from qconsist.inference.graphmap import implicit_inputs, node_reads

# x -> conv (c) -> relu (r) -> q (y); conv reads constant w
GRAPH = ObservedGraph((
    ObservedNode("conv", "conv", "Conv", ("x",), ("c",), ("w",)),
    ObservedNode("relu", "relu", "Relu", ("c",), ("r",)),
    ObservedNode("q", "q", "QuantizeLinear", ("r",), ("y",), ("scale",)),
), ("y",))


def test_an_input_missing_from_the_table_is_unobserved_never_identical():
    # the table lacks r (fused away): q's input column is UNOBSERVED and q is never an origin
    columns = GRAPH.columns(["c", "y"])
    assert columns == [([], [0]), ([0], []), ([UNOBSERVED], [1])]
    differ = np.array([[False, True], [True, True]])
    assert origins(differ, columns).tolist() == [[False, False, False], [True, False, False]]


def test_graph_inputs_are_fed_to_both_sides_and_need_no_column():
    assert GRAPH.columns(["c", "r", "y"])[0] == ([], [0])
    assert origins(np.array([[True, True, True]]), GRAPH.columns(["c", "r", "y"])).tolist() == [[True, False, False]]


def test_a_proof_through_an_unobserved_tensor_is_a_span_listing_every_node_inside():
    proof = GRAPH.proof("y", {"c", "y"})
    assert proof.span and proof.unobserved == ("r",)
    assert proof.inputs == ("c",) and proof.given == () and proof.constants == ("scale",)
    assert [GRAPH.nodes[i].name for i in proof.nodes] == ["relu", "q"]
    direct = GRAPH.proof("y", {"c", "r", "y"})
    assert not direct.span and direct.inputs == ("r",) and [GRAPH.nodes[i].name for i in direct.nodes] == ["q"]
    whole = GRAPH.proof("y", {"y"})  # nothing observed before y: the span reaches the graph input and the constants
    assert whole.given == ("x",) and set(whole.constants) == {"w", "scale"} and whole.unobserved == ("r", "c")


def test_the_outer_tensors_a_subgraph_reads_are_inputs():
    then = helper.make_graph([helper.make_node("Relu", ["act"], ["t"]), helper.make_node("Add", ["t", "bias"], ["t2"])],
                             "then", [], [helper.make_tensor_value_info("t2", TensorProto.FLOAT, [1])])
    body = helper.make_graph([helper.make_node("Neg", ["other"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=body)
    # in the order of the node's attributes (else_branch, then_branch); t is computed inside the branch
    assert implicit_inputs(node) == ["other", "act", "bias"]
    assert node_reads(node) == ["cond", "other", "act", "bias"]
    loop_body = helper.make_graph([helper.make_node("Add", ["v", "outer"], ["v2"]), helper.make_node("Identity", ["c"], ["c2"])],
                                  "body", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("i", "c", "v")],
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("c2", "v2")])
    loop = helper.make_node("Loop", ["n", "", "v0"], ["vn"], body=loop_body)
    assert implicit_inputs(loop) == ["outer"]
