"""Which cuDNN kernel ran for each convolution node, per configuration and per run, from cuDNN's own API log.

Sources measured on an H100 (onnxruntime-gpu 1.31.1, cuDNN 9.14/9.19):

* ONNX Runtime's profiler (``enable_profiling``) records one event per node with its shapes and time, and
  no kernel names: the published GPU wheels are built without CUPTI. It cannot say which algorithm ran.
* cuDNN's API log (``CUDNN_LOGLEVEL_DBG=3``, ``CUDNN_LOGDEST_DBG=<file>``), which a release build writes,
  logs every ``cudnnBackendExecuteInternal`` call with the operation (``CONV_FORWARD``,
  ``CONV_BWD_DATA``), the tensor shapes, the convolution's padding/stride/dilation, the **engine id and
  knobs**, and the engine's **numerical notes** — ``CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC`` among them.
  ONNX Runtime 1.31 runs Conv and ConvTranspose through cuDNN's graph (frontend) API: ConvTranspose is a
  ``CONV_BWD_DATA`` graph. Under EXHAUSTIVE the first run also executes the candidate engines it times
  (autotuning); those are kept as ``tried``. Legacy calls (``cudnnConvolutionForward`` /
  ``cudnnConvolutionBackwardData`` with an ``algo``) are read too, with cuDNN's documented list of
  non-reproducible algorithms.

The log must be switched on before cuDNN starts, so the recording runs in a child process: the same model,
execution options and input as the observed session, ``runs`` runs in one session. Between runs the child
calls ``cudnnGetErrorString`` with a marker value, which the log records, so every execution is assigned
to its run without guessing. Each execution is matched to a node of the graph ONNX Runtime runs by its
operation, weight shape, strides, padding and dilation; nodes with the same signature are assigned in
execution order (``by_order``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from qconsist.errors import ConfigError, InputError, UnavailableError
from qconsist.inference.session import ExecutionOptions, create_session
from qconsist.onnxfile import node_label, read_onnx
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

SCHEMA = "qconsist.engines/1"
NONDETERMINISTIC_NOTE = "CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC"
MARKER_BASE = 7_340_000  # cudnnGetErrorString(MARKER_BASE + run) between runs: an out-of-range status the log records
CUDNN_REPRODUCIBILITY = "https://docs.nvidia.com/deeplearning/cudnn/latest/developer/misc.html"
# cuDNN: "the following routines do not guarantee reproducibility across runs ... because they use atomic
# operations": backward data with ALGO_0, backward filter with ALGO_0 or ALGO_3 (CUDNN_REPRODUCIBILITY).
LEGACY_NONDETERMINISTIC = {
    "CUDNN_CONVOLUTION_BWD_DATA_ALGO_0": "backward-data ALGO_0 sums its matrix products with atomic adds",
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0": "backward-filter ALGO_0 accumulates with atomic adds",
    "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3": "backward-filter ALGO_3 accumulates with atomic adds",
}
CONV_OPS = {"Conv": "CONV_FORWARD", "FusedConv": "CONV_FORWARD", "NhwcConv": "CONV_FORWARD",
            "QLinearConv": "CONV_FORWARD", "ConvInteger": "CONV_FORWARD", "ConvTranspose": "CONV_BWD_DATA"}
_LEGACY = {
    "cudnnConvolutionForward": ("CONV_FORWARD", "xDesc", "wDesc", "yDesc"),
    "cudnnConvolutionBiasActivationForward": ("CONV_FORWARD", "xDesc", "wDesc", "yDesc"),
    "cudnnConvolutionBackwardData": ("CONV_BWD_DATA", "dxDesc", "wDesc", "dyDesc"),
}
_HEADER = re.compile(r"^([IWE])! CuDNN \(v(\d+)[^)]*\) function (\w+)\(\) called:")
_LINE = re.compile(r"^i!( *)([^:=]+?):\s?(.*)$")
_VALUE = re.compile(r"val=(.*?);?$")


# --- the log --------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    value: str | None
    children: dict[str, "_Entry"] = field(default_factory=dict)

    def get(self, *path: str) -> "_Entry | None":
        entry: _Entry | None = self
        for key in path:
            entry = entry.children.get(key) if entry is not None else None
        return entry

    def text(self, *path: str) -> str | None:
        entry = self.get(*path)
        return entry.value if entry is not None else None


@dataclass(frozen=True)
class _Call:
    function: str
    version: int
    tree: _Entry
    time: str | None


def _calls(lines: Iterable[str]) -> Iterator[_Call]:
    """cuDNN API log lines -> calls, each with its parameters as a tree (by indentation)."""
    function, version, stack, when = None, 0, None, None
    for raw in lines:
        line = raw.rstrip("\n")
        header = _HEADER.match(line)
        if header:
            if function is not None:
                yield _Call(function, version, stack[0][1], when)
            function, version, when = header.group(3), int(header.group(2)), None
            stack = [(-1, _Entry(None))]
            continue
        if function is None or not line.startswith("i!"):
            continue
        if line.startswith("i! Time:"):
            when = line.split("Time:", 1)[1].split()[0]
            continue
        match = _LINE.match(line)
        if not match:
            continue
        depth, key, rest = len(match.group(1)), match.group(2).strip(), match.group(3).strip()
        value = _VALUE.search(rest)
        entry = _Entry(value.group(1).strip() if value else (None if rest.endswith(":") else rest or None))
        while stack[-1][0] >= depth:
            stack.pop()
        stack[-1][1].children.setdefault(key, entry)
        stack.append((depth, entry))
    if function is not None:
        yield _Call(function, version, stack[0][1], when)


def _ints(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(v) for v in re.findall(r"-?\d+", text.split("(")[0] if "[" not in text else text))


def _enum_name(text: str | None) -> str | None:
    return text.split(" (")[0].strip() if text else None


@serialized(derived=("nondeterministic",))
@dataclass(frozen=True)
class ConvExecution:
    """One convolution cuDNN executed: what, with which engine (or legacy algorithm), with which notes."""

    operation: str  # CONV_FORWARD | CONV_BWD_DATA | CONV_BWD_FILTER
    x: tuple[int, ...]  # the activation input (CONV_BWD_DATA: dy, the ConvTranspose input)
    w: tuple[int, ...]
    y: tuple[int, ...]  # the output (CONV_BWD_DATA: dx)
    pads: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    engine: str  # "engine 25 (tile_size=2, use_tex=0)" or a legacy algorithm name
    engine_id: int | None
    notes: tuple[str, ...]  # cuDNN numerical notes of the engine
    api: str  # "backend" | "legacy"
    time: str | None = None

    @property
    def nondeterministic(self) -> bool:
        return NONDETERMINISTIC_NOTE in self.notes or self.engine in LEGACY_NONDETERMINISTIC

    @property
    def why(self) -> str | None:
        """Why cuDNN says this kernel is not reproducible, or None."""
        if NONDETERMINISTIC_NOTE in self.notes:
            return (f"cuDNN marks {self.engine_name} {NONDETERMINISTIC_NOTE} (it accumulates with atomics: "
                    "non-deterministic by design)")
        if self.engine in LEGACY_NONDETERMINISTIC:
            return f"{LEGACY_NONDETERMINISTIC[self.engine]}: non-reproducible by cuDNN's documentation"
        return None

    @property
    def engine_name(self) -> str:
        return f"engine {self.engine_id}" if self.engine_id is not None else self.engine

    def signature(self) -> tuple:
        return (self.operation, self.w, self.strides, self.pads, self.dilations)


@dataclass(frozen=True)
class Marker:
    run: int


def _descriptor_dims(entry: _Entry | None) -> tuple[int, ...]:
    return _ints(entry.text("dimA")) if entry is not None else ()


def _backend_execution(call: _Call) -> ConvExecution | None:
    tree = call.tree
    operation = _enum_name(tree.text("operation"))
    if operation not in ("CONV_FORWARD", "CONV_FWD", "CONV_BWD_DATA", "CONV_BWD_FILTER"):
        return None
    operation = "CONV_FORWARD" if operation == "CONV_FWD" else operation
    x, w, y = (_descriptor_dims(tree.get(key)) for key in ("xDesc", "wDesc", "yDesc"))
    if operation == "CONV_BWD_DATA":  # xDesc is dx (the result), yDesc is dy (the input)
        x, y = y, x
    conv = tree.get("convDesc")
    engine_id = tree.text("engine_id")
    knobs = tree.get("knobDesc")
    knob_text = ", ".join(
        f"{k.replace('CUDNN_KNOB_TYPE_', '').lower()}={v.value}" for k, v in (knobs.children.items() if knobs else [])
    )
    notes = tree.get("numericalNotes")
    note_names = tuple(k for k, v in (notes.children.items() if notes else []) if (v.value or "").lower() == "true")
    ident = int(engine_id) if engine_id is not None and re.fullmatch(r"-?\d+", engine_id) else None
    return ConvExecution(
        operation=operation, x=x, w=w, y=y, pads=_ints(conv.text("padA")) if conv else (),
        strides=_ints(conv.text("strideA")) if conv else (), dilations=_ints(conv.text("dilationA")) if conv else (),
        engine=f"engine {ident}" + (f" ({knob_text})" if knob_text else ""), engine_id=ident, notes=note_names,
        api="backend", time=call.time,
    )


def _legacy_execution(call: _Call) -> ConvExecution | None:
    operation, x_key, w_key, y_key = _LEGACY[call.function]
    tree = call.tree
    algo = _enum_name(tree.text("algo"))
    if algo is None:
        return None
    conv = tree.get("convDesc")
    return ConvExecution(
        operation=operation, x=_descriptor_dims(tree.get(x_key)), w=_descriptor_dims(tree.get(w_key)),
        y=_descriptor_dims(tree.get(y_key)), pads=_ints(conv.text("padA")) if conv else (),
        strides=_ints(conv.text("strideA")) if conv else (), dilations=_ints(conv.text("dilationA")) if conv else (),
        engine=algo, engine_id=None, notes=(), api="legacy", time=call.time,
    )


def parse_log(lines: Iterable[str]) -> list[ConvExecution | Marker]:
    """The convolutions a cuDNN API log (level 3) records, in order, with the run markers between them.

    A legacy call (``cudnnConvolutionForward`` ...) that cuDNN 9 carries out through the backend is followed
    by its ``cudnnBackendExecuteInternal``: the pair is one execution, with the backend's engine and notes
    and the legacy algorithm's name kept in ``engine``."""
    events: list[ConvExecution | Marker] = []
    pending: ConvExecution | None = None
    for call in _calls(lines):
        if call.function == "cudnnGetErrorString":
            status = call.tree.text("status") or ""
            numbers = [int(n) for n in re.findall(r"\d+", status)]
            run = next((n - MARKER_BASE for n in numbers if MARKER_BASE <= n < MARKER_BASE + 100_000), None)
            if run is not None:
                if pending is not None:
                    events.append(pending)
                    pending = None
                events.append(Marker(run))
            continue
        if call.function in _LEGACY:
            if pending is not None:
                events.append(pending)
            pending = _legacy_execution(call)
            continue
        if call.function == "cudnnBackendExecuteInternal":
            execution = _backend_execution(call)
            if execution is None:
                continue
            if pending is not None and pending.operation == execution.operation and pending.w == execution.w:
                execution = replace(execution, engine=f"{pending.engine} via {execution.engine}", api="legacy")
                pending = None
            elif pending is not None:
                events.append(pending)
                pending = None
            events.append(execution)
    if pending is not None:
        events.append(pending)
    return events


