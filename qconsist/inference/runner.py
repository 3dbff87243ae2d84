"""``qconsist run``: inference of a model on an input set, written to a run directory of kind ``inference``.

Files written (besides ``manifest.json``)::

    outputs/o<i>.npy           the final output i of every sample (qconsist.store.arrays; order of
                               sections.inference.outputs), written a step at a time
    inputs/samples.jsonl       every sample's name, digest, file digest and label (qconsist.inputs.record)
    dump/...                   with --dump (see qconsist.inference.dump and qconsist.inference.recording)

The manifest refers to the run the model came from (its manifest's sha256) instead of copying its stage records
and calibration table (``qconsist.store.run``). Where the inputs have labels and the model one class-scores
output, ``sections.inference.accuracy`` holds its top-1 and top-5 accuracy (``qconsist.compare.accuracy``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from concurrent.futures import Future, ThreadPoolExecutor, wait
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from qconsist.compare import compare_outputs
from qconsist.compare.accuracy import AccuracyCounter, labels_array
from qconsist.compare.kinds import class_scores_output, judged_outputs, parse_kinds
from qconsist.environment import fingerprint as environment_fingerprint
from qconsist.environment import prefetch_gpus
from qconsist.errors import ConfigError, InputError, QconsistError, UnsupportedModelError
from qconsist.inference.batch import ONE, Split, distinct_second, further_samples, probe_splits
from qconsist.inference.dump import DumpPlan, Probe, RawMode, RawSelection, expose_plan, observed_graph, select_raw, split_plan
from qconsist.inference.engines import EngineRecord, EngineRequest, record_engines
from qconsist.inference.fingerprint import HASH_FUNCTION, HASH_FUNCTIONS, check_hash_functions
from qconsist.inference.graphmap import structure_hash
from qconsist.inference.model import ModelSource, with_dynamic_batch
from qconsist.inference.pinned import PROVIDERS as PINNED_PROVIDERS
from qconsist.inference.pinned import pin_inputs
from qconsist.inference.reader import load_dump
from qconsist.inference.device import start as begin_device
from qconsist.inference.recording import StepRecorder, make_recorder
from qconsist.inference.session import (
    ExecutionOptions, OptimizationLevel, create_session, input_specs, ort_message, records_type,
)
from qconsist.inference.startup import Startup
from qconsist.inputs.axes import input_axes
from qconsist.inputs.digest import SHA256, digest_kind, same_inputs
from qconsist.inputs.inputset import InputSet, check_batch_size, check_batching
from qconsist.inputs.record import SAMPLES_FILE, record_inputs
from qconsist.inputs.stream import SampleInfo, stack
from qconsist.onnxfile import read_onnx
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.arrays import FORMAT as OUTPUTS_FORMAT
from qconsist.store.arrays import OutputWriter, ShapeTable
from qconsist.store.atomic import write_bytes_atomic
from qconsist.store.hashing import ArtifactHashes, content_hash, hash_artifact, hash_file, read_model_and_external_data
from qconsist.store.manifest import MANIFEST_NAME, Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import OrtLog, capture_ort_log
from qconsist.store.run import SOURCE_KEY, Run
from qconsist.store.rundir import RunDirectory
from qconsist.store.sections import Accuracy, DumpSummary, InferenceSection, InputMemory, table_digest
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)
KIND = "inference"


@dataclass(frozen=True)
class RunRequest:
    options: ExecutionOptions = field(default_factory=ExecutionOptions)
    dump: bool = False
    raw: RawSelection = field(default_factory=RawSelection)
    reference: Path | None = None  # a dump run whose differing tensors --raw auto keeps
    batch_size: int = 1  # samples per step (cuDNN picks algorithms per shape: run as the evaluation runs)
    dynamic_batch: bool = False  # re-stamp a model with a fixed batch of 1 to take any batch (checked)
    engines: bool = False  # record the cuDNN engine of every convolution per run (CUDA EP; a child session)
    engine_runs: int = 3
    # where a dump's fingerprints are computed: "device" (CUDA EP: tensors stay on the GPU, CuPy kernels),
    # "host" (copied to numpy, CPU kernels), "auto" (device on the CUDA EP, else host)
    fingerprints: str = "auto"

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size)
        if self.fingerprints not in ("auto", "host", "device"):
            raise ConfigError(f"`fingerprints` must be auto, host or device, got {self.fingerprints!r}")
        if self.fingerprints == "device" and self.options.provider != "cuda":
            raise ConfigError("`fingerprints` device keeps the tensors on the GPU: it needs `ep` cuda")
        if self.engines and self.options.provider != "cuda":
            raise ConfigError("`engines` records the kernels cuDNN runs: it needs `ep` cuda")
        if isinstance(self.engine_runs, bool) or not isinstance(self.engine_runs, int) or not 1 <= self.engine_runs <= 100:
            raise ConfigError(f"`engine_runs` must be a whole number from 1 to 100, got {self.engine_runs!r}")
        if self.raw.mode is not RawMode.NONE and not self.dump:
            raise ConfigError("`raw` needs `dump`")
        if self.raw.mode is RawMode.AUTO and self.reference is None:
            raise ConfigError("`raw` auto keeps the tensors that differ from a reference dump: give `reference` RUN")
        if self.reference is not None and self.raw.mode is not RawMode.AUTO:
            raise ConfigError("`reference` is only used with `raw` auto")


@serialized(derived=("passed",))
@dataclass
class InferenceResult:
    run_dir: Path
    run_id: str
    samples: int
    ms_per_sample: float  # production session
    outputs: list[str]
    dump: DumpSummary | None = None
    onnxruntime_log: OrtLog | None = None  # onnxruntime's own log lines, kept in the run directory
    accuracy: Accuracy | None = None  # of the class-scores output, where the inputs have labels

    @property
    def passed(self) -> bool:
        """False when a dump did not reproduce the production outputs bit for bit."""
        return self.dump is None or self.dump.faithful

    def __bool__(self) -> bool:
        return self.passed


class _Reference:
    """The fingerprints of a reference dump, looked up by the key two dumps share."""

    def __init__(self, run_dir: Path, plan: DumpPlan, samples: int) -> None:
        ref = load_dump(Run.open(run_dir))
        check_hash_functions(ref.table, {HASH_FUNCTIONS[HASH_FUNCTION]}, f"`reference` {run_dir}", "this run")
        if ref.table.samples != samples:
            raise ConfigError(f"`reference` {run_dir} has {ref.table.samples} samples, this run {samples}")
        same_graph = ref.structure == plan.structure
        keys = [t.name if same_graph else t.original for t in plan.tensors]
        ref_keys = {(t.name if same_graph else t.original): i for i, t in enumerate(ref.tensors)}
        self.pairs = [(c, ref_keys[k]) for c, k in enumerate(keys) if k is not None and k in ref_keys]
        self.table = ref.table
        self.digest = ref.inputs_digest
        self.run_dir = run_dir

    def differing(self, sample: int, row: np.ndarray) -> set[int]:
        """Columns of this run's ``row`` whose bytes or type differ from the reference's sample."""
        ref_row = self.table.block(sample, sample + 1)[0]
        return {
            c for c, r in self.pairs
            if row[c]["hash"] != ref_row[r]["hash"] or row[c]["dtype"] != ref_row[r]["dtype"]
        }


@dataclass
class _ModelRecord:
    """What the manifest records of the model a run ran, the stages it came from, and the model itself."""

    record: dict[str, Any]
    stages: list[dict[str, Any]]
    model: onnx.ModelProto


def _model_record(source: ModelSource, read: tuple[onnx.ModelProto, list[dict[str, Any]]] | None = None) -> _ModelRecord:
    """The model's record (``read``: the model and its external data's record, read already)."""
    model, external = read if read is not None else read_model_and_external_data(source.path)
    # a model of a run is recorded without its initializers' digests (the run it came from has them): not computed
    hashes = (hash_artifact(source.path, model=model) if source.run is None else _artifact(source.path, model)).to_json()
    hashes["path"] = str(source.path.resolve())
    if external:  # an artifact is its whole content: the weights files it names, verified with it on every read
        hashes["external_data"] = external
    record = {**source.describe(), "path": str(source.path.resolve()), "artifact": hashes, "structure": structure_hash(model)}
    if source.run is None:
        return _ModelRecord(record, [{"name": "model", "params": {}, "artifact": hashes}], model)
    # the run it came from is referred to, by its manifest's hashes and its calibration table's digest, instead of
    # copying the table and the per-initializer digests (``store.run``); the stage records stay
    table = source.run.calibration.table
    record[SOURCE_KEY] = {**hash_file(source.run.path / MANIFEST_NAME).to_json(), "run_id": source.run.run_id,
                          "calibration": {"sha256": table_digest(table), "tensors": len(table)}}
    record["artifact"] = {k: v for k, v in hashes.items() if k != "initializers"}
    stages = []
    for stage in source.stages:
        stage = dict(stage)
        artifact = stage.get("artifact")
        if isinstance(artifact, dict):
            stage["artifact"] = {k: v for k, v in artifact.items() if k != "initializers"}
            if isinstance(artifact.get("path"), str) and not Path(artifact["path"]).is_absolute():
                stage["artifact"]["path"] = str((source.run.path / artifact["path"]).resolve())
        stages.append(stage)
    return _ModelRecord(record, stages, model)


def _artifact(path: Path, model: onnx.ModelProto, relative_to: Path | None = None) -> ArtifactHashes:
    """``hash_artifact``'s record of the model file at ``path`` (``model``: its content) where its initializers'
    digests are not kept: they are not computed (Python over every initializer, beside the main thread's work)."""
    files = hash_file(path)
    shown = str(path.relative_to(relative_to)) if relative_to else str(path)
    return ArtifactHashes(path=shown, md5=files.md5, sha256=files.sha256, size=files.size, content=content_hash(model),
                          initializers={})


def _restamp_write(source: Path, target: Path, original: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """``source`` (``original``: the model read already, external data included) re-stamped, written to ``target``."""
    restamped = with_dynamic_batch(read_onnx(source, external_data=True) if original is None else original)
    write_bytes_atomic(target, restamped.SerializeToString())
    return restamped


def _check_options(options: ExecutionOptions) -> ExecutionOptions:
    """The re-stamp check's sessions: on the CPU at the run's optimization level, one thread each."""
    return ExecutionOptions(graph_optimization_level=options.graph_optimization_level, intra_op_threads=1,
                            disabled_optimizers=options.disabled_optimizers)


def _restamp_original(source: Path, sample: dict[str, np.ndarray] | Future, options: ExecutionOptions) -> list[np.ndarray]:
    """What the original gives for ``sample`` in ``_restamp_check`` (a thread of its own beside the re-stamped
    model's session: the two sessions are made at once, and made while ``sample``, a ``Future``, is being read)."""
    session = create_session(source, _check_options(options))
    return session.run(None, sample.result() if isinstance(sample, Future) else sample)


def _batch_refused(source: Path, call: Any) -> Any:
    """``call()``; onnxruntime's own error (at run time) is the model's refusal of another batch size."""
    try:
        return call()
    except QconsistError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors at run time
        raise UnsupportedModelError(f"{source} cannot take another batch size (`dynamic_batch`): {ort_message(exc)}") from None


def _restamp_check(source: Path, target: Path, sample: dict[str, np.ndarray] | Future, options: ExecutionOptions,
                   original: Future | None = None) -> Path:
    """The check of the re-stamped file written by ``_restamp_write``: a step of two copies of a real sample gives,
    per row, what the original gives for the sample (within float rounding). Whether the graph computes per sample
    is the graph's property, checked on the CPU EP at the run's optimization level: on the CUDA EP the kernels
    themselves depend on the batch (open_nsfw QDQ on the H100: batch 2 and batch 1 one quantization step apart in
    ``prob``), which is what a run at another batch size is there to show. Two CPU sessions, one thread each: 2.8 s
    of a 10,000-JPEG run's
    3.2 s start-up on the H200 machine, so ``_prepare`` runs it beside the run's own sessions). ``original``: the
    original's outputs (``_restamp_original``) being computed in another thread; its error comes after the
    re-stamped model's, as when the two ran one after the other. ``sample`` may be a ``Future`` (the first sample
    being read beside): the sessions are made meanwhile."""
    restamped = _batch_refused(source, lambda: create_session(target, _check_options(options)))
    if isinstance(sample, Future):
        sample = sample.result()  # its own error, at its place (``_ORDER``)
    step = {k: np.concatenate([v, v]) for k, v in sample.items()}
    pair = _batch_refused(source, lambda: restamped.run(None, step))
    single = original.result() if original is not None else _restamp_original(source, sample, options)
    names = [o.name for o in restamped.get_outputs()]
    comparison = compare_outputs([dict(zip(names, single))] * 2,
                                 [{n: p[r:r + 1] for n, p in zip(names, pair)} for r in range(2)], 1e-5, 1e-4)
    if not comparison.passed:
        raise UnsupportedModelError(f"{source} does not compute per sample once re-stamped for another batch size "
                                    f"(`dynamic_batch`): {comparison.summary()}")
    return target


PRODUCTION_REPEATS = 5


def _production_distinct(production: Any, inputs: InputSet, batch: int, sample: int) -> int:
    """How many distinct final outputs production gives in ``PRODUCTION_REPEATS`` runs of the step holding
    ``sample``: more than one means a non-deterministic kernel, not an unfaithful dump."""
    start = sample - sample % batch
    step = inputs.step(start, start + batch)
    seen = {hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in production.run(None, step))).digest()
            for _ in range(PRODUCTION_REPEATS)}
    return len(seen)


