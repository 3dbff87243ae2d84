"""``qconsist locate --ep cpu``: the CPU counterpart of the GPU matrix — instruction sets × integer-path settings.

Each instruction set (``native``, this processor; a QEMU CPU model such as ``Haswell`` or ``Nehalem``, emulated
by ``qconsist.emulation``) runs the model on the same samples under each session setting that changes the CPU
provider's integer path (``SETTINGS``, read from onnxruntime's ``graph_transformer_utils.cc``): onnxruntime's
default, ``session.x64quantprecision=1`` (int8 weights through the exact u8·u8 kernels) and
``session.disable_quant_qdq=1`` (QDQ groups computed in float). Every cell is a ``qconsist run --dump``
run directory, written by one child process per emulated instruction set (``qconsist.emulation.call_on``,
under QEMU) and in this process for the native one, so the emulated cells record
the emulated instruction set as their environment.

Each cell is compared with the native cell of the same setting by ``qconsist.diff.diff_runs``: final outputs
bit for bit, and the tensors of both dumps, whose diverging nodes are named by the origin rule
(``qconsist.compare.origin``, applied by the tensor comparison). A setting whose outputs are bit-identical across
every instruction set is a configuration that holds on any of them; the first such (in ``SETTINGS``' order) is
recommended, with its cost measured here natively, every setting's sessions timed in turn (side by side), as
a ratio to onnxruntime's default.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from qconsist.cpu import InstructionSet, instruction_set
from qconsist.diff.runs import diff_runs
from qconsist.emulation import NATIVE, call_on
from qconsist.environment import fingerprint
from qconsist.errors import ConfigError, UnsupportedModelError
from qconsist.inference import RawSelection, RunRequest, resolve_model, run_inference
from qconsist.inference.session import ExecutionOptions, create_session, ort_logged
from qconsist.inputs.options import InputOptions
from qconsist.pipeline.inputs import open_inputs
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.pipeline.isaspread import pin_failure
from qconsist.store.hashing import hash_file
from qconsist.store.manifest import Manifest
from qconsist.store.run import Run
from qconsist.store.rundir import RunDirectory
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)
SCHEMA = "qconsist.locate-cpu/1"


@dataclass(frozen=True)
class Setting:
    name: str
    entries: tuple[tuple[str, str], ...]  # onnxruntime session config entries

    def options(self, threads: int) -> ExecutionOptions:
        return ExecutionOptions("cpu", intra_op_threads=threads, session_config=dict(self.entries))

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.entries) or "onnxruntime's default"


SETTINGS = (
    Setting("default", ()),
    Setting("x64quantprecision", (("session.x64quantprecision", "1"),)),
    Setting("disable_quant_qdq", (("session.disable_quant_qdq", "1"),)),
)


@dataclass
class IsaCell:
    """One instruction set under one setting: its run directory and how it compares with the native cell."""

    isa: str
    setting: str
    run_dir: str
    ms_per_sample: float
    identical_to_native: bool | None = None  # None: the native cell itself
    differing_samples: int = 0
    greatest_abs: float = 0.0
    origins: list[str] = field(default_factory=list)  # nodes the origin rule names against the native cell
    first_node: str | None = None
    load_error: str | None = None  # onnxruntime cannot create the session under this setting here (one line)
    spans: list[list[str]] = field(default_factory=list)  # the origin rule's spans (nodes judged together)


@serialized(schema=SCHEMA, derived=("passed",), error=ConfigError, refused="locate result schema {found!r} is not {schema!r}",
            malformed="locate result is malformed: {exc}")
@dataclass
class CpuLocateResult:
    """The matrix, the settings bit-identical across every instruction set, and the recommendation."""

    model: str
    samples: int
    threads: int
    instruction_sets: dict[str, dict[str, Any]]  # name -> the InstructionSet's JSON as its cells recorded it
    emulated_seconds: dict[str, float]  # the wall time of each emulated child (all its settings)
    cells: list[IsaCell]
    identical: dict[str, bool]  # setting -> bit-identical final outputs on every instruction set
    cost: dict[str, float]  # setting -> native median ms per sample / default's (side by side)
    native_ms: dict[str, float]  # setting -> native median ms per sample
    recommended: str | None = None
    cannot_load: dict[str, str] = field(default_factory=dict)  # setting -> onnxruntime's one line (never recommended)
    md5: str | None = None  # the model file's md5: what the gate and the pipeline look a record up by
    record: str | None = None  # the run directory of kind "locate-cpu" that records this result

    @property
    def passed(self) -> bool:
        """A setting holds on every instruction set compared (or none diverged at all)."""
        return self.recommended is not None

    def cell(self, isa: str, setting: str) -> IsaCell:
        return next(c for c in self.cells if c.isa == isa and c.setting == setting)


def _worker_request(model: Path, stage: str | None, inputs: InputOptions, settings: Sequence[Setting], runs_dir: Path,
                    prefix: str, isa: str, threads: int) -> dict[str, Any]:
    return {
        "model": str(Path(model).resolve()), "stage": stage, "runs_dir": str(runs_dir), "threads": threads,
        "inputs": {"source": inputs.source, "pipeline": str(inputs.pipeline) if inputs.pipeline else None,
                   "offset": inputs.offset, "count": inputs.count, "workers": 1},
        "cells": [{"setting": s.name, "entries": dict(s.entries), "run_id": f"{prefix}-{isa}-{s.name}"} for s in settings],
    }


def run_cells(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every cell of ``request`` in this process (the worker's work; the native instruction set's too):
    a ``run --dump`` per setting. Returns each cell's run directory and ms per sample."""
    source = resolve_model(Path(request["model"]), request.get("stage"))  # a run directory brings its preprocessing
    spec = request["inputs"]
    inputs = InputOptions(spec["source"], Path(spec["pipeline"]) if spec.get("pipeline") else None,
                          spec["offset"], spec["count"], spec.get("workers"))
    done = []
    for cell in request["cells"]:
        options = ExecutionOptions("cpu", intra_op_threads=request["threads"], session_config=cell["entries"])
        input_set = open_inputs(inputs, source, 1, up_to=True)
        try:  # a setting onnxruntime cannot load here is a finding of the cell (no run directory), not a failure
            result = run_inference(source, input_set, RunRequest(options=options, dump=True, raw=RawSelection.parse("none")),
                                   Path(request["runs_dir"]), run_id=cell["run_id"], command=list(sys.argv))
        except UnsupportedModelError as exc:
            done.append({"setting": cell["setting"], "load_error": pin_failure(exc)})
            continue
        done.append({"setting": cell["setting"], "run_dir": str(result.run_dir), "ms_per_sample": result.ms_per_sample,
                     "samples": result.samples})
    return done


