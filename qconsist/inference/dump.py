"""``--dump``: fingerprints of every tensor ONNX Runtime actually computes, checked against production.

Design (measured in ../shared/MEASURED.md): exposing every tensor of the model as a graph output blocks
ORT's fusions, so the dumped session would run other kernels than production. Instead qconsist

1. lets ORT optimize the model at the production level and EP and save the graph it will run
   (``SessionOptions.optimized_model_filepath``),
2. exposes every tensor of *that* graph as an output (those computed inside ``If`` branches too, as extra outputs of
   their ``If``: ``branches.py``) and reloads it with optimizations off,
3. runs every sample through it, fingerprints every tensor (``fingerprint.py``; in a background thread,
   ``DumpRecorder``, overlapping ORT's next sample, helped by the recording thread while it waits), keeps raw
   tensors only when asked, and
   (a tensor ORT holds in another axis order than the original model's — an NHWC QLinearConv output, a
   DequantizeLinear the NHWC transformer moved — is recorded in the original's order: ``DumpPlan.to_original``,
   the permutation read from the graph by ``layout.py``; ``index.json`` keeps it as the tensor's ``layout``; a tensor
   ORT holds in NCHWc channel blocks, whose size depends on the processor, is recorded in NCHW without its padding
   channels where the graph establishes its channel count: ``layout.unblock``, the tensor's ``channels``, the block
   measured once per process in ``index.json``'s ``nchwc_block``; both copies are made column by column by the
   threads that fingerprint, not by the one that runs the sessions: ``DumpPlan.forms``), and
4. runs every sample through a production session (same options, no dumps) and compares the final outputs
   bit for bit. The verdict (``faithful``) and the greatest difference go into the manifest.

Run-directory files (``dump/``)::

    optimized.onnx      the graph ORT runs (what was dumped)
    index.json          tensors in column order: name, node, op, original tensor, label, covers, dtype;
                        the shape table; the fingerprint table's format; the faithfulness verdict per sample
    table/              the fingerprint table (qconsist.store.fingerprints: hashes.npy, stats.npy,
                        starts.npy, events.npy); dumps written before: fingerprints.npy, RECORD[samples, tensors]
    raw/<sample>.npz    raw tensors asked for (keys t<column>), no pickle
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, cast

import numpy as np
import onnx
from onnx import version_converter

from qconsist.compare import ObservedGraph, ObservedNode, OutputEffect
from qconsist.errors import ConfigError, QconsistError, UnsupportedModelError
from qconsist.inference.batch import ONE, Split, probe_splits
from qconsist.inference.branches import MARKER, BranchTensor, expose_branches
from qconsist.inference.fingerprint import RowWork
from qconsist.inference.graphmap import TensorOrigin, map_tensors, node_names, node_reads, op_name, structure_hash, topological_order
from qconsist.inference.layout import Layouts, block_size, holds, original_shape, to_original, unblock, unblocked_shape
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session, onnxruntime_limits
from qconsist.onnxfile import ai_onnx_opset, read_onnx
from qconsist.store.fingerprints import TableWriter
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16", "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16",
    "tensor(uint16)": "uint16", "tensor(int32)": "int32", "tensor(uint32)": "uint32", "tensor(int64)": "int64",
    "tensor(uint64)": "uint64", "tensor(bool)": "bool",
}


class RawMode(str, Enum):
    NONE = "none"
    ALL = "all"
    NODES = "nodes"
    AUTO = "auto"


@serialized
@dataclass(frozen=True)
class RawSelection:
    """Which raw tensors a dump keeps: none, all, those of named nodes, or ``auto`` (those that differ
    from a reference dump, plus the final outputs)."""

    mode: RawMode = RawMode.NONE
    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> "RawSelection":
        value = (text or "none").strip()
        if value.lower() in ("none", "all", "auto"):
            return cls(RawMode(value.lower()))
        names = tuple(n.strip() for n in value.split(",") if n.strip())
        if not names:
            raise ConfigError(f"`raw` {text!r}: give all, none, auto or a comma-separated list of node names")
        return cls(RawMode.NODES, names)


@dataclass
class DumpPlan:
    """The exposed optimized graph, its sessions and where each dumped tensor comes from."""

    optimized_path: Path
    structure: str
    original_structure: str
    outputs: list[str]  # the model's final outputs
    tensors: list[TensorOrigin]  # dumped tensors, column order
    dtypes: list[str]
    session: object  # ort.InferenceSession of the exposed graph, optimizations off
    splits: list[Split] = field(default_factory=list)  # per column: how a step's tensor divides among its samples
    left_out: dict[str, str] = field(default_factory=dict)  # tensors not recorded, and why (not a tensor, unsplittable)
    layouts: Layouts | None = None  # axis labels of the original and the optimized graph
    repair: str = ""  # what qconsist changed in the graph ORT saved so that ORT reloads it ("" nothing)
    block: int = 0  # the NCHWc block this process's onnxruntime uses (measured where the graph has NCHWc tensors)

    def column(self, name: str) -> int:
        return [t.name for t in self.tensors].index(name)

    @property
    def relaid(self) -> list[int]:
        """Columns ORT holds in another axis order than their original tensor's."""
        return [c for c, t in enumerate(self.tensors) if t.layout]

    @property
    def unblocked(self) -> list[int]:
        """Columns ORT holds in NCHWc blocks that are recorded in NCHW (their real channel count established)."""
        return [c for c, t in enumerate(self.tensors) if t.blocked and t.channels]

    def to_original(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """One step's tensors (column order) with every relaid tensor put back in its original's axis order and every
        NCHWc-blocked one whose channels are known in NCHW."""
        converted = self.converted
        if not converted:
            return arrays
        arrays = list(arrays)
        for c in converted:
            arrays[c] = self.recorded(c, arrays[c])
        return arrays

    def run_columns(self, feed: dict[str, np.ndarray], columns: list[int]) -> list[np.ndarray]:
        """The dumping session's tensors of ``columns`` alone for ``feed``, as ``to_original`` gives them."""
        converted, session = set(self.converted), cast(Any, self.session)
        arrays = session.run([self.tensors[c].name for c in columns], feed)
        return [self.recorded(c, a) if c in converted else a for c, a in zip(columns, arrays)]

    @property
    def converted(self) -> list[int]:
        """Columns recorded in another form than ORT holds them (``relaid`` and ``unblocked``)."""
        return [c for c, t in enumerate(self.tensors) if t.layout or (t.blocked and t.channels)]

    def recorded(self, column: int, array: np.ndarray) -> np.ndarray:
        """Column ``column``'s tensor as ORT holds it, as it is recorded (``to_original`` of one column)."""
        tensor = self.tensors[column]
        if tensor.layout:
            array = to_original(array, tensor.layout)
        if tensor.blocked and tensor.channels:
            array = unblock(array, self.block, tensor.channels)
        return array

    def recorded_shape(self, column: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape ``recorded`` gives column ``column``'s tensor of ``shape``, without computing it."""
        tensor = self.tensors[column]
        if tensor.layout:
            shape = original_shape(shape, tensor.layout)
        if tensor.blocked and tensor.channels:
            shape = unblocked_shape(shape, self.block, tensor.channels)
        return tuple(shape)

    def forms(self, arrays: list[np.ndarray]) -> dict[int, tuple[tuple[int, ...], Callable[[], np.ndarray]]]:
        """A step of one sample's columns that are recorded in another form (``fingerprint.RowWork``'s ``forms``):
        each one's recorded shape and the copy that makes it, left to the thread that fingerprints the column."""
        return {c: (self.recorded_shape(c, arrays[c].shape), functools.partial(self.recorded, c, arrays[c]))
                for c in self.converted}

    @property
    def batched(self) -> list[bool]:
        """Per column: its first axis holds the samples, one row each (the device dump's split)."""
        return [s.kind == "first" or (s.kind == "axis" and s.axis == 0) for s in self.splits]

    @property
    def device_splits(self) -> bool:
        """Whether the device dump splits every column as ``splits`` says (first axis, one row a sample, or
        shared); other splits are made on the host."""
        return all(s.kind in ("shared", "first") or (s.kind == "axis" and s.axis == 0 and s.size == 1) for s in self.splits)

    def rows(self, arrays: list[np.ndarray], count: int) -> list[list[np.ndarray]]:
        """One step's tensors as ``count`` samples, each tensor divided as its split says (``batch``: a batched
        tensor keeps its batch axis with a sample's extent, as a step of one sample computes it; a shared one is
        every row's; a shape-valued one holds a step of one sample's values)."""
        if count == 1:
            return [arrays]
        parts = [split.rows(a, count, t.name) for a, split, t in zip(arrays, self.splits, self.tensors)]
        return [[part[r] for part in parts] for r in range(count)]


def expose_all(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with every node output (typed or not) added to the graph outputs."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    graph = exposed.graph
    typed = {v.name: v for v in graph.value_info}
    present = {o.name for o in graph.output}
    names: list[str] = []
    for node in graph.node:
        for out in node.output:
            if not out:
                continue
            names.append(out)
            if out not in present:
                graph.output.append(typed[out] if out in typed else onnx.ValueInfoProto(name=out))
                present.add(out)
    return exposed, names


@dataclass(frozen=True)
class Probe:
    """Two different samples and how to stack them: for steps of several samples, the dump asks the session
    which part of each tensor belongs to which sample (``batch.probe_splits``)."""

    first: dict[str, np.ndarray]
    second: dict[str, np.ndarray]
    stack: Callable[[list[dict[str, np.ndarray]]], dict[str, np.ndarray]]
    more: Callable[[], Iterable[dict[str, np.ndarray]]] | None = None  # further samples (``batch.further_samples``)


def plan_dump(model_path: Path, options: ExecutionOptions, dump_dir: Path, probe: Probe | None = None,
              finals: dict[str, Split] | None = None) -> DumpPlan:
    """Save ORT's optimized graph of ``model_path`` under ``options`` and build the dumping session
    (``expose_plan``); for steps of several samples, how each tensor divides among them (``split_plan``)."""
    return split_plan(expose_plan(model_path, options, dump_dir), probe, finals)


def expose_plan(model_path: Path, options: ExecutionOptions, dump_dir: Path) -> DumpPlan:
    """The plan of a dump one sample at a time (every split ``ONE``): ORT's optimized graph of ``model_path``
    under ``options`` saved in ``dump_dir``, every tensor exposed, the dumping session made, each tensor's origin.
    It needs no step of the model, so a run makes it at once, beside the probe of its outputs' batch axes, and
    ``split_plan`` adds the splits once that probe is done (``runner._plan_part``)."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    optimized_path = dump_dir / "optimized.onnx"
    original = read_onnx(model_path, external_data=True)
    # weights in external data files: the session is made from the whole model (its weights read in), so that ORT's
    # optimized graph holds them too instead of naming files that lie beside the model, not in the dump
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in read_onnx(model_path).graph.initializer)
    create_session(original.SerializeToString() if external else model_path, options, optimized_model_filepath=optimized_path)
    optimized = read_onnx(optimized_path, external_data=True, what="ORT's optimized graph")
    optimized, repair = reloadable(optimized, optimized_path, options)
    produced = produced_outputs(optimized)
    if produced:
        onnx.save(optimized, str(optimized_path))
        repair = "; ".join(filter(None, [repair, produced]))
    exposed, names = expose_all(optimized)
    exposed, inner, unobserved = expose_branches(exposed)  # tensors inside If branches (``branches.py``)
    names += [t.name for t in inner]
    # its idle threads sleep: spinning, they took the cores from the fingerprint worker and production (on 2
    # loaded cores the dump's CPU time per sample went from 3.5-3.9x production's to 1.7-2.2x; kernels unchanged).
    # Still so with the fingerprints taken right after the session's run by both threads (tried): spinning, the
    # dump measured 3.5x production per sample against 2.3x (median of 16 paired rounds each, load 6-7)
    session = create_session(exposed.SerializeToString(), options, level=OptimizationLevel.DISABLE, spinning=False)
    runtime, ranks = {}, {}
    dims = {i.name: tuple(d if isinstance(d, int) else None for d in i.shape) for i in session.get_inputs()}
    left_out: dict[str, str] = dict(unobserved)
    for out in session.get_outputs():
        dims[out.name] = tuple(d if isinstance(d, int) else None for d in out.shape or [])
        if not out.type.startswith("tensor("):  # a sequence, map or optional: not a tensor to fingerprint
            left_out[out.name] = f"not a tensor ({out.type})"
            continue
        shape = tuple(out.shape) if all(isinstance(d, int) for d in out.shape) else None
        runtime[out.name] = (_ORT_TYPES.get(out.type, out.type), shape)
        if out.shape:  # [] is a scalar or an unknown shape: no rank
            ranks[out.name] = len(out.shape)
    outputs = [o.name for o in optimized.graph.output]
    not_tensors = [n for n in outputs if n in left_out]
    if not_tensors:
        raise UnsupportedModelError(f"output {not_tensors[0]!r} is {left_out[not_tensors[0]][14:-1]}, not a tensor; "
                                    "qconsist records tensors")
    names = [n for n in names if n not in left_out]
    origins, layouts = map_tensors(original, optimized, runtime, ranks, dims)
    block = block_size() if any(t.blocked for t in origins) else 0
    origins = [_checked_channels(t, dims.get(t.name), block) for t in origins]
    by_name = {t.name: t for t in origins}
    by_name.update({t.name: branch_origin(t) for t in inner})
    tensors = [by_name[n] for n in names]
    # the graph's outputs are the original model's outputs, in their own order whatever ORT did inside
    tensors = [dataclasses.replace(t, layout=(), how="same", original=t.name)
               if t.name in outputs and (t.layout or t.how == "layout unknown") else t for t in tensors]
    relaid = sum(1 for t in tensors if t.layout)
    unknown = [t.name for t in tensors if t.how == "layout unknown"]
    log.info("dump: %d tensors of ORT's optimized graph (%d nodes); %d held in another axis order, %d of unknown layout%s",
             len(tensors), len(optimized.graph.node), relaid, len(unknown), f" ({', '.join(unknown[:5])})" if unknown else "")
    if block:
        blocked = [t for t in tensors if t.blocked]
        log.info("dump: %d tensor(s) in NCHWc blocks of %d, %d recorded in NCHW", len(blocked), block,
                 sum(1 for t in blocked if t.channels))
    plan = DumpPlan(
        optimized_path=optimized_path,
        structure=structure_hash(optimized),
        original_structure=structure_hash(original),
        outputs=outputs,
        tensors=tensors,
        dtypes=[runtime[n][0] for n in names],
        session=session,
        layouts=layouts,
        repair=repair,
        block=block,
    )
    plan.left_out = left_out
    plan.splits = [ONE] * len(names)
    return plan


def split_plan(plan: DumpPlan, probe: Probe | None, finals: dict[str, Split] | None = None) -> DumpPlan:
    """``plan`` (``expose_plan``'s, unchanged) for steps of several samples: ``probe`` finds how each tensor divides
    among them (its two steps run through the dumping session); a tensor that cannot be divided is left out
    (``left_out``), a final output that cannot refuses the run. ``finals``: the model's outputs' splits as the run
    found them (on the CPU, ``runner._output_splits``), which the dump keeps for them. No probe: ``plan`` itself."""
    if probe is None:
        return plan
    names = [t.name for t in plan.tensors]
    session: Any = plan.session
    splits = probe_splits(lambda feed: plan.to_original(session.run(names, feed)), probe.first, probe.second,
                          probe.stack, "the dump of the model", probe.more, plan.run_columns)
    split = dataclasses.replace(plan, splits=splits, left_out=dict(plan.left_out))
    for name, found in (finals or {}).items():
        if name in split.outputs:
            split.splits[split.column(name)] = found
    _leave_out_unsplittable(split)
    return split


def branch_origin(tensor: BranchTensor) -> TensorOrigin:
    """A tensor computed inside an ``If`` branch, recorded as ORT holds it under its path (``branches.py``), labelled
    with the path of the node computing it (a marker: its own path, ``<If>/then_taken``). It has no original twin:
    it is compared in ORT's optimized graph, where both runs ran the same branches' nodes."""
    return TensorOrigin(name=tensor.name, node=tensor.node, op_type=tensor.op_type, original=None, how="branch",
                        label=tensor.name if tensor.name == f"{tensor.node}/{MARKER}" else tensor.node, branch=tensor.branch)


def _checked_channels(tensor: TensorOrigin, shape: tuple | None, block: int) -> TensorOrigin:
    """A blocked tensor keeps the channel count the graph gave it only where its shape holds that many channels in
    blocks of ``block`` (``layout.holds``); else it is recorded as ORT holds it (``channels`` 0)."""
    if not tensor.blocked or not tensor.channels:
        return tensor
    padded = None
    if shape is not None and len(shape) == 4:
        padded = shape[1]
    elif shape is not None and len(shape) == 5 and isinstance(shape[1], int) and shape[4] == block:
        padded = shape[1] * block
    if holds(padded, block, tensor.channels):
        return tensor
    log.info("dump: %s is held in NCHWc blocks whose channels are not established (%s channels for %d); recorded as ORT "
             "holds it", tensor.name, padded, tensor.channels)
    return dataclasses.replace(tensor, channels=0)


def _leave_out_unsplittable(plan: DumpPlan) -> None:
    """Drop the columns no sample owns a part of (``Split`` kind unknown): reported, never sliced."""
    unknown = {t.name: s.why for t, s in zip(plan.tensors, plan.splits) if s.kind == "unknown"}
    final = [n for n in plan.outputs if n in unknown]
    if final:
        raise UnsupportedModelError(f"output {final[0]!r} cannot be split into the samples of a step ({unknown[final[0]]}); "
                                    "run with `batch_size` 1")
    if not unknown:
        return
    keep = [c for c, t in enumerate(plan.tensors) if t.name not in unknown]
    plan.tensors = [plan.tensors[c] for c in keep]
    plan.dtypes = [plan.dtypes[c] for c in keep]
    plan.splits = [plan.splits[c] for c in keep]
    plan.left_out.update({name: f"no batch axis: {why}" for name, why in unknown.items()})
    log.warning("dump: %d tensor(s) left out at this batch size, their batch axis cannot be established (%s)",
                len(unknown), ", ".join(list(unknown)[:5]))


def produced_outputs(optimized: onnx.ModelProto) -> str:
    """Give every graph output of ORT's saved graph a node that produces it, in place: an output ORT folded into
    a constant (a ``Shape`` of a fixed input) is an initializer no node computes, so the dump would hold no
    column for it; its initializer is renamed and an ``Identity`` gives the output its name (the faithfulness
    check compares it with production like any output). A graph input that is also an output is refused, in
    one line. Returns what was changed ("" nothing)."""
    graph = optimized.graph
    made = {o for node in graph.node for o in node.output}
    initializers = {init.name: init for init in graph.initializer}
    inputs = {i.name for i in graph.input}
    changed = []
    for output in graph.output:
        if output.name in made:
            continue
        if output.name in initializers:
            constant = f"{output.name}__qconsist_constant"
            initializers[output.name].name = constant
            graph.node.append(onnx.helper.make_node("Identity", [constant], [output.name], name=f"{output.name}__qconsist_output"))
            changed.append(output.name)
        elif output.name in inputs:
            raise UnsupportedModelError(f"output {output.name!r} is the model's input {output.name!r} itself: no node "
                                        "computes it, so there is nothing to observe")
    if not changed:
        return ""
    return f"output(s) {', '.join(changed)}, constants ORT folded, produced by an Identity so that they are dumped"


def reloadable(optimized: onnx.ModelProto, path: Path, options: ExecutionOptions) -> tuple[onnx.ModelProto, str]:
    """ORT's saved optimized graph, and what was repaired so that ORT loads it again.

    ORT saves the graph it will run with the model's own opset, even where its rewrites need a newer one (a
    per-axis DequantizeLinear in an opset-12 graph: ``axis`` came with opset 13), and then cannot load its own
    file. The repair raises the saved graph's ai.onnx opset with ``onnx.version_converter`` to the first that
    onnxruntime loads (written back to ``path``); the dump's faithfulness check — final outputs bit for bit
    against a production session — then shows whether the repaired graph computes what production computes."""
    try:
        create_session(optimized.SerializeToString(), options, level=OptimizationLevel.DISABLE)
        return optimized, ""
    except QconsistError as exc:
        failure = " ".join(exc.message.split())
    current = ai_onnx_opset(optimized)
    newest = onnxruntime_limits()[0] or 0
    for opset in range(current + 1 if current else newest + 1, newest + 1):
        try:
            repaired = version_converter.convert_version(optimized, opset)
            create_session(repaired.SerializeToString(), options, level=OptimizationLevel.DISABLE)
        except Exception:  # noqa: BLE001 - the converter and onnxruntime raise several kinds; try the next opset
            continue
        onnx.save(repaired, str(path))
        note = f"ORT's saved graph raised from opset {current} to {opset} (onnx.version_converter): ORT could not reload it"
        log.warning("dump: %s (%s)", note, failure[:160])
        return repaired, note
    level = options.graph_optimization_level.value
    raise UnsupportedModelError(
        f"onnxruntime cannot reload the graph it optimized at level {level} and qconsist could not repair it "
        f"({failure[:160]}); dump at --level disable, or raise the model's opset ([convert] opset = 13 in a pipeline)"
    )


def select_raw(plan: DumpPlan, raw: RawSelection) -> set[int]:
    """Columns whose raw tensors are kept (``auto`` is resolved by the runner against a reference)."""
    if raw.mode is RawMode.ALL:
        return set(range(len(plan.tensors)))
    if raw.mode is not RawMode.NODES:
        return set()
    chosen: set[int] = set()
    for wanted in raw.names:
        hits = {
            i for i, t in enumerate(plan.tensors)
            if wanted in (t.name, t.node, t.label, t.original) or wanted in t.covers
        }
        if not hits:
            known = ", ".join(sorted({t.label for t in plan.tensors})[:8])
            raise ConfigError(f"`raw`: no dumped tensor belongs to a node named {wanted!r} (some known: {known}, ...)")
        chosen |= hits
    return chosen


@dataclass
class FaithfulCheck:
    """Dumped final outputs vs a production session without dumps, bit for bit, sample by sample: the
    comparison kernel's output effect between the two."""

    effect: OutputEffect = field(default_factory=OutputEffect)

    @property
    def faithful(self) -> bool:
        return self.effect.identical

    @property
    def samples(self) -> int:
        return self.effect.samples

    @property
    def mismatched(self) -> list[int]:
        return self.effect.differing_samples

    @property
    def max_abs_diff(self) -> float:
        return self.effect.greatest_abs

    def add(self, sample: int, production: list[np.ndarray], dumped: list[np.ndarray]) -> None:
        self.effect.add(sample, production, dumped)

    def to_json(self) -> dict:
        return {"faithful": self.faithful, "samples_checked": self.samples,
                "mismatched_samples": list(self.mismatched), "max_abs_diff": self.max_abs_diff}


OVERLAP = True  # fingerprint sample i in a worker thread while ORT runs sample i + 1 (benchmarks turn it off)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Arrays in an uncompressed ``.npz`` (no pickle)."""
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


class DumpRecorder:
    """Records each dumped sample: its fingerprint row, the faithfulness check, the raw tensors kept.

    With ``OVERLAP`` the work runs in one background thread, so fingerprinting a step overlaps what the run
    does next (fetching the next input, the dump session computing it; the numba kernels and numpy release the
    GIL), and the recording thread, once it waits for the worker, takes the columns the worker has not reached
    (``wait``): through ``qconsist run --dump`` (open_nsfw, 21 photos, load 3-6) 55.6-98.1 ms a sample against
    main's 62.0-130.6 in the same alternating rounds. Fingerprinting right after the session's run by both threads
    instead was tried: 62.5-98.1 (the worker no longer used the time the run spends on its inputs). At most one
    step waits, so memory holds two steps' tensors whatever the number of samples.
    """

    def __init__(
        self,
        table: TableWriter,
        final_columns: list[int],
        raw_columns: set[int],
        raw_path: Callable[[int], Path],
        differing: Callable[[int, np.ndarray], set[int]] | None = None,
    ) -> None:
        self.table = table
        self.check = FaithfulCheck()
        self.raw_saved = 0
        self._final = final_columns
        self._raw = raw_columns
        self._raw_path = raw_path
        self._differing = differing
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="qconsist-dump") if OVERLAP else None
        self._pending: Future | None = None
        self._current: RowWork | None = None  # the row the worker fingerprints now, which ``wait`` helps with

    @property
    def final_columns(self) -> list[int]:
        """The columns of the model's final outputs (checked against production)."""
        return list(self._final)

    def submit(self, index: int, produced: list[np.ndarray], arrays: list[np.ndarray], rows: list[list[np.ndarray]] | None = None,
               *, plan: DumpPlan | None = None, count: int = 1) -> None:
        """Record the step starting at sample ``index`` (production outputs, dumped tensors, and the tensors
        split per sample: ``rows``, one sample by default); raises what an earlier one raised.

        With ``plan``, ``arrays`` are the tensors as ORT holds them, and the recording (the worker, helped by the
        waiting thread) puts them in their recorded form (``DumpPlan.recorded``: NCHWc blocks in NCHW, relaid
        tensors in the original's order) and splits a step of ``count`` samples (``DumpPlan.rows``), so that the
        thread running the sessions does neither."""
        self.wait()
        if plan is None:
            rows = rows if rows is not None else [arrays]
        elif rows is not None:
            raise ValueError("a step is given as rows or with its plan, not both")
        if self._pool is None:
            self._record(index, produced, arrays, rows, plan, count)
        else:
            self._pending = self._pool.submit(self._record, index, produced, arrays, rows, plan, count)

    def start(self, work: Callable[[], Any]) -> None:
        """Run ``work`` (loading the fingerprint kernels) in the worker before the first step is recorded, so
        that it overlaps what the run does meanwhile; the next ``submit`` or ``wait`` waits for it."""
        self.wait()
        if self._pool is None:
            work()
        else:
            self._pending = self._pool.submit(work)

    def wait(self) -> None:
        """Until the worker has recorded the step submitted last. Meanwhile this thread takes the columns of the
        worker's row that the worker has not taken yet (``fingerprint.RowWork``): when the recording side waits,
        the dump session has finished its step, so both cores can fingerprint."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        while not pending.done():
            row = self._current
            if row is not None:
                row.work()
            wait_for([pending], timeout=0.001)  # the worker's next row (steps of several samples), or its end
        pending.result()

    def close(self) -> None:
        """Wait for the last sample and stop the worker (also after an error: nothing is left running)."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def record_device(self, index: int, produced: list[np.ndarray], host: dict[int, np.ndarray], rows: np.ndarray) -> None:
        """Record a step fingerprinted on the GPU (``device.DeviceDump``): its records ``rows``, and the
        whole-step arrays of the final-output and raw columns copied to the host (``host``)."""
        self.wait()
        self.check.add(index, produced, [host[c] for c in self._final])
        count = rows.shape[0]
        self.table.write_block(index, rows)
        for offset in range(count):
            keep = set(self._raw)
            if self._differing is not None:
                keep |= self._differing(index + offset, rows[offset])
            if keep:
                self.raw_saved += len(keep)
                split = {c: host[c][offset:offset + 1] if count > 1 and host[c].ndim and host[c].shape[0] == count else host[c]
                         for c in keep}
                save_npz(self._raw_path(index + offset), {f"t{c}": split[c] for c in sorted(keep)})

    def _record(self, index: int, produced: list[np.ndarray], arrays: list[np.ndarray], rows: list[list[np.ndarray]] | None,
                plan: DumpPlan | None = None, count: int = 1) -> None:
        forms: dict = {}
        if plan is not None and count == 1:  # each column put in its recorded form by the thread that fingerprints it
            rows, forms = [arrays], plan.forms(arrays)
        elif plan is not None:
            arrays = plan.to_original(arrays)
            rows = plan.rows(arrays, count)
        assert rows is not None
        if not forms:
            self.check.add(index, produced, [arrays[c] for c in self._final])
        for offset, sample in enumerate(rows):
            work = RowWork(sample, self.table.shapes, self.table.last, forms)
            self._current = work
            try:
                row = work.row()
            finally:
                self._current = None
            sample = work.arrays  # as recorded
            if forms:
                self.check.add(index, produced, [sample[c] for c in self._final])
            self.table.write_records(index + offset, row)
            keep = set(self._raw)
            if self._differing is not None:
                keep |= self._differing(index + offset, row)
            if keep:
                self.raw_saved += len(keep)
                save_npz(self._raw_path(index + offset), {f"t{c}": sample[c] for c in sorted(keep)})


def observed_graph(optimized: onnx.ModelProto, plan: DumpPlan) -> ObservedGraph:
    """The graph that ran, in topological order, each node labelled with the original node users know."""
    graph = optimized.graph
    initializers = {init.name for init in graph.initializer}
    labels = {t.name: t.label for t in plan.tensors}
    names = node_names(graph)
    nodes = []
    for index in topological_order(graph):
        node = graph.node[index]
        outputs = tuple(o for o in node.output if o)
        label = next((labels[o] for o in outputs if o in labels), names[index])
        reads = node_reads(node)
        nodes.append(ObservedNode(
            name=names[index], label=label, op_type=op_name(node),
            inputs=tuple(i for i in reads if i not in initializers), outputs=outputs,
            constants=tuple(i for i in reads if i in initializers),
        ))
    return ObservedGraph(tuple(nodes), tuple(plan.outputs))