def _engines(model_path: Path, options: ExecutionOptions, step: dict[str, np.ndarray], request: RunRequest,
             plan: DumpPlan | None, optimized: Path) -> EngineRecord:
    """The cuDNN engine of every convolution, per run of a child session of the same model, options and first
    step; nodes named as the dump names them."""
    if plan is not None:
        graph_path, observed = plan.optimized_path, observed_graph(read_onnx(plan.optimized_path, external_data=True, what="ORT's optimized graph"), plan)
        order, labels = [n.name for n in observed.nodes], {n.name: n.label for n in observed.nodes}
    else:
        create_session(model_path, options, optimized_model_filepath=optimized)
        graph_path, order, labels = optimized, None, None
    label = options.provider + "/" + "/".join(f"{k}={v}" for k, v in sorted(options.provider_options.items()))
    return record_engines(EngineRequest(model_path, options, step, request.engine_runs), graph_path, label, order, labels)


@dataclass
class _Prepared:
    """A run's sessions, ready for its steps: the model file run, production, its outputs and the dump plan."""

    model_path: Path
    production: Any
    outputs: list[str]
    plan: DumpPlan | None
    reference: _Reference | None
    recorder: StepRecorder
    splits: list[Split]  # per output: how a step's output divides among its samples


# The start-up's parts in the order in which they ran one after the other. Those that do not need production's
# session run beside its creation, in threads (onnxruntime lets the GIL go while it makes a session, hashlib while
# it hashes); each keeps its place here, so that a run fails with the error it failed with when nothing ran
# beside: a main-thread step's error comes after those of the parts placed before it (``_Parts``).
_ORDER = ("inputs", "run directory", "model md5", "outputs check", "re-stamp", "re-stamp sample", "re-stamp md5",
          "re-stamp check", "session", "output probe", "dump plan", "recorder", "accuracy target", "pin inputs")


