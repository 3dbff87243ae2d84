"""``qconsist diff --replay``: each origin and span the diff names, replayed from the two runs' own records.

For an origin (the tensor the diff found differing while the nearest tensors both runs observed are
identical), the span replayed is every original node between those observed tensors and it (``span_nodes``).
Its inputs come from the runs' records: a model input from the run's input set, opened again and checked
against its digest (``explain.replay``); any other tensor from the raw tensors a dump kept (``run --dump --raw
NAMES``). Where both runs kept one, their bytes must agree (else the node is not an origin in that sample and
the sample is not replayed); where only one run recorded it, that run's values are fed to both, and
``NodeReplay.sources`` says so. Each run's nodes are taken from its own model and run under its own execution
options (``diff.replay.replay_nodes``); where a run kept its output raw, the replay is also checked against
what that run computed in the full model (``ReplaySide.recorded``).

Each run's nodes are replayed on the instruction set the run recorded (``recorded_isa``): a run made under
``run --isa haswell`` again under emulated Haswell (QEMU user mode, ``qconsist.emulation``), a native run on this
processor; ``isa`` (``diff --replay --isa MODEL``) replays both on one instead. Where the two differ, both runs'
options are also replayed under each, and the replay says whether the instruction set alone makes the
difference (``NodeReplay.instruction_sets``).

Runs whose float graphs hold NCHWc blocks of two sizes (an AVX-512 processor's 16 against AVX2's or SSE's 8) are
replayed each from its own optimized graph on its own instruction set, blocked tensors fed and compared in NCHW
(``_replay_across_blocks``): the form both dumps record them in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.diff.replay import NodeReplay, ReplayOutcome, boundary, constants_differ, isolate, replay_nodes
from qconsist.cpu import instruction_set
from qconsist.diff.runs import DiffResult, capture_command
from qconsist.emulation import NATIVE, PACKAGE, QEMU, call_on, qemu_path
from qconsist.errors import ConfigError, QconsistError, RunStoreError
from qconsist.explain.replay import replay_inputs
from qconsist.inference.graphmap import node_names, node_reads
from qconsist.inference.layout import block_size, nchwc_filters, unblock_filter
from qconsist.inference.reader import LoadedDump, load_dump
from qconsist.inference.session import ExecutionOptions, OptimizationLevel
from qconsist.onnxfile import read_onnx
from qconsist.store.run import Run


_NCHWC = "com.microsoft.nchwc"
REPLAYED_SAMPLES = 8  # samples replayed per origin (its first origin samples that have recorded inputs)


def _columns(dump: LoadedDump, space: str = "original") -> dict[str, int]:
    """Original tensor -> the first column of the dump holding it (in the original's axis order); in the
    ``optimized`` space, the optimized graph's tensor -> its column, for the tensors whose raw arrays can be
    fed to its nodes as onnxruntime holds them (not those recorded unblocked from NCHWc, nor of an unknown
    layout); in the ``unblocked`` space also those recorded unblocked (fed in NCHW and blocked again for the graph
    that reads them, ``_in_nchw``)."""
    found: dict[str, int] = {}
    for column, tensor in enumerate(dump.tensors):
        if space in ("optimized", "unblocked"):
            if tensor.how != "layout unknown" and (space == "unblocked" or not (tensor.blocked and tensor.channels)):
                found.setdefault(tensor.name, column)
        elif tensor.original and tensor.how != "layout unknown" and tensor.original not in found:
            found[tensor.original] = column
    return found


def span_nodes(model: onnx.ModelProto, tensor: str, observed: set[str]) -> list[str]:
    """The original nodes between the nearest ``observed`` tensors (or model inputs, initializers, constants)
    upstream of ``tensor`` and ``tensor``, in graph order: what computed ``tensor`` from what both runs saw."""
    graph = model.graph
    names = node_names(graph)
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    if tensor not in producer:
        raise ConfigError(f"replay: no node of the model computes {tensor!r}")
    chosen: set[int] = set()
    stack = [producer[tensor]]
    while stack:
        index = stack.pop()
        if index in chosen:
            continue
        chosen.add(index)
        for name in node_reads(graph.node[index]):
            upstream = producer.get(name)
            if upstream is None or name in observed or graph.node[upstream].op_type == "Constant":
                continue
            stack.append(upstream)
    return [names[i] for i in sorted(chosen)]


@dataclass
class _Side:
    """One run as the replay reads it."""

    label: str
    run: Run
    dump: LoadedDump
    model: Path
    options: ExecutionOptions
    columns: dict[str, int]
    isa: str = NATIVE  # the instruction set its nodes are replayed on
    note: str = ""  # why that is not the one the run recorded, where it is not
    ran: Path | None = None  # the model the run ran (its inputs), where ``model`` is its optimized graph
    space: str = "original"


def recorded_isa(run: Run, label: str) -> tuple[str, str]:
    """The instruction set to replay ``run`` on: the QEMU CPU model it was emulated under, else ``native``; and a
    note where this processor is not the one the run recorded (an older run without a record, another machine)."""
    recorded = run.manifest.environment.get("cpu_isa") or {}
    if recorded.get("emulated"):
        return str(recorded["emulated"]), ""
    if not recorded:
        return NATIVE, f"run {label} does not record its instruction set: replayed on this processor"
    here = instruction_set()
    if (recorded.get("kernels"), recorded.get("float_kernels")) != (here.kernels, here.float_kernels):
        return NATIVE, (f"run {label} was made natively on another processor ({recorded.get('kernels')}, float "
                        f"{recorded.get('float_kernels')}) and is replayed on this one ({here.kernels}, float "
                        f"{here.float_kernels}): --isa MODEL replays both runs on one instruction set")
    return NATIVE, ""


def _side(label: str, run: Run, dump: LoadedDump | None, isa: str | None = None,
          space: str = "original") -> _Side | str:
    """The run's dump, model and options, or why it cannot be replayed; ``isa`` (resolved) replays it on that
    instruction set instead of the one it recorded. In the ``optimized`` space its nodes are cut from the
    optimized graph its dump saved, and run at level disable (the graph is optimized already)."""
    if not run.has_inference or not run.inference.options:
        return f"run {label} does not record its execution options"
    if not run.has_dump:
        return f"run {label} has no tensor dump; rerun it with --dump"
    model = run.ran_model()
    if model is None:
        return f"the model run {label} ran is gone"
    chosen, note = (isa, "") if isa is not None else recorded_isa(run, label)
    if chosen != NATIVE and qemu_path() is None:
        return (f"run {label} was made under emulated {chosen} and is replayed on it under QEMU user mode, and {QEMU} "
                f"is not installed: install the {PACKAGE} package (apt-get install {PACKAGE}; `make qemu` does it), "
                "or replay both runs on this processor with --isa native")
    dump = dump if dump is not None else load_dump(run)
    options = ExecutionOptions.from_json(run.inference.options)
    if space in ("optimized", "unblocked"):
        options = replace(options, graph_optimization_level=OptimizationLevel.DISABLE, disabled_optimizers=())
        return _Side(label, run, dump, dump.optimized_path, options, _columns(dump, space), chosen, note, model, space)
    return _Side(label, run, dump, model, options, _columns(dump), chosen, note)


def replay_origin(run_a: Run, run_b: Run, nodes: Sequence[str], samples: Sequence[int], label: str = "",
                  dumps: tuple[LoadedDump, LoadedDump] | None = None, limit: int = REPLAYED_SAMPLES,
                  models: dict[Path, onnx.ModelProto] | None = None, isa: str | None = None,
                  space: str = "original") -> NodeReplay:
    """Replay ``nodes`` (original node names) on the first ``limit`` of ``samples`` whose inputs the runs
    recorded, each run's nodes under its own options (see the module docstring). ``dumps`` and ``models`` (by
    path): what the caller has loaded already; ``isa`` (resolved): both runs on that instruction set instead of
    the ones they recorded; ``space`` ``optimized``: ``nodes`` are nodes of onnxruntime's optimized graph, cut
    from the one each run's dump saved (the diff compared the runs there); ``unblocked``: the same, for runs whose
    graphs hold NCHWc blocks of two sizes (``_replay_across_blocks``)."""
    sides = [_side(name, run, dump, isa, space)
             for name, run, dump in zip("AB", (run_a, run_b), dumps if dumps else (None, None))]
    reasons = [s for s in sides if isinstance(s, str)]
    if reasons:
        return NodeReplay(list(nodes), ReplayOutcome.CANNOT, reason="; ".join(reasons), label=label)
    a, b = sides  # type: ignore[misc]
    models = models if models is not None else {}
    for path in (a.model, b.model):
        if path not in models:
            models[path] = read_onnx(path, external_data=True, what="model", error=RunStoreError)
    original = models[a.model]
    fed, outputs = boundary(original, nodes)
    model_inputs = {v.name for v in original.graph.input} - {i.name for i in original.graph.initializer}
    recorded = [r for r in fed if r not in model_inputs]
    missing = [(r, [s for s in (a, b) if r in s.columns]) for r in recorded]
    unobserved = [r for r, where in missing if not where]
    if unobserved:
        return NodeReplay(list(nodes), ReplayOutcome.CANNOT, list(fed), list(outputs), label=label, reason=(
            f"{unobserved[0]} is observed in neither run's dump (computed inside a fused kernel, or held in a layout "
            "not established); replay a span that starts at tensors the runs observe"))
    chosen, sources, skipped = _recorded_inputs(a, b, recorded, outputs, samples, limit)
    if not chosen:
        return _cannot(nodes, fed, outputs, label, a, b, recorded, outputs, samples, skipped)
    inputs = {s: dict(values) for s, (values, _) in chosen.items()}
    if set(fed) & model_inputs:
        try:
            opened = _reopened(a, b)
        except RunStoreError as exc:
            return NodeReplay(list(nodes), ReplayOutcome.CANNOT, list(fed), list(outputs), label=label,
                              reason=f"its model input cannot be fed again: {exc}")
        for sample in inputs:
            values = opened.sample(sample)
            inputs[sample].update({name: values[name] for name in fed if name in model_inputs})
        sources.update({name: "the input set, opened again (digest checked)" for name in fed if name in model_inputs})
    kept = [{s: per_run[i] for s, (_, per_run) in chosen.items()} for i in range(2)]
    blocked = _blocked_nodes(original, nodes) if space == "optimized" else []
    unblockable = _blocks_apart(blocked, a, b, isa)
    if unblockable:
        return NodeReplay(list(nodes), ReplayOutcome.CANNOT, list(fed), list(outputs), label=label, reason=unblockable)
    if space == "unblocked":
        result = _replay_across_blocks((a, b), (original, models[b.model]), nodes, fed, outputs, inputs, kept, isa)
        result.sources, result.label = sources, label
        if result.outcome is ReplayOutcome.CANNOT:
            return result
    else:
        result = replay_nodes((original, models[b.model]), nodes, inputs, (a.options, b.options), ("A", "B"), outputs,
                              kept, (a.isa, b.isa))
        result.sources, result.label = sources, label
    if space in ("optimized", "unblocked"):
        result.notes.append("replayed from onnxruntime's optimized graph that each run's dump saved (the nodes the "
                            "run executed), at level disable: the graph is optimized already")
    result.notes.extend(side.note for side in (a, b) if side.note)
    if isa is not None:
        recorded = [recorded_isa(side.run, side.label)[0] for side in (a, b)]
        if recorded[0] != recorded[1]:
            result.notes.append(f"the runs were made on different instruction sets ({recorded[0]}, {recorded[1]}) and "
                                f"--isa replayed both on {isa}: this replay leaves the instruction set out (without --isa "
                                "each run is replayed on its own)")
    batches = [s.run.inference.batch_size for s in (a, b)]
    if batches != [1, 1]:
        result.notes.append(f"replayed one sample at a time; the runs ran batches of {batches[0]} and {batches[1]}")
    if skipped:
        result.notes.append(f"samples {', '.join(map(str, skipped[:8]))} not replayed: the runs' recorded inputs differ there")
    return result


def _reopened(a: _Side, b: _Side):
    """The input set of run A, opened again and checked against its digest, else run B's (the runs' digests
    agree: ``diff`` refuses runs on different input sets)."""
    try:
        return replay_inputs(a.run, a.ran or a.model)[0]
    except RunStoreError:
        return replay_inputs(b.run, b.ran or b.model)[0]


def _recorded_inputs(a: _Side, b: _Side, recorded: list[str], outputs: Sequence[str], samples: Sequence[int],
                     limit: int) -> tuple[dict[int, tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]], dict[str, str], list[int]]:
    """Per sample (the first ``limit`` with every input recorded): the inputs to feed and each run's recorded
    outputs; where each input came from; the samples skipped because the runs' inputs differ."""
    chosen: dict[int, tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]] = {}
    sources: dict[str, str] = {}
    skipped: list[int] = []
    raw = [s.dump.raw_samples() for s in (a, b)]
    for sample in samples:
        if len(chosen) >= limit:
            break
        arrays = [_raw(side, sample, [*recorded, *outputs]) if sample in kept else {}
                  for side, kept in zip((a, b), raw)]
        feed, differs = {}, False
        for name in recorded:
            got = [x.get(name) for x in arrays]
            if got[0] is not None and got[1] is not None:
                if got[0].dtype != got[1].dtype or got[0].shape != got[1].shape or got[0].tobytes() != got[1].tobytes():
                    differs = True
                    break
                sources.setdefault(name, "runs A and B (bit-identical)")
            elif got[0] is None and got[1] is None:
                break
            else:
                only = "A" if got[0] is not None else "B"
                other = b if only == "A" else a
                why = "does not keep it raw" if name in other.columns else "does not observe it"
                sources.setdefault(name, f"run {only} only (run {'B' if only == 'A' else 'A'} {why})")
            feed[name] = got[0] if got[0] is not None else got[1]
        if differs:
            skipped.append(int(sample))
            continue
        if len(feed) == len(recorded):
            chosen[int(sample)] = (feed, [{o: x[o] for o in outputs if o in x} for x in arrays])
    return chosen, sources, skipped


