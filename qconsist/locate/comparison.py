"""Compare two observations of one graph sample by sample, keeping only running statistics.

An observation is every node output of the graph that actually ran (ONNX Runtime's optimized graph, see
``qconsist.inference``) for one sample. ``PairComparison`` receives the two sides' arrays for a sample,
compares them at once and forgets them, so memory does not grow with the sample count. The statistics,
the origin rule and the output effect are the comparison kernel's (``qconsist.compare``); this module adds
what locate reports per node: the int8 values changed downstream of each origin.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from qconsist.compare import ObservedGraph, OutputEffect, TensorStats, origins
from qconsist.inference.fingerprint import tensor_hash
from qconsist.store.serde import serialized


@serialized
@dataclass(frozen=True)
class NodeDifference:
    """A node of the graph that ran whose output differed between the two sides."""

    node: str
    label: str
    op_type: str
    origin: bool  # its outputs differed while its inputs were bit-identical (in some sample)
    origin_samples: tuple[int, ...]
    tensors: tuple[TensorStats, ...]  # its differing outputs, over every sample
    int8_downstream: int = 0  # for origins: int8/uint8 values changed in the nodes that depend on it
    origin_tensors: tuple[TensorStats, ...] = ()  # for origins: the same statistics over its origin samples only

    @property
    def greatest_abs(self) -> float:
        return max((t.max_abs for t in self.tensors), default=0.0)

    @property
    def differing(self) -> int:
        return sum(t.differing for t in self.tensors)

    @property
    def elements(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def origin_stats(self) -> tuple[float, int, int]:
        """(greatest abs difference, differing elements, elements) over the samples where it is an origin:
        in other samples its inputs may already differ, and that is propagation, not this node."""
        tensors = self.origin_tensors or self.tensors
        return (max((t.max_abs for t in tensors), default=0.0), sum(t.differing for t in tensors),
                sum(t.elements for t in tensors))


@serialized
@dataclass(frozen=True)
class PairResult:
    """Everything one comparison found. ``identical`` when no observed tensor differed in any sample."""

    reference: str
    other: str
    samples: int
    tensors_compared: int
    identical: bool
    first_node: str | None  # label of the first diverging node, in topological order
    nodes: tuple[NodeDifference, ...]  # differing nodes in topological order
    int8_changed: int  # int8/uint8 values that differ, over all tensors and samples
    effect: OutputEffect

    @property
    def origins(self) -> tuple[NodeDifference, ...]:
        return tuple(n for n in self.nodes if n.origin)


def _is_int8(stats: TensorStats) -> bool:
    return np.dtype(stats.dtype).itemsize == 1 and np.dtype(stats.dtype).kind in "iu"


class PairComparison:
    """Accumulates the comparison of side ``reference`` and side ``other`` over samples."""

    def __init__(self, graph: ObservedGraph, reference: str, other: str) -> None:
        self.graph = graph
        self.reference = reference
        self.other = other
        self._names = [o for node in graph.nodes for o in node.outputs]
        self._columns = graph.columns(self._names)
        self._stats: dict[str, TensorStats] = {}
        self._origin_samples: dict[int, list[int]] = defaultdict(list)
        self._origin_stats: dict[tuple[int, str], TensorStats] = {}
        self._compared: set[str] = set()
        self._effect = OutputEffect()

    def add_identical(self, sample: int) -> None:
        """Count a sample whose tensors were all bit-identical (known from their hashes)."""
        self._effect.add_identical()

    def add(self, sample: int, reference: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray],
            hashes: tuple[Mapping[str, int], Mapping[str, int]] | None = None) -> None:
        """Compare one sample. ``hashes`` may carry precomputed hashes of both sides' tensors."""
        differs = np.zeros(len(self._names), dtype=bool)
        missing = np.zeros(len(self._names), dtype=bool)  # not observed on a side in this sample: unknown
        for column, name in enumerate(self._names):
            a, b = reference.get(name), other.get(name)
            if a is None or b is None:
                missing[column] = True
                continue
            self._compared.add(name)
            if hashes is not None and name in hashes[0] and name in hashes[1]:
                same = hashes[0][name] == hashes[1][name] and a.shape == b.shape and a.dtype == b.dtype
            else:
                same = a.shape == b.shape and a.dtype == b.dtype and tensor_hash(a) == tensor_hash(b)
            if not same:
                differs[column] = True
                self._stats.setdefault(name, TensorStats(name)).add(sample, a, b)
        for index in np.flatnonzero(origins(differs, self._columns)[0]):
            if missing[[c for c in self._columns[index][0]]].any():
                continue  # an input not observed in this sample: never an origin (compare.origin)
            self._origin_samples[int(index)].append(sample)
            for out in self.graph.nodes[index].outputs:
                if differs[self._names.index(out)]:
                    self._origin_stats.setdefault((int(index), out), TensorStats(out)).add(sample, reference[out], other[out])
        outputs = [n for n in self.graph.outputs if n in reference and n in other]
        self._effect.add(self._effect.samples, [reference[n] for n in outputs], [other[n] for n in outputs])

    def finish(self) -> PairResult:
        nodes: list[NodeDifference] = []
        int8_by_tensor = {name: s.differing for name, s in self._stats.items() if _is_int8(s)}
        first = None
        for index, node in enumerate(self.graph.nodes):
            stats = [self._stats[o] for o in node.outputs if o in self._stats]
            if not stats:
                continue
            if first is None:
                first = node.label
            origin_samples = tuple(self._origin_samples.get(index, ()))
            downstream = 0
            if origin_samples:
                for d in self.graph.downstream(index):
                    downstream += sum(int8_by_tensor.get(o, 0) for o in self.graph.nodes[d].outputs)
            origin_stats = [self._origin_stats[(index, o)] for o in node.outputs if (index, o) in self._origin_stats]
            nodes.append(NodeDifference(
                node=node.name, label=node.label, op_type=node.op_type, origin=bool(origin_samples),
                origin_samples=origin_samples, tensors=tuple(stats), int8_downstream=downstream,
                origin_tensors=tuple(origin_stats),
            ))
        return PairResult(
            reference=self.reference, other=self.other, samples=self._effect.samples,
            tensors_compared=len(self._compared) or len(self._names), identical=not self._stats, first_node=first,
            nodes=tuple(nodes), int8_changed=sum(int8_by_tensor.values()), effect=self._effect,
        )