class _Parts:
    """The parts of one run's start-up done beside the main thread, each at its place in ``_ORDER``."""

    def __init__(self, clock: Startup) -> None:
        self.clock = clock
        # a thread per part: most of them wait (for the inputs, the sample, the probe) in their thread, and with 8
        # the dump plan's exposed graph, the 10th part, waited for a thread until the folder was listed (the H200's
        # 50,000 JPEGs: 1.31 s)
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="qconsist-start")
        self.placed: list[tuple[int, str, Future]] = []
        self.every: list[Future] = []

    def beside(self, name: str, place: str | None, function: Any, *args: Any, after: Future | None = None) -> Future:
        """``function(*args)`` in a thread (once ``after`` is done); its error is raised at ``place`` (None: by the
        part that uses it)."""
        future = self.clock.beside(name, function, *args, pool=self.pool, after=after)
        self.every.append(future)
        if place is not None:
            self.placed.append((_ORDER.index(place), name, future))
        return future

    def main(self, place: str, phase: str | None, function: Any, *args: Any) -> Any:
        """``function(*args)`` on the main thread at ``place``, timed as ``phase`` (None: it marks its own); where
        it fails, the error of a part placed before it is raised first."""
        try:
            result = function(*args)
        except Exception:
            self.settle(_ORDER.index(place))
            raise
        if phase is not None:
            self.clock.mark(phase)
        return result

    def settle(self, before: int = len(_ORDER)) -> None:
        """Wait for the parts placed before ``before``, in their order: the first error among them is raised."""
        for _, name, future in sorted((p for p in self.placed if p[0] < before), key=lambda p: p[0]):
            self.clock.wait(name, future)

    def result(self, place: str, future: Future) -> Any:
        """``future``'s result, once the parts placed before ``place`` have given theirs (their errors first)."""
        self.settle(_ORDER.index(place))
        return self.clock.wait(place, future)

    def join(self) -> None:
        """Wait for every part (a failed start-up: none may still write in a run directory being removed)."""
        wait(self.every)

    def shutdown(self) -> None:
        """No part is waited for (a run that ends has settled them all); one not begun is dropped (an interrupt)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Opened:
    """The input set, checked, and its steps (their input workers started; None: not yet)."""

    inputs: InputSet
    stream: Any = None

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def _open_inputs(inputs: InputSet | Callable[[], InputSet], source: ModelSource, batch: int | None) -> _Opened:
    """``inputs`` (opened here where it is the function that opens them), not empty, with its inputs' batch axes;
    its steps started where ``batch`` is given (the workers start at once)."""
    if callable(inputs):
        inputs = inputs()
    if len(inputs) == 0:
        raise InputError(f"input set {inputs.source} is empty")
    if inputs.axes is None:  # a set not checked against the model: its inputs' batch axes from the graph
        axes = {name: axis for name, axis in input_axes(input_specs(source.path)).items() if axis}
        inputs = dataclasses.replace(inputs, axes=axes or None)
    return _Opened(inputs, inputs.steps(batch, borrowed=True) if batch is not None else None)


def _ready(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


@dataclass
class _Started:
    """What the start-up gives the steps: the model's record, the sessions, the output whose accuracy is counted."""

    model: _ModelRecord
    prepared: _Prepared
    target: tuple[str | None, str]
    inputs: InputSet
    memory: InputMemory  # production's inputs page-locked, or why not (``pinned``)