def _raw(side: _Side, sample: int, names: list[str]) -> dict[str, np.ndarray]:
    """The raw arrays of ``names`` in ``sample``: in the original's axis order, or in the optimized space as
    onnxruntime held them (a relaid tensor recorded in the original's order transposed back by its layout)."""
    columns = {side.columns[n]: n for n in names if n in side.columns}
    found = {}
    for column, array in side.dump.raw_arrays(sample, sorted(columns)).items():
        tensor = side.dump.tensors[column]
        if side.space in ("optimized", "unblocked") and side.dump.original_order and tensor.original and tensor.layout:
            array = np.ascontiguousarray(np.transpose(array, tensor.layout))
        found[columns[column]] = array
    return found


def _cannot(nodes: Sequence[str], fed: Sequence[str], outputs: Sequence[str], label: str, a: _Side, b: _Side,
            recorded: list[str], wanted_outputs: Sequence[str], samples: Sequence[int], skipped: list[int]) -> NodeReplay:
    """No sample with every input recorded: which inputs lack raw tensors, and the commands that keep them."""
    shown = ", ".join(str(s) for s in list(samples)[:8]) + (", ..." if len(samples) > 8 else "")
    if skipped:
        reason = (f"its recorded inputs differ between the runs in samples {', '.join(map(str, skipped[:8]))}: it is "
                  "not an origin there")
        return NodeReplay(list(nodes), ReplayOutcome.CANNOT, list(fed), list(outputs), label=label, reason=reason)
    keys = list(dict.fromkeys([*recorded, *wanted_outputs]))
    capture = [capture_command(side.run, kept) for side in (a, b) if (kept := [k for k in keys if k in side.columns])]
    reason = (f"no raw tensors of {', '.join(recorded)} in samples {shown}; record them with the capture "
              "commands (run --dump --raw) and diff the new runs")
    return NodeReplay(list(nodes), ReplayOutcome.CANNOT, list(fed), list(outputs), label=label, reason=reason,
                      capture=capture)


