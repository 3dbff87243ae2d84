"""Compare two observations of one graph sample by sample, keeping only running statistics.

An observation is every node output of the graph that actually ran (ONNX Runtime's optimized graph, see
``qconsist.inference``) for one sample. ``PairComparison`` receives the two sides' arrays for a sample,
compares them at once and forgets them, so memory does not grow with the sample count.

Per tensor it keeps: differing elements k / n, the greatest absolute and relative difference, the greatest
ULP distance (floats), for integer tensors the histogram of differences, and the samples affected. A node is
an **origin** in a sample when one of its outputs differs while all its inputs are bit-identical: the kernel
itself computed differently (another algorithm, TF32), as opposed to a node that only propagates a
difference. ``finish()`` returns a ``PairResult`` (JSON-ready) with the origins, the first diverging node,
the int8 values changed downstream of each origin and the effect on the final outputs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np

from qconsist.inference.fingerprint import tensor_hash

HISTOGRAM_LIMIT = 3  # integer differences -3..3 are counted one by one, larger ones together


@dataclass(frozen=True)
class ObservedNode:
    name: str  # node of the graph that ran
    label: str  # the original node users know
    op_type: str
    inputs: tuple[str, ...]  # activation inputs (no initializers)
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


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Greatest distance in units in the last place between two float arrays of one type (0 for others).

    float16 and float32 are compared exactly through their ordered bit patterns; float64 through
    ``|a - b| / spacing(a)``."""
    if a.dtype.kind != "f" or a.size == 0:
        return 0
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return 0
    a, b = a[finite], b[finite]
    if a.dtype.itemsize in (2, 4):
        itype = np.int16 if a.dtype.itemsize == 2 else np.int32
        low = np.int64(np.iinfo(itype).min)

        def ordered(x: np.ndarray) -> np.ndarray:
            bits = x.view(itype).astype(np.int64)
            return np.where(bits < 0, low - bits, bits)

        return int(np.abs(ordered(a) - ordered(b)).max())
    with np.errstate(over="ignore", invalid="ignore"):
        return int(np.nanmax(np.abs(b.astype(np.float64) - a) / np.spacing(np.abs(a.astype(np.float64)))))


@dataclass
class TensorStats:
    """Running statistics of one tensor's differences."""

    tensor: str
    dtype: str
    elements: int = 0  # compared elements, summed over samples
    differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: int = 0
    samples: list[int] = field(default_factory=list)
    histogram: dict[str, int] = field(default_factory=dict)

    def add(self, sample: int, a: np.ndarray, b: np.ndarray) -> None:
        self.elements += a.size
        if a.shape != b.shape or a.dtype != b.dtype:
            self.differing += a.size
            self.samples.append(sample)
            self.max_abs = float("inf")
            return
        if a.dtype.kind in "iub":
            diff = b.astype(np.int64) - a.astype(np.int64)
            mask = diff != 0
            values, counts = np.unique(np.clip(diff[mask], -HISTOGRAM_LIMIT - 1, HISTOGRAM_LIMIT + 1), return_counts=True)
            for v, c in zip(values.tolist(), counts.tolist()):
                key = f"{v:+d}" if abs(v) <= HISTOGRAM_LIMIT else (f">+{HISTOGRAM_LIMIT}" if v > 0 else f"<-{HISTOGRAM_LIMIT}")
                self.histogram[key] = self.histogram.get(key, 0) + int(c)
            absdiff = np.abs(diff[mask]).astype(np.float64)
            ref = np.abs(a[mask].astype(np.float64))
        else:
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            mask = ~same
            a64, b64 = a[mask].astype(np.float64), b[mask].astype(np.float64)
            absdiff = np.abs(b64 - a64)
            absdiff[np.isnan(absdiff)] = np.inf
            ref = np.abs(a64)
            self.max_ulp = max(self.max_ulp, ulp_distance(a[mask], b[mask]))
        count = int(mask.sum())
        if count == 0:  # equal values with different bits (+0 / -0, NaN payloads)
            self.differing += int(np.count_nonzero(a.view(np.uint8) != b.view(np.uint8)) > 0)
            self.samples.append(sample)
            return
        self.differing += count
        self.samples.append(sample)
        self.max_abs = max(self.max_abs, float(absdiff.max()))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(ref > 0, absdiff / np.where(ref > 0, ref, 1.0), np.inf)
        self.max_rel = max(self.max_rel, float(rel.max()))

    @property
    def is_integer(self) -> bool:
        return np.dtype(self.dtype).kind in "iu"

    def to_json(self) -> dict:
        data = asdict(self)
        data["fraction"] = self.differing / self.elements if self.elements else 0.0
        for key in ("max_abs", "max_rel"):
            if not np.isfinite(data[key]):
                data[key] = "inf"
        return data


