"""Confirmation by replay: a node (or a span of nodes) cut out of the model, fed the same recorded inputs under
each run's execution options, and its outputs compared.

The original investigation ended by feeding the suspect conv its own inputs in a session of its own. This is
that step, automated:

* ``isolate`` rebuilds the nodes as a small ONNX model: the tensors they read that no node of the set
  computes become its inputs (activations, including the outer tensors a subgraph of ``If``/``Loop``/``Scan``
  reads), the initializers and ``Constant`` nodes they read are carried over, the opset imports, IR version,
  local functions and the value types the model declares are kept; its outputs are the tensors of the set that
  the rest of the model (or the caller) reads.
* ``replay_nodes`` runs it, sample by sample, in one session per execution options (made the one way,
  ``inference.session.create_session``) and compares the outputs bit for bit. Each side runs on an instruction
  set (``isas``: ``native``, this processor, or a QEMU CPU model such as ``Haswell``): the sessions of an
  emulated one run in a child under QEMU user mode through the one worker (``qconsist.emulation.call_on`` of
  ``run_isolated``; the arrays cross as ``.npz`` files). Where the two sides' instruction sets differ, both
  runs' options are also replayed under each of them (``SameIsaReplay``), which says whether the instruction
  set alone makes the difference.

Three outcomes (``ReplayOutcome``): **confirmed in isolation** (given identical inputs the nodes compute
different outputs under the two runs' options: the kernels themselves differ), **does not reproduce in
isolation** (the same outputs: the difference in the full model comes from fusion with nodes outside the set
or from context), **cannot replay** (an input was not recorded: the reason, and the command that records it).
Gathering the recorded inputs of two runs is ``qconsist.explain.confirm``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.emulation import NATIVE, call_on
from qconsist.errors import ConfigError, QconsistError, RunStoreError
from qconsist.inference.graphmap import node_names, node_reads
from qconsist.inference.session import ExecutionOptions, create_session, ort_logged
from qconsist.onnxfile import read_onnx
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized


class ReplayOutcome(str, Enum):
    CONFIRMED = "confirmed in isolation"
    NOT_REPRODUCED = "does not reproduce in isolation"
    CANNOT = "cannot replay"


@dataclass(frozen=True)
class IsolatedModel:
    """Nodes of a model rebuilt as a model of their own (``isolate``)."""

    model: bytes  # the serialized ModelProto
    nodes: tuple[str, ...]  # graph order
    inputs: tuple[str, ...]  # activations it is fed
    outputs: tuple[str, ...]
    constants: tuple[str, ...]  # initializers and Constant outputs carried over


@serialized
@dataclass
class ReplaySide:
    """The isolated nodes run under one run's execution options."""

    run: str  # the run (or label) whose options these are
    options: ExecutionOptions
    hashes: list[str] = field(default_factory=list)  # sha256 (16 hex) of each replayed sample's outputs
    recorded: str = ""  # against the run's own recorded outputs: "matches", "differs", or "" (not kept raw)
    isa: str = NATIVE  # the instruction set the replay ran on: native (this processor) or a QEMU CPU model

    def where(self) -> str:
        return "on native" if self.isa == NATIVE else f"on emulated {self.isa}"

    def describe(self, isa: bool = False) -> str:
        """``A: --ep cpu --level all``; with ``isa``, followed by ``on native`` or ``on emulated Haswell``."""
        return f"{self.run}: {' '.join(self.options.to_args())}" + (f" {self.where()}" if isa else "")


@serialized
@dataclass
class SameIsaReplay:
    """Both runs' options replayed under one instruction set (made when the runs' own instruction sets differ):
    the samples whose outputs still differ there."""

    isa: str
    samples: int
    differing: list[int] = field(default_factory=list)
    reason: str = ""  # why it could not be replayed there

    def describe(self) -> str:
        if self.reason:
            return f"{self.isa}: cannot replay ({self.reason})"
        return f"{self.isa}: {len(self.differing)}/{self.samples} samples differ"