def confirm_origins(result: DiffResult, limit: int = REPLAYED_SAMPLES, isa: str | None = None) -> list[NodeReplay]:
    """Replay every origin and every span of ``result`` (a diff of two inference runs with dumps); the replays are
    also put in ``result.replays``. Nothing to replay (no origin or span) gives an empty list. ``isa`` (resolved:
    ``qconsist.emulation.parse_model``): both runs on that instruction set; default each on the one it recorded."""
    result.replays = []
    if result.tensors is None:
        result.notes.append("replay: the runs have no tensor comparison (both need --dump), so no origin to replay")
        return []
    findings = [n for n in result.tensors.nodes if n.finding]  # origins and spans (compare.origin)
    if not findings:
        return []
    run_a, run_b = Run.open(result.run_a), Run.open(result.run_b)
    dumps = (load_dump(run_a), load_dump(run_b))
    model = run_a.ran_model()
    if model is None:
        raise RunStoreError(f"the model run {result.run_a} ran is gone: nothing to replay")
    original = read_onnx(model, external_data=True, what="model", error=RunStoreError)
    models = {model: original}
    columns = [_columns(d) for d in dumps]
    observed = set(columns[0]) & set(columns[1])
    by_name = {t.name: t.original for t in dumps[0].tensors}
    inside = {t.name: t.branch for t in dumps[0].tensors if t.how == "branch"}
    replays = []
    for origin in findings:
        tensor = origin.key if result.tensors.space == "original" else by_name.get(origin.key)
        if origin.key in inside or tensor in inside:  # computed inside an If branch (inference/branches.py)
            branch = inside.get(origin.key) or inside.get(tensor) or ("an If branch",)
            replays.append(NodeReplay([origin.label], ReplayOutcome.CANNOT, label=origin.label, reason=(
                f"it runs inside {branch[-1]} (a branch of an If): a node inside a subgraph is not replayed on its "
                "own; the dumps' recorded values of it and of everything it reads are the evidence")))
            continue
        try:
            if not tensor:  # a tensor of ORT's optimized graph alone: its nodes, cut from the graph each dump saved
                replays.append(_replay_optimized(run_a, run_b, origin, dumps, limit, models, isa))
                continue
            nodes = span_nodes(original, tensor, observed - {tensor})
            replays.append(replay_origin(run_a, run_b, nodes, origin.origin_samples, origin.label, dumps, limit, models, isa))
        except QconsistError as exc:
            replays.append(NodeReplay([origin.label], ReplayOutcome.CANNOT, label=origin.label, reason=str(exc)))
    result.replays = replays
    return replays