def _number(value: float | str) -> float:
    return float(value)


@dataclass(frozen=True)
class NodeDifference:
    """A node of the graph that ran whose output differed between the two sides."""

    node: str
    label: str
    op_type: str
    origin: bool  # its outputs differed while its inputs were bit-identical (in some sample)
    origin_samples: tuple[int, ...]
    tensors: tuple[dict, ...]  # TensorStats.to_json of its differing outputs, over every sample
    int8_downstream: int = 0  # for origins: int8/uint8 values changed in the nodes that depend on it
    origin_tensors: tuple[dict, ...] = ()  # for origins: the same statistics over its origin samples only

    def to_json(self) -> dict:
        data = asdict(self)
        data["origin_samples"] = list(self.origin_samples)
        data["tensors"] = list(self.tensors)
        data["origin_tensors"] = list(self.origin_tensors)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "NodeDifference":
        return cls(
            node=data["node"], label=data["label"], op_type=data["op_type"], origin=data["origin"],
            origin_samples=tuple(data["origin_samples"]), tensors=tuple(data["tensors"]),
            int8_downstream=data.get("int8_downstream", 0), origin_tensors=tuple(data.get("origin_tensors", ())),
        )

    @property
    def greatest_abs(self) -> float:
        return max((_number(t["max_abs"]) for t in self.tensors), default=0.0)

    @property
    def differing(self) -> int:
        return sum(t["differing"] for t in self.tensors)

    @property
    def elements(self) -> int:
        return sum(t["elements"] for t in self.tensors)

    @property
    def origin_stats(self) -> tuple[float, int, int]:
        """(greatest abs difference, differing elements, elements) over the samples where it is an origin:
        in other samples its inputs may already differ, and that is propagation, not this node."""
        tensors = self.origin_tensors or self.tensors
        return (max((_number(t["max_abs"]) for t in tensors), default=0.0),
                sum(t["differing"] for t in tensors), sum(t["elements"] for t in tensors))