@serialized(derived=("confirmed", "summary"))
@dataclass
class NodeReplay:
    """The replay of one origin (or span): what was run, on what, under which options, and what came out."""

    nodes: list[str]  # original nodes replayed, graph order
    outcome: ReplayOutcome
    inputs: list[str] = field(default_factory=list)  # tensors fed (activations)
    outputs: list[str] = field(default_factory=list)  # tensors compared
    samples: list[int] = field(default_factory=list)  # samples replayed
    sides: list[ReplaySide] = field(default_factory=list)  # one per run
    differing: list[int] = field(default_factory=list)  # samples whose outputs differ between the sides
    mismatched: int = 0  # elements that differ, over the samples replayed
    elements: int = 0
    max_abs: float = 0.0  # greatest absolute difference (float64)
    sources: dict[str, str] = field(default_factory=dict)  # input tensor -> where its values came from
    reason: str = ""  # why it cannot be replayed
    capture: list[str] = field(default_factory=list)  # commands that record what is missing
    label: str = ""  # the origin as the diff names it
    constants_differ: list[str] = field(default_factory=list)  # constants (or "node attributes") the runs' models differ in
    notes: list[str] = field(default_factory=list)
    same_isa: list[SameIsaReplay] = field(default_factory=list)  # where the sides' instruction sets differ

    @property
    def confirmed(self) -> bool:
        return self.outcome is ReplayOutcome.CONFIRMED

    def instruction_sets(self) -> str:
        """Where the sides ran on different instruction sets: what the replays under each and under the same
        one found, and what that says of the cause; else ""."""
        if self.outcome is ReplayOutcome.CANNOT or not self.same_isa:
            return ""
        isas = " and ".join(side.isa for side in self.sides)
        across = "differs" if self.differing else "equal"
        checks = "; ".join(check.describe() for check in self.same_isa)
        line = f"replayed under {isas}: {across}; under the same instruction set: "
        if any(check.reason for check in self.same_isa):
            return line + f"{checks}: the instruction set's part is unknown"
        if self.differing and not any(check.differing for check in self.same_isa):
            return line + f"equal ({checks}): the instruction set makes the difference"
        if self.differing:
            return line + f"differs too ({checks}): the runs' options or constants make a difference of their own"
        return line + checks

    def summary(self) -> str:
        """One line: the outcome and the evidence it rests on."""
        what = f"{self.nodes[0]} computes" if len(self.nodes) == 1 else (
            f"its {len(self.nodes)} nodes ({', '.join(self.nodes[:3])}{', ...' if len(self.nodes) > 3 else ''}) compute")
        if self.outcome is ReplayOutcome.CANNOT:
            return f"{self.outcome.value}: {self.reason}"
        fed = ", ".join(self.inputs) or "no activation"
        settings = "; ".join(side.describe(self.off_native) for side in self.sides)
        if self.constants_differ:
            settings += f"; each run's own model, which differ in {', '.join(self.constants_differ[:4])}"
            settings += ", ..." if len(self.constants_differ) > 4 else ""
        if self.outcome is ReplayOutcome.CONFIRMED:
            percent = 100 * self.mismatched / self.elements if self.elements else 0.0
            return (f"{self.outcome.value}: fed identical inputs ({fed}), {what} different outputs under the "
                    f"two runs' {self._what()} ({settings}): {len(self.differing)}/{len(self.samples)} samples differ, "
                    f"mismatched elements {self.mismatched} / {self.elements} ({percent:.2f}%), "
                    f"greatest abs difference {self.max_abs:.6g}")
        return (f"{self.outcome.value}: fed identical inputs ({fed}), {what} bit-identical outputs under the "
                f"two runs' {self._what()} ({settings}) in {len(self.samples)} samples: the difference comes from fusion with "
                "nodes outside it or from its context in the full model")

    @property
    def off_native(self) -> bool:
        """A side was replayed on another instruction set than this processor's (so each side names its own)."""
        return any(side.isa != NATIVE for side in self.sides)

    def _what(self) -> str:
        return "options and instruction sets" if self.off_native else "options"


# --- the isolated model -------------------------------------------------------------------------------------------