def _replay_optimized(run_a: Run, run_b: Run, origin, dumps: tuple[LoadedDump, LoadedDump], limit: int,
                      models: dict[Path, onnx.ModelProto], isa: str | None) -> NodeReplay:
    """An origin (or span) the diff found in onnxruntime's optimized graph whose tensor the original model lacks
    (a fused node's): its nodes cut from the optimized graph, between the optimized tensors both dumps observe."""
    path = dumps[0].optimized_path
    if path not in models:
        models[path] = read_onnx(path, external_data=True, what="optimized graph", error=RunStoreError)
    blocks = (dumps[0].nchwc_block, dumps[1].nchwc_block)
    space = "unblocked" if blocks[0] and blocks[1] and blocks[0] != blocks[1] else "optimized"
    observed = set(_columns(dumps[0], space)) & set(_columns(dumps[1], space))
    nodes = span_nodes(models[path], origin.key, observed - {origin.key})
    return replay_origin(run_a, run_b, nodes, origin.origin_samples, origin.label, dumps, limit, models, isa,
                         space=space)


def _blocked_nodes(graph_model: onnx.ModelProto, nodes: Sequence[str]) -> list[str]:
    """The nodes among ``nodes`` that onnxruntime's NchwcTransformer made (domain ``com.microsoft.nchwc``)."""
    wanted = set(nodes)
    return [name for name, node in zip(node_names(graph_model.graph), graph_model.graph.node)
            if name in wanted and node.domain == "com.microsoft.nchwc"]