def _collapse(executions: Sequence[ConvExecution]) -> list[tuple]:
    keys = [(e.signature(), e.x) for e in executions]
    return [k for i, k in enumerate(keys) if i + 1 == len(keys) or keys[i + 1] != k]


def _inferred_runs(executions: list[ConvExecution], runs: int) -> list[list[ConvExecution]]:
    """Without markers (a log another tool wrote): runs 2..N execute one identical sequence each, the first
    run that sequence with search candidates in between. The longest such sequence is taken; a log that fits
    none is refused."""
    if runs == 1:
        return [executions]
    for k in range(len(executions) // runs, 0, -1):
        head = len(executions) - (runs - 1) * k
        tail = [executions[head + i * k: head + (i + 1) * k] for i in range(runs - 1)]
        keys = [[(e.signature(), e.x) for e in chunk] for chunk in tail]
        if all(k_ == keys[0] for k_ in keys) and _collapse(executions[:head]) == keys[0]:
            return [executions[:head], *tail]
    raise InputError(f"cannot tell the {runs} runs apart in this cuDNN log (no run markers, no repeating sequence)")


def split_runs(events: Sequence[ConvExecution | Marker], runs: int) -> tuple[list[list[ConvExecution]], list[list[ConvExecution]]]:
    """Per run, the executions of that run, and per run the executions its autotuning tried first.

    Markers ``0 .. runs`` bound the runs (the child writes one before each run and one after the last); a log
    without markers is split where its runs repeat one sequence (``_inferred_runs``).
    In a run, consecutive executions with the same signature are one node's: the last one is what ran, the
    ones before it are the candidates an EXHAUSTIVE search timed."""
    bounds: dict[int, int] = {}
    for index, event in enumerate(events):
        if isinstance(event, Marker):
            bounds.setdefault(event.run, index)
    if not bounds:
        chunks = _inferred_runs([e for e in events if isinstance(e, ConvExecution)], runs)
    elif any(r not in bounds for r in range(runs + 1)):
        raise InputError(f"the cuDNN log lacks the run markers 0..{runs} (found {sorted(bounds)}): is it a qconsist engine log?")
    else:
        chunks = [[e for e in events[bounds[run] + 1:bounds[run + 1]] if isinstance(e, ConvExecution)] for run in range(runs)]
    ran, tried = [], []
    for chunk in chunks:
        kept: list[ConvExecution] = []
        trials: list[ConvExecution] = []
        for i, execution in enumerate(chunk):
            following = chunk[i + 1] if i + 1 < len(chunk) else None
            if following is not None and following.signature() == execution.signature() and following.x == execution.x:
                trials.append(execution)
            else:
                kept.append(execution)
        ran.append(kept)
        tried.append(trials)
    return ran, tried


# --- the graph's convolution nodes ----------------------------------------------------------------------


@dataclass(frozen=True)
class ConvNode:
    name: str
    op_type: str
    operation: str
    w: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]  # begin pads
    dilations: tuple[int, ...]