def _prepare(source: ModelSource, opened: Future, request: RunRequest, run: RunDirectory, parts: _Parts) -> _Started:
    """The model's record and the run's sessions: production made on the main thread, everything that does not
    need it done beside (``_Parts``): the inputs opened (``opened``), the model's hashes, the re-stamp's check and
    hashes, the outputs' CPU session and the batch-axis probe, the dump's plan, the accuracy's output. Every check
    runs before the first step."""
    try:
        return _start(source, opened, request, run, parts)
    except Exception:
        parts.join()
        raise


def _start(source: ModelSource, opened: Future, request: RunRequest, run: RunDirectory, parts: _Parts) -> _Started:
    options, batch, clock = request.options, request.batch_size, parts.clock
    model_path, restamped = source.path, None
    if request.dynamic_batch:  # the re-stamp needs the model now: read here, hashed beside
        read = _ready(parts.main("model md5", "model read", read_model_and_external_data, source.path))
    else:
        read = parts.beside("model read", "model md5", read_model_and_external_data, source.path)
    # the parts that are Python throughout (they hold the GIL) start once the inputs are opened: the listing, which
    # the re-stamp check and the input workers wait for, goes first at full speed
    record = parts.beside("model md5", "model md5", _model_record_after, source, read, after=opened)
    target = parts.beside("accuracy target", "accuracy target", _accuracy_target_after, source, read, opened,
                          after=opened)
    if request.dynamic_batch:
        model_path = run.file("model/model.onnx")
        try:
            restamped = _restamp_write(source.path, model_path, read.result()[0])
        except Exception:
            parts.settle(_ORDER.index("re-stamp"))
            _check_outputs(_outputs_session(source.path, options), source.path)  # checked before re-stamping
            raise
        clock.mark("re-stamp")
    outputs = None
    if request.dynamic_batch or batch != 1:
        outputs = parts.beside("outputs session", "outputs check", _outputs, source.path, model_path, options,
                               request.dynamic_batch, None if request.dynamic_batch else opened,
                               after=None if request.dynamic_batch else opened)
    restamp_md5 = None
    if request.dynamic_batch:
        sample = parts.beside("re-stamp sample", "re-stamp sample", _first_sample, opened)
        restamp_md5 = parts.beside("re-stamp md5", "re-stamp md5", _artifact, model_path, restamped, run.path,
                                   after=opened)
        # the check's sessions are made at once; they run the first sample once it is read
        original = parts.beside("re-stamp check of the original", None, _restamp_original, source.path, sample, options)
        parts.beside("re-stamp check", "re-stamp check", _restamp_check, source.path, model_path, sample, options,
                     original)
    probe = parts.beside("output probe", "output probe", _probe_part, outputs, opened, source.path) if batch != 1 else None
    # on the CUDA EP the input workers' ring is page-locked once the inputs are opened (CuPy imported here, beside)
    pin = parts.beside("pin inputs", "pin inputs", _pin_part, opened, options, after=opened) \
        if options.provider in PINNED_PROVIDERS else None
    plan = None
    if request.dump:  # what needs no step of the model begins at once; the splits wait for the probe (``_plan_part``,
        # timed from the probe's end)
        # a dump fingerprinted on the GPU leaves If branches opaque (``branches.NOT_ON_DEVICE``)
        exposed = parts.beside("dump plan", "dump plan", expose_plan, model_path, options, run.file("dump"),
                               not _device_asked(request))
        split = parts.beside("dump plan splits", "dump plan", _plan_part, probe, exposed, after=probe) \
            if probe is not None else exposed
        plan = (exposed, split)
        if _device_asked(request):  # the device recorder's start (CuPy, its kernels) begun beside, unplaced: its
            # error is the recorder's own, raised by its start on the main thread at its place, as before. A host
            # dump begins nothing earlier: numba's kernels loaded beside slowed the plan's splits on 2 cores
            # (start-up 1.29x, first step 1.02x); they load in the recorder's worker while the first inputs come
            parts.beside("recorder start", None, begin_device, int(options.option("device_id") or 0), after=opened)
    # beside a dump on the CPU its idle threads sleep, as the dump session's do: spinning, they took a core from the
    # fingerprint worker (step of open_nsfw QDQ 78-118 ms against 121-161, load 3-4.5; kernels unchanged: dump.py)
    sleeping = request.dump and options.provider == "cpu"
    production = parts.main("session", "session", lambda path, how: create_session(path, how, spinning=not sleeping),
                            model_path, options)
    inputs = parts.result("session", opened).inputs
    prepared = parts.main("output probe", None, _sessions, source, inputs, request, run, model_path,
                          production, parts, probe, plan)
    try:
        parts.settle()  # every check's verdict before the first step
    except BaseException:
        prepared.recorder.close()
        raise
    model = record.result()
    memory = pin.result() if pin is not None else pin_inputs(opened.result().stream, options)
    if restamp_md5 is not None:
        model.record["dynamic_batch"] = {"path": "model/model.onnx", **{
            k: v for k, v in restamp_md5.result().to_json().items() if k != "initializers"}}  # as hash_artifact's
    return _Started(model, prepared, target.result(), inputs, memory)