def _blocks_apart(blocked: list[str], a: _Side, b: _Side, isa: str | None) -> str:
    """Why NCHWc nodes of the runs' optimized graphs cannot be replayed where asked, else "". Their tensors and
    filters are held in channel blocks of the processor's vector width (``dump.nchwc_block``): runs of two blocks
    compute outputs that cannot be compared as held, and a graph runs only where the block is its own. Runs of
    one block run on each other's instruction set (same block), and on ``isa`` only where its block is known
    to be theirs (one of the runs' own, or this processor's)."""
    if not blocked:
        return ""
    shown = ", ".join(blocked[:3])
    blocks = (a.dump.nchwc_block, b.dump.nchwc_block)
    if blocks[0] != blocks[1] or not blocks[0]:
        return (f"its NCHWc nodes ({shown}) hold their tensors in channel blocks of {blocks[0] or 'unrecorded size'} in "
                f"run A and {blocks[1] or 'unrecorded size'} in run B (the processors' vector widths): their outputs "
                "cannot be compared as onnxruntime holds them")
    if isa is None or isa in {recorded_isa(side.run, side.label)[0] for side in (a, b)}:
        return ""
    here = re.search(r"NCHWc (\d+)", instruction_set().float_kernels) if isa == NATIVE else None
    if here and int(here.group(1)) == blocks[0]:
        return ""
    return (f"its NCHWc nodes ({shown}) hold filters in channel blocks of {blocks[0]}, the runs' processors' width, "
            f"and {isa}'s {'is ' + here.group(1) if here else 'is not recorded'}: replay without --isa, or with one "
            "of the runs' instruction sets")


