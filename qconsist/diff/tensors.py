"""Tensor by tensor, in topological order: the first diverging node, every origin node and every span.

Two dumps are compared in the optimized graph's own terms when ORT ran the same graph structure in both
runs (``space = "optimized"``), else through the original model's tensors both dumps map to
(``space = "original"``, e.g. optimization levels that fuse differently). The rule is the comparison kernel's
(``qconsist.compare.origin``): an **origin** is a node whose output differs in some sample while every input
it reads was observed in both runs and is identical in that sample — activations bit for bit, graph inputs by
the input set's digest, constants by value (whatever shape ORT stored them in; constants that differ are
listed: the difference enters there). Where an input was not observed (fused away, internal to a kernel), the
finding is a **span**: its nearest observed inputs upstream are identical, its output differs, and every node
inside it is listed. Other diverging nodes only propagate a difference. Each finding carries its evidence:
what was compared, how, and what was not observed.

A tensor ORT holds in NCHWc channel blocks (``inference/layout.py``) is compared when both dumps recorded it in
NCHW (its values, whatever block each processor used), or both as ORT held it in blocks of the same size; otherwise
(blocks of 16 against blocks of 8, or a dump written before the blocks were recorded) it is not comparable: it is
listed in ``blocked_apart`` and the origin rule walks across it as an unobserved tensor. A filter ORT reordered for
an NCHWc Conv is compared by value in OIHW (``layout.unblock_filter``) when the two dumps' blocks differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.compare import UNOBSERVED, ObservedGraph, ObservedNode, Proof, TensorStats, origins
from qconsist.compare.tolerance import Tolerance
from qconsist.errors import RunStoreError
from qconsist.inference.branches import flatten, marker
from qconsist.inference.fingerprint import DTYPES, check_hash_functions
from qconsist.inference.graphmap import TensorOrigin, node_names, node_reads, op_name, topological_order
from qconsist.inference.layout import nchwc_filters, unblock_filter
from qconsist.inference.reader import LoadedDump
from qconsist.onnxfile import read_onnx
from qconsist.store.serde import serialized

MAX_ELEMENT_NODES = 64  # element statistics for origins, the first node and up to this many others
SAMPLES_KEPT = 1000  # sample indices listed per node (all are counted): a diff of 50,000 samples stays small


def _counted(data: dict[str, Any]) -> dict[str, Any]:
    """Diffs recorded before the counts: every sample and origin sample listed; before spans: an origin's
    finding is "origin" (its evidence was not recorded)."""
    return {"count": len(data["samples"]), "origin_count": len(data["origin_samples"]),
            "finding": "origin" if data.get("origin") else "", **data}


@serialized(upgrade=_counted)
@dataclass
class TensorDiff:
    key: str  # tensor compared (optimized or original name)
    label: str  # original node users know
    op_a: str
    op_b: str
    covers: list[str]
    samples: list[int]  # samples where it differs
    origin: bool
    origin_samples: list[int]
    initializers_changed: list[str]
    summary: dict[str, Any]  # fingerprints (min, max, mean) of both runs in the first differing sample
    elements: TensorStats | None = None  # element statistics, where both runs kept the raw tensors
    tolerance: str = ""  # with a tolerance: beyond | within | unknown (no raw tensors, fingerprints inconclusive)
    count: int = 0  # samples where it differs (``samples`` lists the first SAMPLES_KEPT)
    origin_count: int = 0  # samples where it is an origin or a span (``origin_samples`` lists the first SAMPLES_KEPT)
    # the evidence of an origin or a span (empty for a node that propagates a difference):
    finding: str = ""  # "origin" | "span" | "" (propagates, or a record written before spans)
    inputs: list[str] = field(default_factory=list)  # observed tensors it rests on, compared bit for bit (fingerprints)
    given: list[str] = field(default_factory=list)  # graph inputs it rests on: the same input set (digest)
    constants: list[str] = field(default_factory=list)  # constants it rests on, compared by value
    span: list[str] = field(default_factory=list)  # a span: the nodes inside it, in topological order
    unobserved: list[str] = field(default_factory=list)  # a span: the tensors inside it observed in neither or one run

    @property
    def is_span(self) -> bool:
        return self.finding == "span"

    def evidence(self) -> str:
        """What the finding rests on, in words: what was compared, how, and what was not observed."""
        parts = []
        if self.inputs:
            parts.append(f"{len(self.inputs)} observed input(s) bit-identical ({', '.join(self.inputs[:4])}"
                         f"{', ...' if len(self.inputs) > 4 else ''})")
        if self.given:
            parts.append(f"graph input(s) {', '.join(self.given)} from the same input set")
        same = [c for c in self.constants if c not in self.initializers_changed]
        if same:
            parts.append(f"{len(same)} constant(s) identical by value")
        if self.initializers_changed:
            parts.append(f"constant(s) differ: {', '.join(self.initializers_changed)}")
        return "; ".join(parts) or "no input"

    @property
    def beyond(self) -> bool:
        """Differs by more than the tolerance (exact mode: differs), or cannot be shown not to."""
        return self.tolerance in ("", "beyond", "unknown")


@dataclass
class SampleTrace:
    """Where one sample's tensors diverge: the first diverging node and the origins in that sample."""

    sample: int
    first: str | None
    origins: list[str] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)