@dataclass(frozen=True)
class OutputEffect:
    """What the difference does to the final outputs."""

    greatest_abs: float
    top1_agree: int  # samples whose arg-max class agrees
    samples: int
    outputs_identical: bool

    def to_json(self) -> dict:
        data = asdict(self)
        if not np.isfinite(self.greatest_abs):
            data["greatest_abs"] = "inf"
        return data

    @classmethod
    def from_json(cls, data: dict) -> "OutputEffect":
        return cls(**{**data, "greatest_abs": float(data["greatest_abs"])})


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

    def to_json(self) -> dict:
        return {
            "reference": self.reference, "other": self.other, "samples": self.samples,
            "tensors_compared": self.tensors_compared, "identical": self.identical, "first_node": self.first_node,
            "nodes": [n.to_json() for n in self.nodes], "int8_changed": self.int8_changed,
            "effect": self.effect.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "PairResult":
        return cls(
            reference=data["reference"], other=data["other"], samples=data["samples"],
            tensors_compared=data["tensors_compared"], identical=data["identical"], first_node=data["first_node"],
            nodes=tuple(NodeDifference.from_json(n) for n in data["nodes"]), int8_changed=data["int8_changed"],
            effect=OutputEffect.from_json(data["effect"]),
        )


class PairComparison:
    """Accumulates the comparison of side ``reference`` and side ``other`` over samples."""

    def __init__(self, graph: ObservedGraph, reference: str, other: str) -> None:
        self.graph = graph
        self.reference = reference
        self.other = other
        self._stats: dict[str, TensorStats] = {}
        self._origin_samples: dict[int, list[int]] = defaultdict(list)
        self._origin_stats: dict[tuple[int, str], TensorStats] = {}
        self._samples = 0
        self._compared: set[str] = set()
        self._top1_agree = 0
        self._output_abs = 0.0
        self._outputs_identical = True

    def add_identical(self, sample: int) -> None:
        """Count a sample whose tensors were all bit-identical (known from their hashes)."""
        self._samples += 1
        self._top1_agree += 1

    def add(self, sample: int, reference: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray],
            hashes: tuple[Mapping[str, int], Mapping[str, int]] | None = None) -> None:
        """Compare one sample. ``hashes`` may carry precomputed xxh3 hashes of both sides' tensors."""
        self._samples += 1
        differs: dict[str, bool] = {}
        for name, a in reference.items():
            b = other.get(name)
            if b is None:
                continue
            self._compared.add(name)
            if hashes is not None and name in hashes[0] and name in hashes[1]:
                same = hashes[0][name] == hashes[1][name] and a.shape == b.shape and a.dtype == b.dtype
            else:
                same = a.shape == b.shape and a.dtype == b.dtype and tensor_hash(a) == tensor_hash(b)
            differs[name] = not same
            if not same:
                stats = self._stats.get(name)
                if stats is None:
                    stats = self._stats[name] = TensorStats(name, a.dtype.name)
                stats.add(sample, a, b)
        for index, node in enumerate(self.graph.nodes):
            if any(differs.get(o, False) for o in node.outputs) and not any(differs.get(i, False) for i in node.inputs):
                self._origin_samples[index].append(sample)
                for out in node.outputs:
                    if differs.get(out, False):
                        key = (index, out)
                        if key not in self._origin_stats:
                            self._origin_stats[key] = TensorStats(out, reference[out].dtype.name)
                        self._origin_stats[key].add(sample, reference[out], other[out])
        self._add_outputs(reference, other, differs)

    def _add_outputs(self, reference: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray],
                     differs: dict[str, bool]) -> None:
        agree = True
        for name in self.graph.outputs:
            if name not in reference or name not in other:
                continue
            a, b = reference[name], other[name]
            if differs.get(name, False):
                self._outputs_identical = False
                if a.shape == b.shape and a.size:
                    delta = np.abs(b.astype(np.float64) - a.astype(np.float64))
                    self._output_abs = max(self._output_abs, float(np.nan_to_num(delta, nan=np.inf).max()))
            if name == self.graph.outputs[0] and a.size > 1 and a.shape == b.shape:
                agree = bool(np.array_equal(np.argmax(a.reshape(a.shape[0] if a.ndim > 1 else 1, -1), axis=-1),
                                            np.argmax(b.reshape(b.shape[0] if b.ndim > 1 else 1, -1), axis=-1)))
        self._top1_agree += int(agree)

    def finish(self) -> PairResult:
        nodes: list[NodeDifference] = []
        int8_by_tensor = {name: s.differing for name, s in self._stats.items() if np.dtype(s.dtype).itemsize == 1
                          and s.is_integer}
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
                origin_samples=origin_samples, tensors=tuple(s.to_json() for s in stats), int8_downstream=downstream,
                origin_tensors=tuple(s.to_json() for s in origin_stats),
            ))
        effect = OutputEffect(self._output_abs, self._top1_agree, self._samples, self._outputs_identical)
        return PairResult(
            reference=self.reference, other=self.other, samples=self._samples, tensors_compared=len(self._compared) or sum(len(n.outputs) for n in self.graph.nodes),
            identical=not self._stats, first_node=first, nodes=tuple(nodes),
            int8_changed=sum(int8_by_tensor.values()), effect=effect,
        )


def graph_from_nodes(nodes: Sequence[ObservedNode], outputs: Sequence[str]) -> ObservedGraph:
    return ObservedGraph(tuple(nodes), tuple(outputs))