def _block_of(side: _Side) -> int:
    """The NCHWc block the side's instruction set computes in: the run's own where it is replayed where it ran
    (under the QEMU model it recorded, or natively on a processor like its own), else this processor's (measured)."""
    if side.isa != NATIVE or not side.note:
        return side.dump.nchwc_block
    return block_size()


def measured_block(request: dict) -> dict:
    """The NCHWc block onnxruntime uses where this runs (``layout.block_size``): for ``call_on`` under QEMU."""
    return {"block": block_size()}


def _isa_block(isa: str, sides: Sequence[_Side]) -> int:
    """The NCHWc block of ``isa``: this processor's, a run's made on it, else measured in a child under QEMU."""
    if isa == NATIVE:
        return block_size()
    recorded = [side.dump.nchwc_block for side in sides if recorded_isa(side.run, side.label)[0] == isa]
    if recorded:
        return recorded[0]
    return int(call_on(isa, measured_block, {}, what="the NCHWc block")[0]["block"])


def _replay_across_blocks(sides: tuple[_Side, _Side], graphs: tuple[onnx.ModelProto, onnx.ModelProto],
                          nodes: Sequence[str], fed: Sequence[str], outputs: Sequence[str],
                          inputs: dict[int, dict[str, np.ndarray]], kept: list, isa: str | None) -> NodeReplay:
    """Nodes of two optimized graphs whose NCHWc tensors and filters are held in channel blocks of two sizes (16 on
    AVX-512, 8 on AVX2 and SSE: MLAS's choice for the processor the run ran on): each run's nodes from its own graph
    on its own instruction set, fed the NCHW arrays its dump recorded and blocked again by ReorderInput for that
    graph, their blocked outputs unblocked by ReorderOutput (both exact moves of values, padding channels zero), and
    compared in NCHW without the padding channels: the form both dumps recorded them in. A graph runs only where
    its block is the processor's, so under one instruction set both runs' options run that instruction set's graph,
    where the two graphs agree by value (``_differ_by_value``); else that check says why not (``SameIsaReplay.reason``).
    ``isa``: both runs' options on it (``_replay_on_one``)."""
    a, b = sides
    blocks = (a.dump.nchwc_block, b.dump.nchwc_block)
    shown = ", ".join(list(nodes)[:3]) + (", ..." if len(nodes) > 3 else "")
    held = f"its NCHWc nodes ({shown}) hold their tensors in channel blocks of {blocks[0]} in run A and {blocks[1]} in run B"
    cannot = NodeReplay(list(nodes), ReplayOutcome.CANNOT, list(fed), list(outputs))
    for side, block in zip(sides, blocks):
        if isa is None and _block_of(side) != block:
            cannot.reason = (f"{held}, and run {side.label}'s is replayed on this processor, whose block is "
                             f"{_block_of(side)}: a graph runs only on a processor of its block; --isa MODEL replays "
                             "both runs' options on an instruction set of one of their blocks (e.g. --isa haswell for 8)")
            return cannot
    lacking = [n for n in nodes if n not in set(node_names(graphs[1].graph))]
    if lacking:
        cannot.reason = (f"{held}, and run B's optimized graph has no node {lacking[0]}: onnxruntime made the two graphs "
                         "of other nodes, not only of other blocks")
        return cannot
    channels = [{t.name: t.channels for t in side.dump.tensors if t.blocked and t.channels} for side in sides]
    unknown = [o for o in outputs if any(t.name == o and t.blocked and not t.channels for s in sides for t in s.dump.tensors)]
    if unknown:
        cannot.reason = (f"{held}, and its output {unknown[0]}'s channel count is not established from the graph: the "
                         "runs' outputs cannot be brought to one layout")
        return cannot
    wrapped, added = zip(*(_in_nchw(graph, nodes, fed, outputs, known) for graph, known in zip(graphs, channels)))
    if added[0] != added[1]:
        cannot.reason = f"{held}, and a tensor it reads or writes is blocked in one run's graph only"
        return cannot
    order = [*added[0][0], *nodes, *added[0][1]]
    differ = _differ_by_value(wrapped, order, outputs, inputs[min(inputs)], blocks)
    if isa is not None:
        return _replay_on_one(sides, wrapped, order, nodes, inputs, outputs, kept, isa, differ, held)
    if differ:  # a graph runs only on its own block: the other run's options run it there only if the graphs agree
        why = f"the runs' graphs differ in {', '.join(differ[:4])} by value"
        refused, graphs_on = {(1, a.isa): f"run B's graph holds blocks of {blocks[1]} and {why}",
                              (0, b.isa): f"run A's graph holds blocks of {blocks[0]} and {why}"}, {}
    else:
        refused, graphs_on = {}, {(1, a.isa): 0, (0, b.isa): 1}
    result = replay_nodes(wrapped, order, inputs, (a.options, b.options), ("A", "B"), outputs, kept, (a.isa, b.isa),
                          refused, graphs_on)
    result.nodes = list(nodes)
    if result.outcome is ReplayOutcome.CANNOT:
        return result
    result.constants_differ = differ
    moved = [t for t in (*fed, *outputs) if t in channels[0]]
    result.notes.append(
        f"the runs' graphs hold NCHWc blocks of {blocks[0]} (A) and {blocks[1]} (B), each its processor's: each run's "
        f"nodes were replayed from its own optimized graph on its own instruction set, fed and compared in NCHW "
        f"without padding channels ({', '.join(moved) or 'no blocked tensor'}: blocked again by ReorderInput for the "
        "graph, unblocked by ReorderOutput, exact moves)")
    if not differ:
        result.notes.append(
            f"a graph runs only on a processor of its block, so under the same instruction set both runs' options ran "
            f"that instruction set's graph ({a.isa}: A's, {b.isa}: B's), which equals the other's by value (constants, "
            "filters compared in OIHW, and node attributes)")
    return result


