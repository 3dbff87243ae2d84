"""Running difference statistics: ULP distance, integer histograms, origins on a tiny graph."""

from __future__ import annotations

import numpy as np

from qconsist.gpu.comparison import ObservedGraph, ObservedNode, PairComparison, TensorStats, ulp_distance


def test_ulp_distance_of_neighbouring_floats():
    a = np.array([1.0, -1.0, 0.0, 3.5], np.float32)
    b = np.nextafter(np.nextafter(a, np.float32(np.inf)), np.float32(np.inf))
    assert ulp_distance(a, b) == 2
    assert ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32)) == 0
    half = np.array([1.0], np.float16)
    assert ulp_distance(half, np.nextafter(half, np.float16(2))) == 1


def test_integer_histogram_and_counts():
    a = np.array([0, 10, -5, 7, 100], np.int8)
    b = np.array([1, 10, -6, 3, 127], np.int8)
    stats = TensorStats("t", "int8")
    stats.add(0, a, b)
    assert stats.differing == 4 and stats.elements == 5
    assert stats.histogram == {"+1": 1, "-1": 1, "<-3": 1, ">+3": 1}
    assert stats.max_abs == 27.0
    assert stats.samples == [0]


def test_origin_is_the_node_whose_inputs_agree():
    graph = ObservedGraph((
        ObservedNode("conv", "conv", "Conv", ("x",), ("c",)),
        ObservedNode("relu", "relu", "Relu", ("c",), ("r",)),
        ObservedNode("q", "q", "QuantizeLinear", ("r",), ("y",)),
    ), ("y",))
    x = np.arange(4, dtype=np.float32)
    c = np.array([0.5, -1.0, 2.0, 3.0], np.float32)
    c2 = c.copy()
    c2[2] = np.nextafter(c2[2], np.float32(9))
    ref = {"x": x, "c": c, "r": np.maximum(c, 0), "y": np.array([[1, 0, 4, 6]], np.int8)}
    other = {"x": x, "c": c2, "r": np.maximum(c2, 0), "y": np.array([[1, 0, 7, 6]], np.int8)}
    comparison = PairComparison(graph, "a", "b")
    comparison.add(0, ref, other)
    comparison.add_identical(1)
    result = comparison.finish()
    assert [n.label for n in result.origins] == ["conv"]
    assert [n.label for n in result.nodes] == ["conv", "relu", "q"]
    assert result.first_node == "conv"
    assert result.origins[0].int8_downstream == 1
    assert result.int8_changed == 1
    assert result.nodes[0].tensors[0]["max_ulp"] == 1
    assert result.effect.samples == 2 and result.effect.top1_agree == 1  # arg-max moved from 3 to 2
    assert result.effect.greatest_abs == 3.0
    assert result.nodes[2].tensors[0]["histogram"] == {"+3": 1}
    assert graph.downstream(0) == [0, 1, 2]