def _weight_shape(graph: onnx.GraphProto, name: str) -> tuple[int, ...] | None:
    """The shape of a weight: an initializer, a Constant, or one reached through DequantizeLinear / Identity /
    Cast / Transpose-free chains that keep the shape."""
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    for _ in range(8):
        if name in initializers:
            return tuple(initializers[name].dims)
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return tuple(numpy_helper.to_array(attr.t).shape)
            return None
        if node.op_type not in ("DequantizeLinear", "Identity", "Cast", "QuantizeLinear"):
            return None
        name = node.input[0]
    return None


def conv_nodes(model: onnx.ModelProto, names: Sequence[str] | None = None) -> list[ConvNode]:
    """The graph's convolution nodes in ``names`` order (execution order) or graph order."""
    nodes = list(model.graph.node)
    labelled = {node_label(n, i): n for i, n in enumerate(nodes)}
    order = [labelled[n] for n in names if n in labelled] if names else nodes
    found = []
    for node in order:
        operation = CONV_OPS.get(node.op_type)
        if operation is None:
            continue
        weight_input = 3 if node.op_type == "QLinearConv" else 1
        w = _weight_shape(model.graph, node.input[weight_input]) if len(node.input) > weight_input else None
        if w is None:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        spatial = len(w) - 2
        pads = list(attrs.get("pads", [0] * (2 * spatial)))
        name = node.name or next(k for k, v in labelled.items() if v is node)
        found.append(ConvNode(
            name=name, op_type=node.op_type, operation=operation, w=w,
            strides=tuple(attrs.get("strides", [1] * spatial)), pads=tuple(pads[:spatial]),
            dilations=tuple(attrs.get("dilations", [1] * spatial)),
        ))
    return found