def _differ_by_value(graphs: Sequence[onnx.ModelProto], nodes: Sequence[str], outputs: Sequence[str],
                     example: dict[str, np.ndarray], blocks: tuple[int, int]) -> list[str]:
    """The constants (or "node attributes") the two graphs' ``nodes`` differ in by value: a filter each graph
    reordered for its own block compared in OIHW (``unblock_filter``; padding beyond the smaller one's zero)."""
    isolated = [isolate(graph, nodes, outputs, example) for graph in graphs]
    differ = constants_differ(*isolated)
    forms = [nchwc_filters(graph) for graph in graphs]
    values = [{i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(x.model).graph.initializer} for x in isolated]
    found = []
    for name in differ:
        if name in forms[0] and forms[0][name] == forms[1].get(name) and name in values[0] and name in values[1]:
            oihw = [unblock_filter(values[k][name], blocks[k], forms[k][name]) for k in range(2)]
            if oihw[0] is not None and oihw[1] is not None and _same_padded(oihw[0], oihw[1]):
                continue
        found.append(name)
    return found


def _same_padded(x: np.ndarray, y: np.ndarray) -> bool:
    """Two filters in OIHW, each padded with zero channels to its own block: equal over the smaller one's extent,
    and zero beyond it."""
    if x.dtype != y.dtype or x.ndim != y.ndim or x.shape[2:] != y.shape[2:]:
        return False
    common = tuple(slice(0, min(p, q)) for p, q in zip(x.shape, y.shape))
    if x[common].tobytes() != y[common].tobytes():
        return False
    return all(np.count_nonzero(z) == np.count_nonzero(z[common]) for z in (x, y))