def _model_record_after(source: ModelSource, read: Future) -> _ModelRecord:
    return _model_record(source, read.result())


def _accuracy_target_after(source: ModelSource, read: Future, opened: Future) -> tuple[str | None, str]:
    """``_accuracy_target`` once the model is read and the inputs opened (parts done beside)."""
    return _accuracy_target(source, read.result()[0], opened.result().inputs)


def _pin_part(opened: Future, options: ExecutionOptions) -> InputMemory:
    """The input workers' ring page-locked for production's session (``pinned.pin_inputs``), once it is there;
    registered before the first step (``_ORDER``), unregistered by the ring's close whatever ends the run."""
    return pin_inputs(opened.result().stream, options)


def _first_sample(opened: Future) -> dict[str, np.ndarray]:
    return opened.result().inputs.sample(0)




def _outputs(source: Path, model_path: Path, options: ExecutionOptions, dynamic: bool,
             opened: Future | None) -> tuple[Any, QconsistError | None]:
    """The one session of the model's outputs (``_outputs_session``), of the model the run runs; with
    ``dynamic_batch`` its outputs checked as the original's were before re-stamping (a re-stamp changes no output's
    type: the same verdict, the same line). Where the model run cannot be loaded, the original's outputs are
    checked instead, and the load's error is kept for the probe that needs it (its place in ``_ORDER``). Without
    ``dynamic_batch`` it serves the probe alone: made once the inputs (``opened``) have several samples."""
    if opened is not None and len(opened.result().inputs) < 2:
        return None, None
    try:
        session = _outputs_session(model_path, options)
    except QconsistError as exc:
        if dynamic:
            _check_outputs(_outputs_session(source, options), source)
        return None, exc
    if dynamic:
        _check_outputs(session, source)
    return session, None


@dataclass
class _Probed:
    """The probe part's findings: where a step of several samples holds each output (None: nothing probed, a
    batch fixed in the graph), or the error that stopped it before it could probe."""

    probe: Probe | None
    finals: dict[str, Split] | None
    error: QconsistError | None = None


def _probe_part(outputs: Future, opened: Future, path: Path) -> _Probed:
    """The outputs' batch axes (``_output_splits``) where the set has several samples and every input's batch axis
    is free in the graph."""
    session, error = outputs.result()
    inputs = opened.result().inputs
    if len(inputs) < 2:
        return _Probed(None, None)
    if error is not None:
        return _Probed(None, None, error)
    if not all(axis is not None for axis in input_axes(input_specs(session)).values()):
        return _Probed(None, None)
    probe = _probe(inputs)
    return _Probed(probe, _output_splits(session, probe, path))


def _plan_part(probe: Future, exposed: Future) -> DumpPlan:
    """The dump's plan (``exposed``: ``expose_plan``'s, made meanwhile) split as the probe found the outputs' batch
    axes (none found — the probe could not run, or had nothing to probe —: one sample at a time)."""
    probed = probe.result()
    return split_plan(exposed.result(), probed.probe, probed.finals)


def _outputs_session(path: Path, options: ExecutionOptions) -> Any:
    """A session that tells the model's outputs: on the CPU, graph unoptimized (milliseconds), not the run's own
    EP (on the CUDA EP a second session of the run's, 0.5 s and more before the first step); the run's EP where
    the CPU cannot load the model."""
    try:
        return create_session(path, ExecutionOptions(intra_op_threads=1), level=OptimizationLevel.DISABLE)
    except QconsistError:
        return create_session(path, options)


def _output_splits(session: Any, probe: Probe, path: Path) -> dict[str, Split]:
    """Where each of the model's outputs holds the samples of a step, probed on the CPU with the graph unoptimized
    (``_outputs_session``'s ``session``). Which part of an output is whose is the graph's property, the same on every
    EP; the CPU computes a step of two as two steps of one, where the CUDA EP picks other convolution algorithms for
    another step size and a last-bit change before a QuantizeLinear moves a quantized output by a quantum — on an
    H200 open_nsfw QDQ's ``prob`` then had no batch axis and every ``--batch-size 32`` run was refused."""
    names = [o.name for o in session.get_outputs()]
    splits = probe_splits(lambda feed: _run(session, feed, path), probe.first, probe.second, probe.stack, f"model {path}",
                          probe.more)
    return dict(zip(names, splits))


