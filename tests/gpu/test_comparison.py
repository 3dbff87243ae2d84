"""locate's pair comparison on a tiny graph: origins, int8 values changed downstream, the output effect."""

from __future__ import annotations

import numpy as np

from qconsist.compare import ObservedGraph, ObservedNode
from qconsist.locate.comparison import PairComparison, PairResult
from qconsist.store.serde import loads, dumps


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
    assert result.nodes[0].tensors[0].max_ulp == 1
    assert result.effect.samples == 2 and result.effect.top1_agree == 1  # arg-max moved from 3 to 2
    assert result.effect.greatest_abs == 3.0
    assert result.nodes[2].tensors[0].histogram == {"+3": 1}
    assert graph.downstream(0) == [0, 1, 2]
    assert PairResult.from_json(loads(dumps(result))) == result