def _in_nchw(model: onnx.ModelProto, nodes: Sequence[str], fed: Sequence[str], outputs: Sequence[str],
             channels: dict[str, int]) -> tuple[onnx.ModelProto, tuple[list[str], list[str]]]:
    """A copy of ``model`` in which ``nodes`` read the blocked tensors among ``fed`` through a ReorderInput (from NCHW,
    into this processor's blocks) and write the blocked ones among ``outputs`` through a ReorderOutput (back to NCHW
    with their ``channels``), each under its own name; and the names of the ReorderInputs and ReorderOutputs added.
    Every node is given its label as name first, so that adding nodes leaves the names of unnamed ones alone."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for node, label in zip(graph.node, node_names(graph)):
        node.name = label
    wanted = set(nodes)
    chosen = [node for node in graph.node if node.name in wanted]
    before: list[onnx.NodeProto] = []
    after: list[onnx.NodeProto] = []
    added: tuple[list[str], list[str]] = ([], [])

    def rename(old: str, new: str, fields: tuple[str, ...]) -> None:
        for node in chosen:
            for field in fields:
                values = getattr(node, field)
                for i, value in enumerate(values):
                    if value == old:
                        values[i] = new

    for name in fed:
        if name in channels:
            rename(name, f"{name}.nchwc", ("input",))
            added[0].append(f"replay.ReorderInput.{name}")
            before.append(onnx.helper.make_node("ReorderInput", [name], [f"{name}.nchwc"], added[0][-1],
                                                domain=_NCHWC, channels_last=0))
    for name in outputs:
        if name in channels:
            rename(name, f"{name}.nchwc", ("input", "output"))
            added[1].append(f"replay.ReorderOutput.{name}")
            after.append(onnx.helper.make_node("ReorderOutput", [f"{name}.nchwc"], [name], added[1][-1], domain=_NCHWC,
                                               channels=channels[name], channels_last=0))
    kept = [*before, *graph.node, *after]
    del graph.node[:]
    graph.node.extend(kept)
    renamed = set(channels) & {*fed, *outputs}
    kept_info = [v for v in graph.value_info if v.name not in renamed]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return copy, added


def _replay_on_one(sides: tuple[_Side, _Side], wrapped: Sequence[onnx.ModelProto], order: list[str],
                   nodes: Sequence[str], inputs: dict[int, dict[str, np.ndarray]], outputs: Sequence[str], kept: list,
                   isa: str, differ: list[str], held: str) -> NodeReplay:
    """``--isa`` for runs of two NCHWc blocks: both runs' options on ``isa``, running the graph of the run whose
    block is ``isa``'s (this processor's, or the block a run made on it recorded), where the graphs agree by value."""
    blocks = [side.dump.nchwc_block for side in sides]
    target = _isa_block(isa, sides)
    cannot = NodeReplay(list(nodes), ReplayOutcome.CANNOT, [], list(outputs))
    if target not in blocks:
        cannot.reason = (f"{held} (the processors' vector widths), and {isa}'s block is {target or 'none'} "
                         "(measured): a graph runs only on a processor of its block; replay without --isa (each run's "
                         "graph on its own instruction set, compared in NCHW) or with an instruction set of one of "
                         "their blocks")
        return cannot
    if differ:
        cannot.reason = (f"{held}, --isa {isa} runs only the graph of block {target}, and the runs' graphs differ in "
                         f"{', '.join(differ[:4])} by value: replay without --isa")
        return cannot
    own = blocks.index(target)
    result = replay_nodes((wrapped[own], wrapped[own]), order, inputs, tuple(side.options for side in sides), ("A", "B"),
                          outputs, kept, (isa, isa))
    result.nodes = list(nodes)
    if result.outcome is not ReplayOutcome.CANNOT:
        result.notes.append(
            f"the runs' graphs hold NCHWc blocks of {blocks[0]} (A) and {blocks[1]} (B), and a graph runs only on a "
            f"processor of its block: on {isa} (block {target}) both runs' options ran run {'AB'[own]}'s graph, which "
            f"equals run {'BA'[own]}'s by value (constants, filters compared in OIHW, and node attributes); blocked "
            "tensors fed and compared in NCHW")
    return result