def _spatial(values: tuple[int, ...]) -> tuple[int, ...]:
    """cuDNN runs a 1-D convolution as 2-D with a unit axis: compare without the unit axes."""
    return tuple(v for v in values if v != 1) if values else values


def _matches(node: ConvNode, execution: ConvExecution) -> bool:
    if node.operation != execution.operation or node.w[:2] != execution.w[:2]:
        return False
    if _spatial(node.w[2:]) != _spatial(execution.w[2:]):
        return False
    if execution.strides and _spatial(node.strides) != _spatial(execution.strides):
        return False
    return not execution.dilations or _spatial(node.dilations) == _spatial(execution.dilations)


# --- the record -----------------------------------------------------------------------------------------


@serialized(derived=("nondeterministic",))
@dataclass(frozen=True)
class NodeEngines:
    """One convolution node in one configuration: the kernel of each run, and what autotuning tried."""

    node: str
    label: str
    op_type: str
    runs: tuple[str, ...]  # engine per run ("-" when the run did not execute it through cuDNN)
    tried: tuple[str, ...]  # engines executed while searching, in the first run
    notes: tuple[str, ...]
    why: str | None  # why cuDNN says it is not reproducible
    by_order: bool = False  # assigned among nodes of the same signature by execution order

    @property
    def nondeterministic(self) -> bool:
        return self.why is not None

    @property
    def same_engine(self) -> bool:
        return len({r for r in self.runs if r != "-"}) <= 1

    def describe(self, config: str) -> str:
        runs = ", ".join(f"run {i + 1} {engine}" for i, engine in enumerate(self.runs))
        text = f"{self.label}: {self.op_type}, {config} {runs}"
        if self.tried:
            text += f" (its search first executed {', '.join(self.tried)})"
        return text + (f"; {self.why}" if self.why else "")