@ort_logged()
def side_by_side_ms(model: Path, stage: str | None, inputs: InputOptions, settings: Sequence[Setting], threads: int,
                    rounds: int = 10, skip: Sequence[str] = ()) -> dict[str, float]:
    """Median ms per run of each setting's session here, the sessions timed in turn (one run each per round,
    after two warm-up runs) so that the machine's load falls on all of them alike."""
    source = resolve_model(model, stage)
    input_set = open_inputs(inputs, source, 1, up_to=True)
    feeds = [input_set.sample(i) for i in range(min(len(input_set), 4))]
    sessions = {s.name: create_session(source.path, s.options(threads)) for s in settings if s.name not in skip}
    for session in sessions.values():
        for feed in feeds[:2]:
            session.run(None, feed)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for index in range(rounds):
        feed = feeds[index % len(feeds)]
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feed)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def locate_cpu(model: Path, inputs: InputOptions, runs_dir: Path, *, stage: str | None = None,
               isas: Sequence[str] = (NATIVE, "Haswell", "Nehalem"),
               settings: Sequence[Setting] = SETTINGS, threads: int = 1, prefix: str = "locate-cpu",
               timing_rounds: int = 10, progress: Progress = NULL_PROGRESS) -> CpuLocateResult:
    """The matrix of ``isas`` (resolved names: ``native`` and QEMU models) × ``settings`` on ``inputs``; ``model``
    an ONNX file or a run directory (``stage`` picks its artifact; its preprocessing prepares images)."""
    if NATIVE not in isas:
        isas = (NATIVE, *isas)
    if len(isas) < 2:
        raise ConfigError("`isa` names one instruction set: locate --ep cpu compares two or more, e.g. native,haswell")
    runs_dir.mkdir(parents=True, exist_ok=True)
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    with progress.task(f"locate --ep cpu: {len(isas)} instruction sets × {len(settings)} settings (emulation is slow)",
                       len(isas)) as task:
        for isa in isas:
            request = _worker_request(model, stage, inputs, settings, runs_dir, prefix, isa, threads)
            done, took = call_on(isa, run_cells, request, what="the run")
            if isa != NATIVE:
                seconds[isa] = took
            for entry in done:
                cells[(isa, entry["setting"])] = entry
            task.advance()
    result_cells: list[IsaCell] = []
    recorded: dict[str, dict[str, Any]] = {}
    identical = {s.name: True for s in settings}
    cannot_load: dict[str, str] = {}
    samples = 0
    for isa in isas:
        for setting in settings:
            entry = cells[(isa, setting.name)]
            if entry.get("load_error"):
                cannot_load.setdefault(setting.name, entry["load_error"])
                identical[setting.name] = False
                result_cells.append(IsaCell(isa, setting.name, "", 0.0, None if isa == NATIVE else False,
                                            load_error=entry["load_error"]))
                continue
            run = Run.open(Path(entry["run_dir"]))
            recorded.setdefault(isa, run.manifest.environment.get("cpu_isa") or {})
            cell = IsaCell(isa, setting.name, entry["run_dir"], entry["ms_per_sample"])
            samples = int(entry.get("samples") or samples)
            if isa != NATIVE and cells[(NATIVE, setting.name)].get("load_error"):
                cell.identical_to_native = False  # nothing to compare with: the native cell cannot load
            elif isa != NATIVE:
                diff = diff_runs(Run.open(Path(cells[(NATIVE, setting.name)]["run_dir"])), run)
                outputs = diff.outputs
                cell.identical_to_native = bool(outputs is not None and outputs.identical)
                if outputs is not None:
                    cell.differing_samples = len(outputs.differing_samples)
                    cell.greatest_abs = float(outputs.greatest_abs)
                if diff.tensors is not None and diff.tensors.nodes:
                    cell.origins = [node.label for node in diff.tensors.origins]
                    cell.first_node = diff.tensors.first.label
                    cell.spans = [[node.label, *node.span] for node in diff.tensors.spans]  # the span's end, its nodes
                identical[setting.name] &= cell.identical_to_native
            result_cells.append(cell)
    native_ms = side_by_side_ms(model, stage, inputs, settings, threads, timing_rounds, skip=list(cannot_load))
    base = native_ms.get(settings[0].name)
    cost = {name: ms / base for name, ms in native_ms.items()} if base else {}
    recommended = next((s.name for s in settings if identical[s.name] and s.name not in cannot_load), None)
    return CpuLocateResult(str(model), samples, threads, recorded, seconds, result_cells, identical, cost, native_ms,
                           recommended, cannot_load, hash_file(resolve_model(model, stage).path).md5)


