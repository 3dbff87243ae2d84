"""The origin rule, defined once: a node is an **origin** in a sample when one of its outputs differs while
every one of its inputs is bit-identical — the node itself computed differently (another kernel, TF32,
another rounding), as opposed to a node that only propagates a difference it was given.

``ObservedGraph`` is the graph a comparison walks (topological order, each node labelled with the original
node users know); ``origins`` applies the rule to a whole table of per-sample "differs" flags at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class ObservedNode:
    name: str  # node of the graph that ran (or the compared tensor, for a dump's graph)
    label: str  # the original node users know
    op_type: str
    inputs: tuple[str, ...]  # compared activation inputs (no initializers)
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class ObservedGraph:
    """Topologically ordered nodes of the graph that ran, and its final outputs."""

    nodes: tuple[ObservedNode, ...]
    outputs: tuple[str, ...]

    def downstream(self, start: int) -> list[int]:
        """Indices of the nodes that depend on node ``start`` (itself included)."""
        tainted = set(self.nodes[start].outputs)
        found = [start]
        for index in range(start + 1, len(self.nodes)):
            node = self.nodes[index]
            if tainted.intersection(node.inputs):
                tainted.update(node.outputs)
                found.append(index)
        return found

    def columns(self, tensors: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Each node's (input columns, output columns) in a table whose columns are ``tensors``."""
        position = {name: i for i, name in enumerate(tensors)}
        return [([position[t] for t in node.inputs if t in position], [position[t] for t in node.outputs if t in position])
                for node in self.nodes]


def origins(differ: np.ndarray, nodes: Sequence[tuple[Sequence[int], Sequence[int]]]) -> np.ndarray:
    """``differ``: bool ``[samples, tensors]``, whether each tensor differs in each sample; ``nodes``: each
    node's (input columns, output columns). Returns bool ``[samples, nodes]``: where each node is an origin."""
    differ = np.asarray(differ, dtype=bool)
    if differ.ndim == 1:
        differ = differ[np.newaxis, :]
    found = np.zeros((differ.shape[0], len(nodes)), dtype=bool)
    for index, (inputs, outputs) in enumerate(nodes):
        if not outputs:
            continue
        out = differ[:, list(outputs)].any(axis=1)
        clean = ~differ[:, list(inputs)].any(axis=1) if inputs else np.ones(differ.shape[0], dtype=bool)
        found[:, index] = out & clean
    return found