@serialized(
    schema=SCHEMA, derived=("outputs_stable",), error=InputError,
    refused="not an engine record of schema {schema}: {found!r}", malformed="engine record is malformed: {exc}",
)
@dataclass(frozen=True)
class EngineRecord:
    """The kernels of one configuration, recorded from cuDNN's API log in a child session."""

    config: str
    runs: int
    nodes: tuple[NodeEngines, ...]
    unmatched: tuple[str, ...]  # executions no node of the graph explains
    output_hashes: tuple[str, ...]  # the final outputs' hash per run of the recording session
    seconds: float  # the child: session, runs and log
    plain_seconds: float | None  # the same runs without the log, in the same child (the cost of recording)
    log_bytes: int
    cudnn_version: int | None = None

    @property
    def outputs_stable(self) -> bool:
        return len(set(self.output_hashes)) <= 1

    def node(self, label: str) -> NodeEngines | None:
        return next((n for n in self.nodes if n.label == label or n.node == label), None)


def assign(ran: Sequence[Sequence[ConvExecution]], tried: Sequence[Sequence[ConvExecution]], nodes: Sequence[ConvNode],
           labels: Mapping[str, str] | None = None) -> tuple[list[NodeEngines], list[str]]:
    """Executions per run -> per node the engine of each run; the executions no node explains."""
    labels = labels or {}
    per_node: dict[str, list[str]] = {n.name: ["-"] * len(ran) for n in nodes}
    notes: dict[str, set[str]] = {n.name: set() for n in nodes}
    whys: dict[str, str] = {}
    trials: dict[str, list[str]] = {n.name: [] for n in nodes}
    ambiguous: set[str] = set()
    unmatched: list[str] = []
    for run, executions in enumerate(ran):
        used: set[str] = set()
        for execution in executions:
            candidates = [n for n in nodes if n.name not in used and _matches(n, execution)]
            if not candidates:
                unmatched.append(f"run {run + 1}: {execution.operation} w{list(execution.w)} {execution.engine}")
                continue
            if len([n for n in nodes if _matches(n, execution)]) > 1:
                ambiguous.add(candidates[0].name)
            node = candidates[0]
            used.add(node.name)
            per_node[node.name][run] = execution.engine
            notes[node.name].update(execution.notes)
            if execution.why:
                whys.setdefault(node.name, execution.why)
        if run == 0:
            for execution in tried[0] if tried else []:
                node = next((n for n in nodes if _matches(n, execution)), None)
                if node is not None:
                    trials[node.name].append(execution.engine)
    result = [
        NodeEngines(node=n.name, label=labels.get(n.name, n.name), op_type=n.op_type, runs=tuple(per_node[n.name]),
                    tried=tuple(trials[n.name]), notes=tuple(sorted(notes[n.name])), why=whys.get(n.name),
                    by_order=n.name in ambiguous)
        for n in nodes if any(e != "-" for e in per_node[n.name])
    ]
    return result, unmatched


# --- recording ------------------------------------------------------------------------------------------


_RTLD_NOLOAD = getattr(os, "RTLD_NOLOAD", 4)  # dlopen only what is already loaded