def _sessions(source: ModelSource, inputs: InputSet, request: RunRequest, run: RunDirectory, model_path: Path,
              production: Any, parts: _Parts, probe: Future | None, plan: tuple[Future, Future] | None) -> _Prepared:
    """Production's checks, the probe's and the dump plan's findings (parts done beside: ``plan`` is the exposed
    graph's and the split one's), the recorder."""
    options, batch = request.options, request.batch_size
    _check_outputs(production, source.path)
    if batch != 1:
        check_batching(input_specs(production), batch, len(inputs))
    outputs = [o.name for o in production.get_outputs()]
    # the probe runs steps of 1 and 2 samples: a model whose batch is fixed at the step's size cannot (``batch.ONE``)
    free = all(axis is not None for axis in input_axes(input_specs(production)).values())
    probing = batch != 1 and len(inputs) > 1 and free
    parts.clock.mark("production checks")
    probed = parts.result("output probe", probe) if probe is not None else _Probed(None, None)
    if probed.error is not None and probing:
        raise probed.error  # the model run does not load on the CPU nor on the run's EP
    refit = probing != (probed.probe is not None)
    if refit:  # production's inputs read otherwise than the outputs session's
        probed = _Probed(_probe(inputs), None) if probing else _Probed(None, None)
        probed.finals = _output_splits(_outputs_session(model_path, options), probed.probe, source.path) if probing else None
    found = None
    if plan is not None:  # refit: the exposed graph split again as production reads its inputs, not made twice
        found = split_plan(parts.result("dump plan", plan[0]), probed.probe, probed.finals) if refit else \
            parts.result("dump plan", plan[1])
    splits = [ONE] * len(outputs)
    if found is not None:
        splits = [found.splits[found.column(name)] for name in outputs]
    elif probed.finals is not None:
        splits = [probed.finals[name] for name in outputs]
        unknown = [(n, s) for n, s in zip(outputs, splits) if s.kind == "unknown"]
        if unknown:
            raise UnsupportedModelError(f"output {unknown[0][0]!r} cannot be split into the samples of a step "
                                        f"({unknown[0][1].why}); run with `batch_size` 1")
    reference = _Reference(request.reference, found, len(inputs)) if found and request.reference else None
    raw_columns = select_raw(found, request.raw) if found else set()
    if found is not None and request.raw.mode is RawMode.AUTO:
        raw_columns = {found.column(name) for name in found.outputs}
    raw = {**request.raw.to_json(), "reference": str(request.reference) if request.reference else None, "dir": "dump/raw"}
    recorder = make_recorder(found, options, run.path, len(inputs), _on_device(found, request), raw_columns, raw,
                             request.raw.mode, reference.differing if reference else None)
    parts.clock.mark("recorder")
    return _Prepared(model_path, production, outputs, found, reference, recorder, splits)


def _probe(inputs: InputSet) -> Probe:
    """Samples 0 and another that differs from it, stacked as the run's steps stack them."""
    first = inputs.sample(0)
    second = distinct_second(inputs.sample, len(inputs), first)
    return Probe(first, second, lambda samples: stack(samples, 0, inputs.axes),
                 further_samples(inputs.sample, len(inputs), first))


def _check_outputs(session: Any, path: Path) -> None:
    """Every output is a tensor of a type qconsist records (a sequence, map or optional output, or a float8, int4,
    bfloat16 or string tensor, is refused in one line)."""
    for out in session.get_outputs():
        if not out.type.startswith("tensor("):
            raise UnsupportedModelError(f"model {path}: output {out.name!r} is {out.type}, not a tensor; qconsist "
                                        "records tensors")
        if not records_type(out.type):
            raise UnsupportedModelError(f"model {path}: output {out.name!r} is {out.type}, an element type qconsist "
                                        "does not record (bool, float16/32/64, and 8- to 64-bit integers)")


def _run(session: Any, feed: dict[str, np.ndarray], path: Path, where: str = "") -> list[np.ndarray]:
    """``session.run`` of every output; onnxruntime's failure on the model is the model's, said in one line."""
    try:
        return session.run(None, feed)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors at run time
        raise UnsupportedModelError(f"onnxruntime cannot run model {path}{where}: {ort_message(exc)}") from None


def _device_asked(request: RunRequest) -> bool:
    """Whether a dump is to fingerprint on the GPU: asked for, or ``auto`` on the CUDA EP with CuPy installed."""
    cuda_auto = request.fingerprints == "auto" and request.options.provider == "cuda"
    return request.fingerprints == "device" or (cuda_auto and _cupy_installed())


def _on_device(plan: DumpPlan | None, request: RunRequest) -> bool:
    """Whether a dump fingerprints on the GPU: asked for, or ``auto`` on the CUDA EP with CuPy installed."""
    cuda_auto = request.fingerprints == "auto" and request.options.provider == "cuda"
    on_device = plan is not None and _device_asked(request)
    if plan is not None and cuda_auto and not on_device:
        log.warning("CuPy is not installed (qconsist[gpu] brings cupy-cuda13x): fingerprinting on the host, "
                    "which copies every tensor off the GPU; the hashes are the same function (qc-mix64/1)")
    return on_device