@dataclass
class TensorComparison:
    space: str
    compared: int
    not_compared: int
    samples: int
    nodes: list[TensorDiff] = field(default_factory=list)  # diverging ones, topological order
    raw_missing: list[str] = field(default_factory=list)  # keys whose element stats need raw tensors
    tolerance: Tolerance = field(default_factory=Tolerance)
    layout_unknown: list[str] = field(default_factory=list)  # original-graph comparisons: tensors whose layout ORT's graph does not establish
    traces: list[SampleTrace] = field(default_factory=list)  # the samples asked about (``focus``)
    # NCHWc-blocked tensors not compared: held in blocks of different sizes (or of a size a dump did not record) and
    # not both recorded in NCHW; the origin rule treats them as unobserved
    blocked_apart: list[str] = field(default_factory=list)
    # If nodes whose runs took different branches: {"node", "count", "samples", "a", "b"} (the branch each run took in
    # the first such sample); the branches' tensors are not compared in those samples, the condition differs upstream
    branches_apart: list[dict[str, Any]] = field(default_factory=list)
    # why the tensors inside If branches one or both dumps recorded were not compared ("" none, or compared)
    branches_unobserved: str = ""

    @property
    def first(self) -> TensorDiff | None:
        return self.nodes[0] if self.nodes else None

    @property
    def beyond(self) -> list[TensorDiff]:
        """Nodes that differ by more than the tolerance, or cannot be shown not to (all diverging nodes when exact)."""
        return [n for n in self.nodes if n.beyond]

    @property
    def origins(self) -> list[TensorDiff]:
        """Proven origins: every input they read observed and identical."""
        return [n for n in self.nodes if n.origin]

    @property
    def spans(self) -> list[TensorDiff]:
        """Spans: identical observed inputs upstream, a differing output, unobserved tensors in between."""
        return [n for n in self.nodes if n.is_span]

    def to_json(self) -> dict[str, Any]:
        return {
            "space": self.space, "compared": self.compared, "not_compared": self.not_compared,
            "samples": self.samples, "first": self.first.label if self.first else None,
            "origins": [n.label for n in self.origins], "spans": [n.label for n in self.spans],
            "nodes": [n.to_json() for n in self.nodes],
            "raw_missing": self.raw_missing, "tolerance": self.tolerance.to_json(),
            "beyond": [n.label for n in self.beyond], "layout_unknown": self.layout_unknown,
            "traces": [t.__dict__ for t in self.traces], "blocked_apart": self.blocked_apart,
            "branches_apart": self.branches_apart, "branches_unobserved": self.branches_unobserved,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TensorComparison":
        return cls(
            space=data["space"], compared=data["compared"], not_compared=data["not_compared"],
            samples=data["samples"], nodes=[TensorDiff.from_json(n) for n in data["nodes"]],
            raw_missing=data["raw_missing"],
            tolerance=Tolerance.from_json(data["tolerance"]) if isinstance(data.get("tolerance"), dict) else Tolerance(),
            layout_unknown=list(data.get("layout_unknown", [])),
            traces=[SampleTrace(**t) for t in data.get("traces", [])],
            blocked_apart=list(data.get("blocked_apart", [])),
            branches_apart=list(data.get("branches_apart", [])),
            branches_unobserved=str(data.get("branches_unobserved", "")),
        )


def _load_model(path: Path, what: str) -> onnx.ModelProto:
    return read_onnx(path, external_data=True, what=what, error=RunStoreError)


def _constants(model: onnx.ModelProto, branches: bool = False) -> dict[str, np.ndarray]:
    """The graph's constants by name: initializers and the outputs of Constant nodes (``branches``: those of its ``If``
    branches too, by path)."""
    if branches:
        return {name: numpy_helper.to_array(value) for name, value in flatten(model.graph).constants.items()}
    found = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.domain in ("", "ai.onnx"):
            value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if value is not None:
                found[node.output[0]] = numpy_helper.to_array(value)
    return found


def same_value(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Two constants hold the same values: the same element type and bytes, and the same shape once axes of
    size 1 are dropped (ORT stores a per-channel constant as (1, 1, 1, C) where the model has (1, C, 1, 1))."""
    if a is None or b is None:
        return False
    return a.dtype == b.dtype and _squeezed(a.shape) == _squeezed(b.shape) and a.tobytes() == b.tobytes()


def blocks_comparable(a: TensorOrigin, b: TensorOrigin, block_a: int, block_b: int) -> bool:
    """Whether two dumps' records of one tensor compare by value: neither is NCHWc-blocked (as every tensor of a dump
    written before blocks were recorded), both were recorded in NCHW, or both as ORT held them in blocks of the same
    recorded size."""
    if not a.blocked and not b.blocked:
        return True
    if not (a.blocked and b.blocked):
        return False
    if a.channels and b.channels:
        return True
    return not a.channels and not b.channels and block_a > 0 and block_a == block_b


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape if d != 1)


def space_graph(model: onnx.ModelProto, branches: bool = False) -> ObservedGraph:
    """The graph tensors are compared in (the original model or ORT's optimized graph) as the origin rule walks
    it: every node in topological order with every tensor it reads — activations, the outer tensors its
    subgraphs read, and its constants apart. ``branches``: the nodes inside its ``If`` branches as well, under their
    paths (``branches.flatten``: a node inside a branch also reads the condition of every ``If`` it lies in, an
    ``If`` reads its branches' outputs and produces its marker), for dumps that observed inside them."""
    graph = model.graph
    if branches:
        flat = flatten(graph)
        return ObservedGraph(tuple(ObservedNode(
            name=n.name, label=n.name, op_type=n.op_type, inputs=tuple(r for r in n.reads if r not in flat.constants),
            outputs=n.outputs, constants=tuple(r for r in n.reads if r in flat.constants)) for n in flat.nodes),
            tuple(o.name for o in graph.output))
    constants = {i.name for i in graph.initializer} | {
        n.output[0] for n in graph.node if n.op_type == "Constant" and n.output and n.domain in ("", "ai.onnx")}
    names = node_names(graph)
    order = topological_order(graph)
    nodes = []
    for index in order:
        node = graph.node[index]
        reads = node_reads(node)
        if node.op_type == "Constant":
            reads = []
        nodes.append(ObservedNode(
            name=names[index], label=names[index], op_type=op_name(node),
            inputs=tuple(i for i in reads if i not in constants), outputs=tuple(o for o in node.output if o),
            constants=tuple(i for i in reads if i in constants)))
    return ObservedGraph(tuple(nodes), tuple(o.name for o in graph.output))


def tensor_keys(dump: LoadedDump, space: str) -> dict[str, int]:
    """The keys a dump's tensors are compared by in ``space`` (their own names, or the original tensors they
    hold), each with its first column."""
    keys: dict[str, int] = {}
    for column, tensor in enumerate(dump.tensors):
        key = tensor.name if space == "optimized" else tensor.original
        if key is not None and key not in keys:
            keys[key] = column
    return keys


class _Bits:
    """A ``samples × columns`` table of flags, one bit each (packed along the samples): what differs, where a
    node is an origin. 50,000 samples × 416 tensors hold 2.6 MB."""

    def __init__(self, samples: int, columns: int) -> None:
        self.samples = samples
        self.packed = np.zeros(((samples + 7) // 8, columns), dtype=np.uint8)

    def put(self, start: int, block: np.ndarray) -> None:
        """The flags of samples ``start`` onwards (``start`` a multiple of 8)."""
        packed = np.packbits(block, axis=0)
        self.packed[start // 8:start // 8 + packed.shape[0]] = packed

    def column(self, column: int) -> np.ndarray:
        """The samples where ``column`` is flagged."""
        return np.flatnonzero(np.unpackbits(self.packed[:, column])[:self.samples])

    def row(self, sample: int) -> np.ndarray:
        """The columns flagged in ``sample``."""
        return np.flatnonzero((self.packed[sample // 8] >> (7 - sample % 8)) & 1)


def _scan(a: LoadedDump, b: LoadedDump, cols_a: list[int], cols_b: list[int],
          nodes: list[tuple[list[int], list[int]]], by_value: Sequence[bool] = (),
          ran: dict[int, list[tuple[int, int, bool]]] | None = None) -> tuple[_Bits, _Bits]:
    """Which shared tensors differ (bytes, type or shape) in which samples, and where the origin rule holds for
    each. ``by_value``: columns computed from constants alone, whose shapes are compared without their axes of
    size 1 (the same bytes in the same order are the same values). ``ran``: columns computed inside ``If``
    branches, with the markers (column in a, column in b, value) saying where their branches ran: such a column
    differs only in samples where both runs computed it (elsewhere it was not computed: never a difference). Reads the tables a block of samples at a
    time, field by field, and keeps one bit per sample and tensor, so memory stays flat (50,000 samples × 416
    tensors: 26.8 s and 6.0 GB peak RSS on the H100 host when whole records were copied and shapes compared as
    strings)."""
    canonical: dict[tuple[int, ...], int] = {}
    ids_a = np.array([canonical.setdefault(s, len(canonical)) for s in a.shapes] or [0], dtype=np.int64)
    ids_b = np.array([canonical.setdefault(s, len(canonical)) for s in b.shapes] or [0], dtype=np.int64)
    squeezed: dict[tuple[int, ...], int] = {}
    sq_a = np.array([squeezed.setdefault(_squeezed(s), len(squeezed)) for s in a.shapes] or [0], dtype=np.int64)
    sq_b = np.array([squeezed.setdefault(_squeezed(s), len(squeezed)) for s in b.shapes] or [0], dtype=np.int64)
    constant = np.zeros(len(cols_a), dtype=bool)
    constant[[i for i, v in enumerate(by_value) if v]] = True
    samples = a.table.samples
    seen: dict = {}
    differ, origin = _Bits(samples, len(cols_a)), _Bits(samples, len(nodes))
    ia, ib = np.asarray(cols_a, dtype=np.int64), np.asarray(cols_b, dtype=np.int64)
    for start in range(0, samples, _DIFF_BLOCK):
        stop = min(start + _DIFF_BLOCK, samples)
        ta, tb = a.table.block(start, stop), b.table.block(start, stop)
        block = ta["hash"][:, ia] != tb["hash"][:, ib]
        block |= ta["dtype"][:, ia] != tb["dtype"][:, ib]
        shape_a, shape_b = ta["shape"][:, ia], tb["shape"][:, ib]
        block |= np.where(constant, sq_a[shape_a] != sq_b[shape_b], ids_a[shape_a] != ids_b[shape_b])
        for p, markers in (ran or {}).items():
            for ma, mb, want in markers:
                block[:, p] &= _ran(a, ta, start, ma, want, seen) & _ran(b, tb, start, mb, want, seen)
        differ.put(start, block)
        origin.put(start, origins(block, nodes))
    return differ, origin


_DIFF_BLOCK = 2048  # samples per block of _scan (a multiple of 8)


def _observed_branches(dump: LoadedDump) -> bool:
    """Whether the dump observed inside ``If`` branches (dumps written before did not: the ``If`` is one node)."""
    return any(t.branch or t.how == "branch" for t in dump.tensors)


def _branches_unobserved(a: LoadedDump, b: LoadedDump, space: str, branched: bool) -> str:
    """Why the tensors inside ``If`` branches that a dump recorded are not compared ("" where none were recorded,
    or they are compared)."""
    inside = [dump for dump in (a, b) if _observed_branches(dump)]
    if branched or not inside:
        return ""
    counts = [sum(1 for t in dump.tensors if t.how == "branch") for dump in (a, b)]
    if len(inside) == 1:
        label, other = ("A", a) if inside[0] is b else ("B", b)
        if (other.run.manifest.sections.get("dump") or {}).get("fingerprints_on") == "device":
            return (f"tensors inside If branches (A {counts[0]}, B {counts[1]}): run {label}'s dump was fingerprinted on the "
                    "GPU, which keeps each If one node (dump it with --fingerprints host to compare inside)")
        return (f"tensors inside If branches (A {counts[0]}, B {counts[1]}): run {label}'s dump was written before qconsist "
                "observed inside branches, so each If is one node here; dump it again to compare inside")
    return (f"tensors inside If branches (A {counts[0]}, B {counts[1]}): the runs ran different graphs, compared through the "
            "original model, where each If is one node")


def _branch_conditions(a: LoadedDump, keys_a: dict[str, int], keys_b: dict[str, int],
                       shared: list[str]) -> tuple[list[str], dict[int, list[tuple[int, int, bool]]]]:
    """The shared tensors that can be compared, and for each one computed inside ``If`` branches (by position in
    them) the markers saying where its branches ran: (column in a, column in b, the value where it ran). A tensor
    whose markers were not recorded in both dumps is left out: where it was computed cannot be told."""
    kept, conditions = [], []
    present = set(shared)
    for key in shared:
        markers = [marker(branch) for branch in a.tensors[keys_a[key]].branch]
        if any(m not in present for m, _ in markers):
            continue
        kept.append(key)
        conditions.append([(keys_a[m], keys_b[m], want) for m, want in markers])
    return kept, {p: found for p, found in enumerate(conditions) if found}


def _ran(dump: LoadedDump, block: np.ndarray, start: int, column: int, want: bool, seen: dict) -> np.ndarray:
    """Per sample of ``block`` (starting at ``start``): whether the marker ``column`` holds ``want`` (its branch ran);
    an empty marker (its own branch did not run) holds neither. Each distinct record is read once (``seen``)."""
    known = seen.setdefault((id(dump), column), {})
    keys = block["hash"][:, column].astype(np.uint64), block["shape"][:, column].astype(np.uint64)
    found = np.zeros(len(block), dtype=bool)
    for h, shape in set(zip(keys[0].tolist(), keys[1].tolist())):
        rows = (keys[0] == h) & (keys[1] == shape)
        if (h, shape) not in known:
            record = dump.table.record(start + int(np.flatnonzero(rows)[0]), column)
            empty = int(np.prod(dump.shapes[int(record["shape"])], dtype=np.int64)) == 0
            known[(h, shape)] = None if empty else bool(record["max"] == 1)
        if known[(h, shape)] is want:
            found |= rows
    return found


def _branches_apart(a: LoadedDump, b: LoadedDump, shared: list[str], columns: tuple[list[int], list[int]],
                    differ: "_Bits") -> list[dict[str, Any]]:
    """The ``If`` nodes whose branch differs between the runs (their marker differs where both runs computed it):
    the node, the samples (the first ``SAMPLES_KEPT``), their count, and the branch each run took in the first."""
    found = []
    for p, key in enumerate(shared):
        tensor = a.tensors[columns[0][p]]
        if tensor.how != "branch" or tensor.op_type != "If" or not key.endswith("/then_taken"):
            continue
        rows = differ.column(p)
        if not rows.size:
            continue
        first = int(rows[0])
        side = lambda dump, column: "then" if dump.table.record(first, column)["max"] == 1 else "else"  # noqa: E731
        found.append({"node": key.rsplit("/", 1)[0], "count": int(rows.size), "samples": rows[:SAMPLES_KEPT].tolist(),
                      "a": side(a, columns[0][p]), "b": side(b, columns[1][p])})
    return found


def _summary(a: LoadedDump, b: LoadedDump, sample: int, ca: int, cb: int) -> dict[str, Any]:
    def side(dump: LoadedDump, column: int) -> dict[str, Any]:
        rec = dump.table.record(sample, column)
        return {
            "dtype": DTYPES[int(rec["dtype"])], "shape": list(dump.shapes[int(rec["shape"])]),
            "min": float(rec["min"]), "max": float(rec["max"]), "mean": float(rec["mean"]),
            "nan": int(rec["nan"]), "inf": int(rec["inf"]),
        }

    return {"sample": sample, "a": side(a, ca), "b": side(b, cb)}


def compare_tensors(
    a: LoadedDump, b: LoadedDump, original_a: Path | None, original_b: Path | None,
    tolerance: Tolerance = Tolerance(), focus: Sequence[int] = (),
) -> TensorComparison:
    """Compare two dumps of the same input set. Raises ``RunStoreError`` when they cannot be compared.
    ``focus``: samples whose first diverging node and origins are traced one by one (``traces``).

    With a ``tolerance``, every diverging node is also judged against it: from its raw tensors where both
    runs kept them, else from the fingerprints (the differences of min, max and mean are lower bounds of
    the greatest element difference), else ``unknown``."""
    if a.table.shape[0] != b.table.shape[0]:
        raise RunStoreError(f"the dumps hold {a.table.shape[0]} and {b.table.shape[0]} samples; compare runs on the same input set")
    check_hash_functions(a.table, b.table, f"run {a.run_dir}", f"run {b.run_dir}")
    space, graph_a, graph_b = _space(a, b, original_a, original_b)
    keys_a, keys_b = tensor_keys(a, space), tensor_keys(b, space)
    shared = [k for k in keys_a if k in keys_b]
    apart = [k for k in shared if not blocks_comparable(a.tensors[keys_a[k]], b.tensors[keys_b[k]], a.nchwc_block, b.nchwc_block)]
    shared = [k for k in shared if k not in set(apart)]
    if space == "original":
        _check_axis_order(a, b, keys_a, keys_b, shared)
    # tensors computed inside If branches (both dumps observed inside them): compared where both runs computed them
    branched = space == "optimized" and _observed_branches(a) and _observed_branches(b)
    graph = space_graph(graph_a, branched)
    if branched:  # in the graph's order, a branch's tensors before their If's outputs (the dump records them last)
        shared = sorted(shared, key=lambda k: graph.producer.get(k, -1))
    shared, ran = _branch_conditions(a, keys_a, keys_b, shared) if branched else (shared, {})
    cols_a, cols_b = [keys_a[k] for k in shared], [keys_b[k] for k in shared]
    constants = (_constants(graph_a, branched), _constants(graph_b, branched))
    position = {k: i for i, k in enumerate(shared)}
    result = TensorComparison(space, len(shared), len(a.tensors) + len(b.tensors) - 2 * len(shared), int(a.table.shape[0]),
                              tolerance=tolerance)
    result.branches_unobserved = _branches_unobserved(a, b, space, branched)
    if space == "original":
        result.layout_unknown = sorted({t.label for dump in (a, b) for t in dump.tensors if t.how == "layout unknown"})
    result.blocked_apart = list(dict.fromkeys(_label(a.tensors[keys_a[k]], b.tensors[keys_b[k]]) for k in apart))
    # what each compared tensor rests on: the nearest observed tensors upstream (its producer's own inputs where
    # every one was observed: an origin; else a span), the graph inputs and the constants
    proofs = [graph.proof(key, position) for key in shared]
    same_inputs = bool(a.inputs_digest) and a.inputs_digest == b.inputs_digest
    nodes = [([position[t] for t in proof.inputs] + ([UNOBSERVED] if proof.given and not same_inputs else []), [p])
             for p, proof in enumerate(proofs)]
    by_value = [not proof.inputs and not proof.given for proof in proofs]
    differ, origin = _scan(a, b, cols_a, cols_b, nodes, by_value, ran)
    result.branches_apart = _branches_apart(a, b, shared, (cols_a, cols_b), differ)

    def rows_of(key: str) -> np.ndarray:
        return differ.column(position[key])

    labels = [_label(a.tensors[ca], b.tensors[cb]) for ca, cb in zip(cols_a, cols_b)]
    same = constant_comparison(graph_a if space == "optimized" else None, a.nchwc_block, b.nchwc_block)
    _diverging(a, b, result, shared, (cols_a, cols_b), (differ, origin), (graph, proofs), labels, constants, same)
    for sample in focus:
        diverging = differ.row(int(sample))
        found = [int(p) for p in origin.row(int(sample))]
        result.traces.append(SampleTrace(int(sample), labels[int(diverging[0])] if diverging.size else None,
                                         [labels[p] for p in found if not proofs[p].span],
                                         [labels[p] for p in found if proofs[p].span]))
    _element_stats(a, b, result, keys_a, keys_b, rows_of)
    if not tolerance.exact:
        for node in result.nodes:
            node.tolerance = _judge(a, b, node, keys_a[node.key], keys_b[node.key], rows_of(node.key),
                                    *tolerance.for_node(node.label, node.key))
        unknown = [n.key for n in result.nodes if n.tolerance == "unknown"]
        result.raw_missing = list(dict.fromkeys([*result.raw_missing, *unknown]))
    return result


def _space(a: LoadedDump, b: LoadedDump, original_a: Path | None,
           original_b: Path | None) -> tuple[str, onnx.ModelProto, onnx.ModelProto]:
    """Where two dumps are compared: ORT's optimized graph when both ran the same structure, else the original
    models (``original_a``/``original_b``, verified); the two graphs."""
    if a.structure == b.structure:
        return "optimized", _load_model(a.optimized_path, "dump graph"), _load_model(b.optimized_path, "dump graph")
    if a.original_structure == b.original_structure:
        if original_a is None or original_b is None:
            raise RunStoreError("the runs executed different optimized graphs and their original models are gone")
        return "original", _load_model(original_a, "model"), _load_model(original_b, "model")
    raise RunStoreError(
        "runs of different models: their graphs differ structurally (nodes or tensors), so tensors "
        "cannot be compared node by node; compare runs of the same model (a float model against its "
        "quantization: `qconsist quant-error RUN` ranks the nodes by quantization error)"
    )


def _diverging(a: LoadedDump, b: LoadedDump, result: TensorComparison, shared: list[str],
               columns: tuple[list[int], list[int]], flags: tuple[_Bits, _Bits], proved: tuple[ObservedGraph, list[Proof]],
               labels: list[str], constants: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
               same: Callable[[str, Any, Any], bool]) -> None:
    """Every shared tensor that differs in some sample, as a ``TensorDiff`` in the graph's order; origins and
    spans with their evidence (``same(name, a, b)``: whether a constant holds the same values in both runs)."""
    (cols_a, cols_b), (differ, origin), (graph, proofs), (constants_a, constants_b) = columns, flags, proved, constants
    for p, key in enumerate(shared):
        rows = differ.column(p)
        if not rows.size:
            continue
        origin_rows = origin.column(p)
        proof = proofs[p]
        changed = sorted(c for c in proof.constants if not same(c, constants_a.get(c), constants_b.get(c)))
        ta, tb = a.tensors[cols_a[p]], b.tensors[cols_b[p]]
        finding = ("span" if proof.span else "origin") if origin_rows.size else ""
        node = TensorDiff(
            key=key, label=labels[p], op_a=ta.op_type, op_b=tb.op_type, covers=sorted(set(ta.covers) | set(tb.covers)),
            samples=rows[:SAMPLES_KEPT].tolist(), origin=finding == "origin",
            origin_samples=origin_rows[:SAMPLES_KEPT].tolist(), initializers_changed=changed,
            summary=_summary(a, b, int(rows[0]), cols_a[p], cols_b[p]), count=int(rows.size), origin_count=int(origin_rows.size),
            finding=finding,
        )
        if finding:
            node.inputs, node.given, node.constants = list(proof.inputs), list(proof.given), list(proof.constants)
            if proof.span:
                node.span = [graph.nodes[i].label for i in proof.nodes]
                node.unobserved = list(proof.unobserved)
        result.nodes.append(node)


def constant_comparison(graph: onnx.ModelProto | None, block_a: int, block_b: int) -> Callable[[str, Any, Any], bool]:
    """``same(name, a, b)`` for two dumps' constants: in ORT's optimized graph (``graph``), a filter ORT reordered for
    an NCHWc Conv is compared in OIHW where the two processors' blocks differ (the same weights, another order);
    every other constant by ``same_value``."""
    filters = nchwc_filters(graph) if graph is not None and block_a and block_b and block_a != block_b else {}

    def same(name: str, a: np.ndarray | None, b: np.ndarray | None) -> bool:
        if same_value(a, b) or name not in filters or a is None or b is None or a.shape != b.shape:
            return same_value(a, b)
        ua, ub = unblock_filter(a, block_a, filters[name]), unblock_filter(b, block_b, filters[name])
        return ua is not None and ub is not None and same_value(ua, ub)

    return same


def _check_axis_order(a: LoadedDump, b: LoadedDump, keys_a: dict[str, int], keys_b: dict[str, int], shared: list[str]) -> None:
    """A dump written before qconsist put relaid tensors back in the original's axis order cannot be compared,
    through the original graph, with one that did, where a shared tensor is relaid."""
    if a.original_order == b.original_order:
        return
    new, old, keys = (a, b, keys_a) if a.original_order else (b, a, keys_b)
    relaid = [k for k in shared if new.tensors[keys[k]].layout]
    if relaid:
        raise RunStoreError(
            f"run {old.run_dir} was dumped by an earlier qconsist, which recorded {len(relaid)} tensor(s) such as "
            f"{relaid[0]} in the axis order ORT held them in (run {new.run_dir} records them in the original model's); "
            "dump it again with this qconsist version"
        )


def _label(a: TensorOrigin, b: TensorOrigin) -> str:
    """The label users know for a compared tensor: the one of the run whose node covers more originals."""
    return b.label if len(b.covers) > len(a.covers) else a.label


def _judge(a: LoadedDump, b: LoadedDump, node: TensorDiff, col_a: int, col_b: int, rows: np.ndarray,
           atol: float, rtol: float) -> str:
    """``beyond``, ``within`` or ``unknown`` the tolerance ``atol + rtol·|a|`` (``rows``: the samples where
    the node differs)."""
    if node.elements is not None:
        return "beyond" if node.elements.mismatched else "within"
    for sample in rows.tolist():
        ra, rb = a.table.record(sample, col_a), b.table.record(sample, col_b)
        if a.shapes[int(ra["shape"])] != b.shapes[int(rb["shape"])] or ra["dtype"] != rb["dtype"]:
            return "beyond"
        if ra["nan"] != rb["nan"] or ra["inf"] != rb["inf"]:
            return "beyond"
        values = [float(ra[k]) for k in ("min", "max")] + [float(rb[k]) for k in ("min", "max")]
        if not all(np.isfinite(values)):
            continue
        # |max_a − max_b|, |min_a − min_b| and |mean_a − mean_b| never exceed the greatest element difference,
        # and the element where it is reached has |a| <= max(|min_a|, |max_a|)
        bound = max(abs(float(ra[k]) - float(rb[k])) for k in ("min", "max", "mean"))
        if bound > atol + rtol * max(abs(float(ra["min"])), abs(float(ra["max"]))):
            return "beyond"
    return "unknown"


def _element_stats(a: LoadedDump, b: LoadedDump, result: TensorComparison, keys_a: dict, keys_b: dict,
                   rows_of: Callable[[str], np.ndarray]) -> None:
    """Element statistics from raw tensors, where both runs kept them (every diverging node with a tolerance;
    ``rows_of``: each diverging node's samples)."""
    chosen = [n for n in result.nodes if n.finding or n is result.first]
    others = [n for n in result.nodes if n not in chosen]
    chosen += others if not result.tolerance.exact else others[:MAX_ELEMENT_NODES]
    kept = np.array(sorted(a.raw_samples() & b.raw_samples()), dtype=np.int64)
    wanted: dict[int, list[TensorDiff]] = {}
    missing: set[str] = set()
    for node in chosen:
        rows = rows_of(node.key)
        if not np.isin(rows, kept).all():  # a sample without raw tensors in a run: no element statistics
            missing.add(node.key)
            continue
        for sample in rows.tolist():
            wanted.setdefault(sample, []).append(node)
    for sample in sorted(wanted):
        nodes = wanted[sample]
        arrays_a = a.raw_arrays(sample, [keys_a[n.key] for n in nodes])
        arrays_b = b.raw_arrays(sample, [keys_b[n.key] for n in nodes])
        for node in nodes:
            col_a, col_b = keys_a[node.key], keys_b[node.key]
            if col_a not in arrays_a or col_b not in arrays_b:
                missing.add(node.key)
                continue
            if node.elements is None:
                atol, rtol = (None, None) if result.tolerance.exact else result.tolerance.for_node(node.label, node.key)
                node.elements = TensorStats(node.key, atol, rtol)
            node.elements.add(sample, arrays_a[col_a], arrays_b[col_b])
    for node in result.nodes:
        if node.key in missing:
            node.elements = None
    key_nodes = [n for n in result.nodes if n.finding or n is result.first]
    result.raw_missing = [n.key for n in key_nodes if n.key in missing]