RECORD_KIND = "locate-cpu"  # the run directory that records a CpuLocateResult (sections.locate_cpu)
RECORD_SECTION = "locate_cpu"


def record_cpu_locate(result: CpuLocateResult, model: Path, stage: str | None, runs_dir: Path, run_id: str,
                      command: Sequence[str] = ()) -> Path:
    """Write ``result`` as a run directory of kind ``locate-cpu`` (its manifest's ``locate_cpu`` section, the
    model with its md5, this machine's fingerprint), which the gate's ``[isa]`` checks and the pipeline's quantize
    check read as the evidence of the spread across instruction sets (``qconsist.pipeline.isaspread``)."""
    source = resolve_model(model, stage)
    with RunDirectory.create(runs_dir, f"locate-cpu-{source.describe().get('name') or source.path.stem}",
                             RECORD_KIND, run_id) as rundir:
        result.record = str(rundir.path)
        manifest = Manifest(kind=RECORD_KIND, command=list(command),
                            model={**source.describe(), **hash_file(source.path).to_json()},
                            environment=fingerprint(), sections={RECORD_SECTION: result.to_json()})
        return rundir.finish(manifest)


def isa_label(data: dict[str, Any]) -> str:
    """``AVX2 without VNNI (emulated Haswell)`` from a cell's recorded instruction set."""
    isa = InstructionSet.from_json(data) if data else instruction_set()
    return f"{isa.kernels} ({'emulated ' + isa.emulated if isa.emulated else 'native'})"