def _accuracy_target(source: ModelSource, model: onnx.ModelProto, inputs: InputSet) -> tuple[str | None, str]:
    """The class-scores output whose accuracy the run records, or why there is none (the graph's reading, and
    the float model's where the model is quantized: ``run_inference`` does it beside the sessions' creation)."""
    if inputs.labels is None:
        return None, ""
    try:
        judged = judged_outputs(_float_model(source, model), _declared_kinds(source))
        target = class_scores_output(judged, "accuracy against the labels")
    except ConfigError as exc:
        return None, exc.message
    return target.output, ""


def _accuracy_counter(target: tuple[str | None, str], outputs: list[str]) -> tuple[AccuracyCounter | None, int, str]:
    """The counter of the class-scores output's accuracy, that output's position, or why there is none."""
    output, note = target
    if note:
        log.warning("no accuracy recorded: %s", note)
    if output is None:
        return None, -1, note
    return AccuracyCounter(output), outputs.index(output), ""


def _quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear") for n in model.graph.node)


def _float_model(source: ModelSource, model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph the outputs' kinds are read from, as the gate reads them: a quantized model's float model (the
    last stage before it, in the run it came from, whose graph holds no quantized node), else the model itself
    (a Softmax followed by its QuantizeLinear/DequantizeLinear still makes class scores)."""
    if source.run is None or not _quantized(model):
        return model
    stages = source.run.model_stages()
    for stage in reversed(stages[:stages.index(source.stage)] if source.stage in stages else []):
        found = source.run.model(stage)
        if found is not None and not _quantized(found):
            return found
    return model


def _declared_kinds(source: ModelSource) -> dict[str, Any]:
    """The output kinds the pipeline the model came from declared (``[evaluation] outputs``)."""
    for key in ("config", "pipeline"):
        config = source.manifest.sections.get(key) if source.manifest is not None else None
        if isinstance(config, dict) and "calibration" in config:
            return parse_kinds(config.get("outputs") or {}, f"run {source.run_dir}: [evaluation] outputs")
    return {}


@dataclass
class _Loop:
    """What the steps produced besides the files: sample infos, production's time, the accuracy."""

    infos: list[SampleInfo]
    seconds: float
    accuracy: AccuracyCounter | None
    # where the main thread spent the steps' time besides production (logged, never recorded): waiting for the
    # input workers' next step, the dump's recorder, writing the outputs and counting the accuracy, the progress
    spans: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("inputs", "recorder", "outputs", "progress"), 0.0))

    def describe(self, wall: float) -> str:
        shares = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in [("session", self.seconds), *self.spans.items()])
        return f"{len(self.infos)} samples in {wall:.2f} s on the main thread: {shares}"


def _steps(stream: Any, prepared: _Prepared, writer: OutputWriter, accuracy: tuple[AccuracyCounter | None, int],
           labels: np.ndarray, task: Any, clock: Startup) -> _Loop:
    """Every step: the recorder's part, production (alone, so its time per sample is its own), the outputs; the
    start-up's line logged once the first step is in (``startup``)."""
    counter, position = accuracy
    loop = _Loop([], 0.0, counter)
    recorder, spans, clock, startup = prepared.recorder, loop.spans, time.perf_counter, clock
    steps, begun = iter(stream), clock()
    while True:
        mark = clock()
        made = next(steps, None)  # input workers prepare the next steps meanwhile (inputs.stream)
        spans["inputs"] += clock() - mark
        if startup is not None:  # the first step is in: the start-up ends
            startup.mark("first inputs")
            log.info("start-up: %s", startup.describe())
            startup = None
        if made is None:
            break
        index, step, step_infos = made
        count = len(step_infos)
        loop.infos += step_infos
        mark = clock()
        recorder.before(step, count)
        start = clock()
        where = f" on sample {index}" if count == 1 else f" on samples {index}..{index + count - 1}"
        produced = _run(prepared.production, step, prepared.model_path, where)
        end = clock()
        loop.seconds += end - start
        rows = [split.rows(array, count, name) for split, array, name in zip(prepared.splits, produced, prepared.outputs)]
        writer.write_step(produced, count, rows)
        if counter is not None:
            counter.add(np.stack([np.asarray(r) for r in rows[position]]), labels[index:index + count])
        written = clock()
        recorder.after(index, produced, count)
        advanced = clock()
        task.advance(count)
        spans["recorder"] += (start - mark) + (advanced - written)
        spans["outputs"] += written - end
        spans["progress"] += clock() - advanced
    log.info("steps: %s", loop.describe(clock() - begun))
    return loop


def run_inference(
    source: ModelSource,
    inputs: InputSet | Callable[[], InputSet],
    request: RunRequest,
    runs_root: Path,
    *,
    run_id: str | None = None,
    command: Sequence[str] = (),
    progress: Progress = NULL_PROGRESS,
    startup: Startup | None = None,
) -> InferenceResult:
    """Run every sample of ``inputs`` through ``source``'s model as ``request`` says; write a run directory.

    ``inputs``: the input set, or the function that opens it (``pipeline.inputs.open_inputs``, as the command line
    passes it): the set is then opened — a folder listed, its first sample checked — and its input workers started
    in a thread while production's session is made, and an error of the inputs is still the run's first (before
    the run directory's, the model's). ``startup``: the clock of the start-up so far (the command line's),
    continued here and logged at the first step."""
    clock = startup or Startup()
    clock.mark_pending()
    clock.run_begun = time.perf_counter()
    parts = _Parts(clock)
    if callable(inputs):
        opened = parts.beside("inputs", "inputs", _open_inputs, inputs, source, request.batch_size)
    else:  # as it was: checked now, its input workers started once the run directory is made
        opened = _ready(_open_inputs(inputs, source, None))
        clock.mark("input axes")
    try:
        return _inference(source, opened, request, runs_root, run_id, command, progress, parts)
    finally:
        parts.shutdown()
        if opened.done() and opened.exception() is None:
            opened.result().close()  # where the run stopped before its steps