def _loaded_cudnn() -> ctypes.CDLL:
    """The cuDNN library this process loaded (ONNX Runtime's), found by its soname or in the process's maps."""
    try:
        return ctypes.CDLL("libcudnn.so.9", mode=_RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
    except OSError:
        pass
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if "/" in line else ""
            if Path(path).name.startswith("libcudnn.so"):
                return ctypes.CDLL(path, mode=_RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
    raise OSError("no cuDNN library is loaded in this process")


def _cudnn_marker(run: int) -> None:
    """Log a marker: cudnnGetErrorString with an out-of-range status (the library ONNX Runtime loaded)."""
    lib = _loaded_cudnn()
    lib.cudnnGetErrorString.restype = ctypes.c_char_p
    lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
    lib.cudnnGetErrorString(MARKER_BASE + run)


def _child(request_path: str) -> None:
    """The child: one session, ``runs`` runs with markers, then as many without the log's help for timing."""
    request = json.loads(Path(request_path).read_text())
    options = ExecutionOptions.from_json(request["options"])
    with np.load(request["sample"]) as data:
        feed = {k: data[k] for k in data.files}
    session = create_session(Path(request["model"]), options)
    hashes = []
    start = time.perf_counter()
    for run in range(request["runs"]):
        _cudnn_marker(run)
        outputs = session.run(None, feed)
        digest = hashlib.sha256()
        for value in outputs:
            digest.update(np.ascontiguousarray(value).tobytes())
        hashes.append(digest.hexdigest()[:16])
    _cudnn_marker(request["runs"])
    logged = time.perf_counter() - start
    lib = _loaded_cudnn()
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    version = int(lib.cudnnGetVersion())
    Path(request["result"]).write_text(json.dumps({"hashes": hashes, "seconds": logged, "cudnn_version": version}))


@dataclass(frozen=True)
class EngineRequest:
    model: Path  # the model as the application runs it
    options: ExecutionOptions
    sample: Mapping[str, np.ndarray]
    runs: int = 3
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.runs, bool) or not isinstance(self.runs, int) or not 1 <= self.runs <= 100:
            raise ConfigError(f"`engine_runs` must be a whole number from 1 to 100, got {self.runs!r}")


def _run_child(request: EngineRequest, workdir: Path, log_path: Path | None) -> dict:
    sample_path = workdir / "sample.npz"
    if not sample_path.exists():
        np.savez(sample_path, **{k: np.asarray(v) for k, v in request.sample.items()})
    result_path = workdir / ("logged.json" if log_path else "plain.json")
    request_path = workdir / "request.json"
    request_path.write_text(json.dumps({
        "model": str(request.model), "options": request.options.to_json(), "sample": str(sample_path),
        "runs": request.runs, "result": str(result_path),
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDNN_LOG")}
    if log_path is not None:
        env.update(CUDNN_LOGLEVEL_DBG="3", CUDNN_LOGDEST_DBG=str(log_path))
    try:
        done = subprocess.run([sys.executable, "-m", "qconsist.inference.engines", str(request_path)], env=env,
                              capture_output=True, text=True, timeout=request.timeout)
    except subprocess.TimeoutExpired:
        raise UnavailableError(f"recording cuDNN engines took longer than {request.timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UnavailableError(f"the engine-recording session failed (exit {done.returncode}): {last}")
    return json.loads(result_path.read_text())


def record_engines(request: EngineRequest, graph_model: onnx.ModelProto | Path, config: str,
                   execution_order: Sequence[str] | None = None, labels: Mapping[str, str] | None = None,
                   keep_log: Path | None = None) -> EngineRecord:
    """Run the model ``request.runs`` times in a child session with cuDNN's API log on and read which engine
    each convolution of ``graph_model`` (the graph ONNX Runtime runs: its optimized model) used per run. The
    same child runs once more without the log, so the record says what the log cost."""
    model = graph_model if isinstance(graph_model, onnx.ModelProto) else read_onnx(graph_model)
    with scratch_dir("qconsist-engines-") as tmp:
        workdir = Path(tmp)
        log_path = workdir / "cudnn.log"
        start = time.perf_counter()
        logged = _run_child(request, workdir, log_path)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        _run_child(request, workdir, None)
        plain = time.perf_counter() - start
        size = log_path.stat().st_size if log_path.exists() else 0
        if size == 0:
            raise UnavailableError("cuDNN wrote no API log (CUDNN_LOGLEVEL_DBG): is this cuDNN 9 or newer?")
        with log_path.open(errors="replace") as handle:
            events = parse_log(handle)
        if keep_log is not None:
            keep_log.parent.mkdir(parents=True, exist_ok=True)
            keep_log.write_bytes(log_path.read_bytes())
    ran, tried = split_runs(events, request.runs)
    nodes, unmatched = assign(ran, tried, conv_nodes(model, execution_order), labels)
    return EngineRecord(config=config, runs=request.runs, nodes=tuple(nodes), unmatched=tuple(unmatched),
                        output_hashes=tuple(logged["hashes"]), seconds=round(seconds, 3), plain_seconds=round(plain, 3),
                        log_bytes=size, cudnn_version=logged.get("cudnn_version"))


if __name__ == "__main__":
    _child(sys.argv[1])