def _declared(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """The value types the model declares, completed by ONNX shape inference where it can."""
    found: dict[str, onnx.ValueInfoProto] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
        found.update({v.name: v for v in inferred.value_info})
    except Exception:  # noqa: BLE001 - inference is a help; contrib ops often defeat it
        pass
    graph = model.graph
    found.update({v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)})
    return {name: v for name, v in found.items() if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


def _fits(value: onnx.ValueInfoProto, array: np.ndarray | None) -> bool:
    """A declared type that the recorded array can be fed to (its element type, rank and fixed sizes)."""
    if array is None:
        return True
    tensor = value.type.tensor_type
    try:
        if np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)) != array.dtype:
            return False
    except (KeyError, TypeError, ValueError):
        return False
    if not tensor.HasField("shape"):
        return True
    dims = tensor.shape.dim
    return len(dims) == array.ndim and all(not d.HasField("dim_value") or d.dim_value == n for d, n in zip(dims, array.shape))


def boundary(model: onnx.ModelProto, nodes: Sequence[str], outputs: Sequence[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The activations ``nodes`` read that none of them computes (what ``isolate``'s model is fed), and the
    tensors it outputs (see ``isolate``)."""
    plan = _plan(model.graph, nodes, outputs)
    return tuple(plan[2]), tuple(plan[4])


def _plan(graph: onnx.GraphProto, nodes: Sequence[str], outputs: Sequence[str]):
    """(node names, chosen node indices, fed tensors, carried constants, outputs, produced tensors)."""
    names = node_names(graph)
    if not nodes:
        raise ConfigError("replay: give at least one node")
    unknown = [n for n in dict.fromkeys(nodes) if n not in set(names)]
    if unknown:
        raise ConfigError(f"replay: the model has no node named {unknown[0]!r}")
    wanted = set(nodes)
    chosen = [i for i, name in enumerate(names) if name in wanted]
    produced = {o for i in chosen for o in graph.node[i].output if o}
    reads = list(dict.fromkeys(r for i in chosen for r in node_reads(graph.node[i])))
    initializers = {i.name for i in graph.initializer}
    constant = {o for i, node in enumerate(graph.node) if node.op_type == "Constant" and i not in chosen for o in node.output}
    outside = [r for r in reads if r not in produced]
    carried = [r for r in outside if r in initializers or r in constant]
    fed = [r for r in outside if r not in carried]
    outputs = list(outputs) or _outputs(graph, chosen, produced)
    missing = [o for o in outputs if o not in produced]
    if missing:
        raise ConfigError(f"replay: no node of the set computes {missing[0]!r}")
    return names, chosen, fed, carried, outputs, produced


def isolate(model: onnx.ModelProto, nodes: Sequence[str], outputs: Sequence[str] = (),
            examples: Mapping[str, np.ndarray] | None = None) -> IsolatedModel:
    """``nodes`` of ``model`` (names as ``inference.graphmap.node_names`` gives them) as a model of their own.

    Its outputs are ``outputs`` when given, else the tensors of the set that a node outside it reads or that
    are the model's outputs (else those no node of the set reads). ``examples`` (recorded arrays by tensor
    name) give the type of an input the model does not declare. ``ConfigError`` for a name the model lacks."""
    graph = model.graph
    names, chosen, fed, carried, outputs, produced = _plan(graph, nodes, outputs)
    initializers = {i.name: i for i in graph.initializer}
    constant = {o: node for i, node in enumerate(graph.node) if node.op_type == "Constant" and i not in chosen
                for o in node.output}
    declared = _declared(model)
    examples = examples or {}
    inputs = [_value(name, declared, examples.get(name)) for name in fed]
    kept_nodes = list({id(constant[c]): constant[c] for c in carried if c in constant}.values())
    isolated = onnx.helper.make_graph(
        kept_nodes + [graph.node[i] for i in chosen], f"replay of {', '.join(names[i] for i in chosen)}"[:200], inputs,
        [declared.get(o) or onnx.ValueInfoProto(name=o) for o in outputs],
        initializer=[initializers[c] for c in carried if c in initializers],
        value_info=[declared[t] for t in sorted(produced - set(outputs)) if t in declared],
    )
    small = onnx.helper.make_model(isolated, opset_imports=list(model.opset_import), functions=list(model.functions))
    small.ir_version = model.ir_version
    return IsolatedModel(small.SerializeToString(), tuple(names[i] for i in chosen), tuple(fed), tuple(outputs),
                         tuple(carried))


def _outputs(graph: onnx.GraphProto, chosen: list[int], produced: set[str]) -> list[str]:
    inside = set(chosen)
    read_outside = {r for i, node in enumerate(graph.node) if i not in inside for r in node_reads(node)}
    final = {o.name for o in graph.output}
    ordered = [o for i in chosen for o in graph.node[i].output if o]
    leaving = [o for o in ordered if o in read_outside or o in final]
    if leaving:
        return leaving
    read_inside = {r for i in chosen for r in node_reads(graph.node[i])}
    return [o for o in ordered if o not in read_inside] or ordered


def _value(name: str, declared: dict[str, onnx.ValueInfoProto], example: np.ndarray | None) -> onnx.ValueInfoProto:
    """The graph input of the isolated model: the type the model declares, else the recorded array's."""
    value = declared.get(name)
    if value is not None and _fits(value, example):
        return value
    if example is None:
        raise ConfigError(f"replay: the type of input {name!r} is not declared in the model and no array of it was given")
    elem = onnx.helper.np_dtype_to_tensor_dtype(example.dtype)
    return onnx.helper.make_tensor_value_info(name, elem, list(example.shape))


# --- running it ---------------------------------------------------------------------------------------------------


def _digest(arrays: Sequence[np.ndarray]) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def _load(model: Path | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    return read_onnx(model, external_data=True, what="model", error=RunStoreError)


def replay_nodes(
    model: Path | onnx.ModelProto | Sequence[Path | onnx.ModelProto],
    nodes: Sequence[str],
    inputs: Mapping[int, Mapping[str, np.ndarray]],
    options: Sequence[ExecutionOptions],
    runs: Sequence[str] = ("A", "B"),
    outputs: Sequence[str] = (),
    recorded: Sequence[Mapping[int, Mapping[str, np.ndarray]]] = (),
    isas: Sequence[str] = (),
    refused: Mapping[tuple[int, str], str] | None = None,
    graphs_on: Mapping[tuple[int, str], int] | None = None,
) -> NodeReplay:
    """Run ``nodes`` of ``model`` (one model, or one per run: each run's own weights) on ``inputs`` (sample ->
    tensor name -> array; the activations the nodes read) under each of ``options`` (one per run, named by
    ``runs``), and compare the outputs of the first two, sample by sample, bit for bit.

    ``isas`` (one per run, resolved: ``native`` or a QEMU CPU model; default native for both) is the instruction
    set each run's replay runs on; where they differ, both runs' options are also replayed under each of them
    (``NodeReplay.same_isa``). ``ConfigError`` for a node the model lacks or an input not given; a session
    onnxruntime cannot make (the provider is not on this machine) is a ``cannot replay`` outcome, with
    onnxruntime's reason, as is a failure of the emulated child (``EmulatedChildError``'s line). ``recorded``
    (per run: sample -> output tensor -> the array the run itself recorded) says whether the replay under each
    run's options gives what that run computed in the full model (``ReplaySide.recorded``). ``refused``: (side index, instruction
    set) -> why that side's nodes cannot run there (a graph held in another processor's NCHWc blocks): not run,
    and the same-instruction-set check there gives that reason. ``graphs_on``: (side index, instruction set) -> the
    index of the model whose nodes that side's options run there (default its own)."""
    models = [model] * len(options) if isinstance(model, (str, Path, onnx.ModelProto)) else list(model)
    isas = list(isas) or [NATIVE] * len(options)
    if len(options) != 2 or len(models) != 2 or len(runs) != 2:
        raise ConfigError("replay: give the execution options (and models) of exactly two runs")
    if len(isas) != 2:
        raise ConfigError("replay: give the instruction sets of exactly two runs")
    samples = sorted(inputs)
    if not samples:
        raise ConfigError("replay: no sample to replay")
    examples = dict(inputs[samples[0]])
    loaded = [_load(m) for m in models]
    first_isolated = isolate(loaded[0], nodes, outputs, examples)
    isolated = [first_isolated, first_isolated if loaded[1] is loaded[0] else isolate(loaded[1], nodes, outputs, examples)]
    first = isolated[0]
    lacking = [name for name in first.inputs if any(name not in inputs[s] for s in samples)]
    if lacking:
        raise ConfigError(f"replay: no array given for input {lacking[0]!r} of {', '.join(first.nodes)}")
    result = NodeReplay(list(first.nodes), ReplayOutcome.CANNOT, list(first.inputs), list(first.outputs), samples,
                        [ReplaySide(run, opts, isa=isa) for run, opts, isa in zip(runs, options, isas)])
    # (side, instruction set) -> outputs per sample: each side on its own, and, where the sets differ, each on both
    wanted = [(0, isas[0]), (1, isas[1])]
    if isas[0] != isas[1]:
        wanted += [(1, isas[0]), (0, isas[1])]
    refused = dict(refused or {})
    produced, errors = _run_everywhere(isolated, options, [w for w in wanted if w not in refused], inputs, samples,
                                       list(first.inputs), list(first.outputs), dict(graphs_on or {}))
    errors.update({w: refused[w] for w in wanted if w in refused})
    main = [errors.get((i, isas[i])) for i in range(2)]
    if any(main):
        failed = 0 if main[0] else 1
        where = "" if isas[failed] == NATIVE else f" on emulated {isas[failed]}"
        result.reason = f"onnxruntime cannot run the isolated nodes here{where}: {main[failed]}"
        return result
    for index, side in enumerate(result.sides):
        per_sample = produced[(index, side.isa)]
        side.hashes = [_digest(arrays) for arrays in per_sample]
        if index < len(recorded):
            side.recorded = _against(recorded[index], samples, list(first.outputs), per_sample)
    result.constants_differ = constants_differ(*isolated)
    _compare(result, produced[(0, isas[0])], produced[(1, isas[1])])
    result.outcome = ReplayOutcome.CONFIRMED if result.differing else ReplayOutcome.NOT_REPRODUCED
    if isas[0] != isas[1]:
        for isa in isas:
            check = SameIsaReplay(isa, len(samples))
            failed = errors.get((0, isa)) or errors.get((1, isa))
            if failed:
                check.reason = failed
            else:
                probe = NodeReplay(list(first.nodes), ReplayOutcome.CANNOT, samples=samples)
                _compare(probe, produced[(0, isa)], produced[(1, isa)])
                check.differing = probe.differing
            result.same_isa.append(check)
    return result


def _run_everywhere(isolated: Sequence[IsolatedModel], options: Sequence[ExecutionOptions], wanted: list[tuple[int, str]],
                    inputs: Mapping[int, Mapping[str, np.ndarray]], samples: list[int], fed: list[str], outputs: list[str],
                    graphs_on: Mapping[tuple[int, str], int] | None = None,
                    ) -> tuple[dict[tuple[int, str], list[list[np.ndarray]]], dict[tuple[int, str], str]]:
    """Each (side, instruction set) of ``wanted``: side's isolated model (or the one ``graphs_on`` names) under its
    options on that instruction set,
    one ``run_isolated`` call per instruction set (one child under QEMU for an emulated one). The outputs per
    sample, and onnxruntime's (or the child's) one line where one could not run."""
    produced: dict[tuple[int, str], list[list[np.ndarray]]] = {}
    errors: dict[tuple[int, str], str] = {}
    with scratch_dir("qconsist-replay-") as tmp:
        folder = Path(tmp)
        paths = []
        for index, small in enumerate(isolated):
            paths.append(folder / f"side{index}.onnx")
            paths[-1].write_bytes(small.model)
        np.savez(folder / "inputs.npz", **{f"{s}:{name}": inputs[s][name] for s in samples for name in fed})
        for isa in dict.fromkeys(isa for _, isa in wanted):
            jobs = [side for side, where in wanted if where == isa]
            request = {"inputs": str(folder / "inputs.npz"), "samples": samples, "fed": fed, "outputs": outputs,
                       "jobs": [{"model": str(paths[(graphs_on or {}).get((side, isa), side)]), "options": options[side].to_json(),
                                 "result": str(folder / f"{isa}-{side}.npz")} for side in jobs]}
            try:
                done, _ = call_on(isa, run_isolated, request, what="the replay")
            except QconsistError as exc:
                errors.update({(side, isa): str(exc) for side in jobs})
                continue
            for side, error in zip(jobs, done["errors"]):
                if error:
                    errors[(side, isa)] = error
                    continue
                with np.load(folder / f"{isa}-{side}.npz") as saved:
                    produced[(side, isa)] = [[saved[f"{s}:{k}"] for k in range(len(outputs))] for s in samples]
    return produced, errors


def run_isolated(request: dict) -> dict:
    """The replay's sessions (here, or in the child under QEMU that ``call_on`` starts): each job's isolated
    model under its options on the request's samples, the outputs saved to the job's ``.npz``. Returns, per job,
    onnxruntime's one line where it cannot make or run the session, else ""."""
    errors = []
    with np.load(request["inputs"]) as saved:
        feeds = {s: {name: saved[f"{s}:{name}"] for name in request["fed"]} for s in request["samples"]}
    for job in request["jobs"]:
        try:
            with ort_logged():
                session = create_session(Path(job["model"]).read_bytes(), ExecutionOptions.from_json(job["options"]))
                got = {s: session.run(list(request["outputs"]), feeds[s]) for s in request["samples"]}
        except QconsistError as exc:
            errors.append(str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types at run time
            errors.append(" ".join(str(exc).split())[:300])
            continue
        np.savez(job["result"], **{f"{s}:{k}": array for s, arrays in got.items() for k, array in enumerate(arrays)})
        errors.append("")
    return {"errors": errors}


def constants_differ(a: IsolatedModel, b: IsolatedModel) -> list[str]:
    """The constants (by value) and node attributes two runs' isolated nodes differ in."""
    if a.model == b.model:
        return []
    ga, gb = onnx.load_from_string(a.model).graph, onnx.load_from_string(b.model).graph
    values = [_constant_values(g) for g in (ga, gb)]
    names = [c for c in dict.fromkeys([*a.constants, *b.constants])
             if c not in values[0] or c not in values[1] or not _same_array(values[0][c], values[1][c])]
    computing = [[n for n in g.node if n.op_type != "Constant"] for g in (ga, gb)]
    if [(n.op_type, n.domain, list(n.input), list(n.output), [x.SerializeToString() for x in n.attribute])
            for n in computing[0]] != [(n.op_type, n.domain, list(n.input), list(n.output),
                                        [x.SerializeToString() for x in n.attribute]) for n in computing[1]]:
        names.append("node attributes")
    return names


def _constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    found = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    found[node.output[0]] = numpy_helper.to_array(attribute.t)
    return found


def _same_array(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _against(recorded: Mapping[int, Mapping[str, np.ndarray]], samples: list[int], names: list[str],
             produced: list[list[np.ndarray]]) -> str:
    """"matches" when every output the run recorded equals the replay's, bit for bit, "differs" when one does
    not, "" when the run recorded none of them."""
    compared = 0
    for sample, arrays in zip(samples, produced):
        kept = recorded.get(sample, {})
        for name, array in zip(names, arrays):
            if name not in kept:
                continue
            compared += 1
            other = kept[name]
            if other.shape != array.shape or other.dtype != array.dtype or other.tobytes() != array.tobytes():
                return "differs"
    return "matches" if compared else ""


def _compare(result: NodeReplay, a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> None:
    for sample, xs, ys in zip(result.samples, a, b):
        differs = False
        for x, y in zip(xs, ys):
            result.elements += int(x.size)
            if x.shape != y.shape or x.dtype != y.dtype:
                differs = True
                result.mismatched += int(max(x.size, y.size))
                result.max_abs = float("inf")
                continue
            if x.tobytes() == y.tobytes():
                continue
            differs = True
            xf, yf = x.astype(np.float64), y.astype(np.float64)
            unequal = ~((xf == yf) | (np.isnan(xf) & np.isnan(yf)))
            result.mismatched += int(unequal.sum())
            with np.errstate(invalid="ignore"):
                gap = np.abs(xf - yf)[unequal]
            if gap.size:
                result.max_abs = max(result.max_abs, float(np.nanmax(gap)) if not np.isnan(gap).all() else float("nan"))
        if differs:
            result.differing.append(sample)
