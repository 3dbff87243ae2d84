"""The origin rule, defined once, as a proof.

A node is an **origin** in a sample when one of its outputs differs while *every* input it reads was observed
in both runs and is identical: its activation inputs (compared bit for bit), its constants (compared by value)
and the outer tensors its subgraphs read (``If``/``Loop``/``Scan`` bodies: implicit inputs). The node itself
computed differently (another kernel, TF32, another rounding), as opposed to a node that only propagates a
difference it was given. An input that was not observed in both runs (fused away by ONNX Runtime, internal to
a kernel, of a layout the graph does not establish) is *unknown*, never identical: the finding is then a
**span** — the nearest observed tensors upstream are identical, the span's output differs, and every node
inside it is listed: the difference starts somewhere among them.

``ObservedGraph`` is the graph a comparison walks (topological order, each node labelled with the original node
users know); ``ObservedGraph.proof`` finds what a tensor's value rests on (``Proof``); ``origins`` applies the
rule to a whole table of per-sample "differs" flags at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Collection, Sequence

import numpy as np

UNOBSERVED = -1  # the column of an input that was not observed: the rule never holds across it


@dataclass(frozen=True)
class ObservedNode:
    name: str  # node of the graph that ran (or the compared tensor, for a dump's graph)
    label: str  # the original node users know
    op_type: str
    inputs: tuple[str, ...]  # activation inputs it reads, with the outer tensors its subgraphs read (no constants)
    outputs: tuple[str, ...]
    constants: tuple[str, ...] = ()  # constant inputs (initializers, Constant nodes): compared by value


@dataclass(frozen=True)
class Proof:
    """What the value of one tensor rests on: the nearest tensors upstream that were observed (``inputs``,
    compared bit for bit), the graph inputs (``given``: fed from the same input set) and the constants
    (``constants``, compared by value), and the nodes computing it from them (``nodes``: its producer and the
    producers of the unobserved tensors in between, in topological order). With no unobserved tensor the proof is the node's
    own inputs (an origin); otherwise it is a span, and ``unobserved`` names the tensors it could not see."""

    tensor: str
    inputs: tuple[str, ...] = ()
    given: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    nodes: tuple[int, ...] = ()
    unobserved: tuple[str, ...] = ()

    @property
    def span(self) -> bool:
        return bool(self.unobserved)


@dataclass(frozen=True)
class ObservedGraph:
    """Topologically ordered nodes of the graph that ran, and its final outputs. Tensors no node produces are
    the graph's inputs, fed to both sides from the same sample."""

    nodes: tuple[ObservedNode, ...]
    outputs: tuple[str, ...]

    @cached_property
    def producer(self) -> dict[str, int]:
        return {out: index for index, node in enumerate(self.nodes) for out in node.outputs}

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

    def proof(self, tensor: str, observed: Collection[str]) -> Proof:
        """What ``tensor`` (a node output) is computed from: its producer's inputs, and through every input that
        is not in ``observed`` (a tensor some node produces that the comparison has no value of), that input's
        producer's inputs, up to observed tensors, graph inputs and constants."""
        inputs: dict[str, None] = {}
        given: dict[str, None] = {}
        constants: dict[str, None] = {}
        unobserved: dict[str, None] = {}
        nodes: list[int] = []
        todo = [tensor]
        seen: set[str] = set()
        while todo:
            name = todo.pop(0)
            index = self.producer.get(name)
            if index is None or index in nodes:
                continue
            nodes.append(index)
            node = self.nodes[index]
            constants.update(dict.fromkeys(node.constants))
            for read in node.inputs:
                if read in seen:
                    continue
                seen.add(read)
                if read in observed:
                    inputs[read] = None
                elif read not in self.producer:
                    given[read] = None
                else:
                    unobserved[read] = None
                    todo.append(read)
        return Proof(tensor, tuple(inputs), tuple(given), tuple(constants), tuple(sorted(nodes)), tuple(unobserved))

    def columns(self, tensors: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Each node's (input columns, output columns) in a table whose columns are ``tensors``: a graph input
        (fed to both sides) has no column; an input some node produces that the table lacks is ``UNOBSERVED``,
        so the node is never called an origin."""
        position = {name: i for i, name in enumerate(tensors)}
        found = []
        for node in self.nodes:
            inputs = [position.get(t, UNOBSERVED) for t in node.inputs if t in position or t in self.producer]
            found.append((inputs, [position[t] for t in node.outputs if t in position]))
        return found


def origins(differ: np.ndarray, nodes: Sequence[tuple[Sequence[int], Sequence[int]]]) -> np.ndarray:
    """``differ``: bool ``[samples, tensors]``, whether each tensor differs in each sample; ``nodes``: each
    node's (input columns, output columns), an input column ``UNOBSERVED`` where that input was not observed.
    Returns bool ``[samples, nodes]``: where an output of the node differs while every input was observed and
    is identical (a node with an unobserved input: never)."""
    differ = np.asarray(differ, dtype=bool)
    if differ.ndim == 1:
        differ = differ[np.newaxis, :]
    found = np.zeros((differ.shape[0], len(nodes)), dtype=bool)
    for index, (inputs, outputs) in enumerate(nodes):
        if not outputs or any(i < 0 for i in inputs):
            continue
        out = differ[:, list(outputs)].any(axis=1)
        clean = ~differ[:, list(inputs)].any(axis=1) if inputs else np.ones(differ.shape[0], dtype=bool)
        found[:, index] = out & clean
    return found