def _inference(source: ModelSource, opened: Future, request: RunRequest, runs_root: Path, run_id: str | None,
               command: Sequence[str], progress: Progress, parts: _Parts) -> InferenceResult:
    clock = parts.clock
    prefetch_gpus()  # nvidia-smi, which the manifest's environment asks at the end, answers meanwhile
    label = f"run-{source.describe().get('name') or source.path.stem}"
    with parts.main("run directory", None, RunDirectory.create, runs_root, label, KIND, run_id) as run, \
            capture_ort_log(run.file(ORT_LOG), str(run.path / ORT_LOG)) as ort_log:
        if opened.done() and opened.result().stream is None:  # a set given opened: its input workers start now
            opened.result().stream = opened.result().inputs.steps(request.batch_size, borrowed=True)
        clock.mark("run directory and workers")
        started = _prepare(source, opened, request, run, parts)
        model, prepared, inputs, stream = started.model, started.prepared, started.inputs, opened.result().stream
        counter, position, note = _accuracy_counter(started.target, prepared.outputs)
        labels = labels_array(inputs.labels.of(inputs.names)) if counter is not None else np.zeros(0, np.int64)
        run.mark_progress("inference")
        writer = OutputWriter(run.path / "outputs", prepared.outputs, len(inputs))
        clock.mark("writer")
        try:
            with progress.task("inference" + prepared.recorder.description, len(inputs)) as task:
                clock.mark("progress")
                loop = _steps(stream, prepared, writer, (counter, position), labels, task, clock)
            dump = prepared.recorder.finish(len(inputs), lambda s: _production_distinct(prepared.production, inputs, request.batch_size, s))
        finally:
            prepared.recorder.close()
            # the input workers stopped and their ring released (unregistered where it was page-locked) now, once
            # no session reads a step, not after the run is recorded complete: what follows that record is only the
            # process's end, where a Ctrl-C still makes it say "interrupted" (tests/store/test_signals.py)
            opened.result().close()
        manifest, result = _record(source, inputs, request, run, model, prepared, writer, loop, dump, note, command,
                                   started.memory)
        if request.engines:
            run.mark_progress("engines")
            manifest.sections["engines"] = _engines(prepared.model_path, request.options, inputs.step(0, request.batch_size),
                                                    request, prepared.plan, run.file("engines/optimized.onnx")).to_json()
        if ort_log.refresh():
            manifest.sections["onnxruntime_log"] = ort_log.to_json()
        result.run_dir = run.finish(manifest)
        result.onnxruntime_log = ort_log if ort_log.lines else None
    return result


def _record(source: ModelSource, inputs: InputSet, request: RunRequest, run: RunDirectory, model: _ModelRecord,
            prepared: _Prepared, writer: OutputWriter, loop: _Loop, dump: DumpSummary | None,
            note: str, command: Sequence[str], memory: InputMemory | None = None) -> tuple[Manifest, InferenceResult]:
    """The manifest of a finished inference (the run directory writes it) and the result."""
    recorded_inputs = record_inputs(inputs, loop.infos, run.file(SAMPLES_FILE), SAMPLES_FILE)
    reference = prepared.reference
    if reference is not None and not _same_inputs(reference.digest, recorded_inputs["digest"], inputs):
        raise InputError(f"`reference` {reference.run_dir} ran on other inputs (digest differs); `raw` auto needs the same input set")
    shapes = ShapeTable()
    files = writer.close(shapes)
    accuracy = loop.accuracy.result() if loop.accuracy is not None else None
    if loop.accuracy is not None and accuracy is None:
        note = loop.accuracy.problem or "no sample has a label"
        log.warning("no accuracy recorded: %s", note)
    section = InferenceSection(
        options=request.options.to_json(), providers=prepared.production.get_providers(), samples=len(inputs),
        batch_size=request.batch_size, ms_per_sample=1000 * loop.seconds / len(inputs), outputs=prepared.outputs,
        output_shapes=shapes.to_json(), output_format=OUTPUTS_FORMAT, output_files=files, accuracy=accuracy,
        accuracy_note=note, input_memory=memory,
    )
    sections: dict[str, Any] = {"inference": section.to_json()}
    if dump is not None:
        sections["dump"] = dump.to_json()
        if not dump.faithful:
            log.warning("dump is NOT faithful: final outputs of %d/%d samples differ from production (max %.3g)",
                        len(dump.mismatched_samples), len(inputs), dump.max_abs_diff)
    manifest = Manifest(kind=KIND, command=list(command), model=model.record, inputs=recorded_inputs,
                        stages=model.stages, environment=environment_fingerprint(), sections=sections)
    result = InferenceResult(run.path, run.run_id, len(inputs), section.ms_per_sample, prepared.outputs, dump,
                             accuracy=accuracy)
    return manifest, result


def _same_inputs(recorded: str, digest: str, inputs: InputSet) -> bool:
    """Whether a reference run's recorded input digest names ``inputs`` (digest ``digest``); a reference
    recorded with sha256 (before qconsist 0.2) is compared with the sha256 of these inputs."""
    same = same_inputs(recorded, digest)
    if same is None and digest_kind(recorded) == SHA256:
        return recorded == inputs.digest(SHA256)
    return bool(same)


def _cupy_installed() -> bool:
    """Whether CuPy can be imported (without importing it: a CUDA context is only made when a dump starts)."""
    return importlib.util.find_spec("cupy") is not None
