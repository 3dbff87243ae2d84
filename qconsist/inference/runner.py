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
from contextlib import closing
import hashlib
import importlib.util
from concurrent.futures import Future, ThreadPoolExecutor, wait
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from qconsist.compare import compare_outputs
from qconsist.compare.accuracy import AccuracyCounter, labels_array
from qconsist.compare.kinds import class_scores_output, judged_outputs, parse_kinds
from qconsist.environment import fingerprint as environment_fingerprint
from qconsist.environment import prefetch_gpus
from qconsist.errors import ConfigError, InputError, QconsistError, UnsupportedModelError
from qconsist.inference.batch import ONE, Split, distinct_second, probe_splits
from qconsist.inference.dump import DumpPlan, Probe, RawMode, RawSelection, observed_graph, plan_dump, select_raw
from qconsist.inference.engines import EngineRecord, EngineRequest, record_engines
from qconsist.inference.fingerprint import HASH_FUNCTION, HASH_FUNCTIONS, check_hash_functions
from qconsist.inference.graphmap import structure_hash
from qconsist.inference.model import ModelSource, with_dynamic_batch
from qconsist.inference.reader import load_dump
from qconsist.inference.recording import StepRecorder, make_recorder
from qconsist.inference.session import (
    ExecutionOptions, OptimizationLevel, create_session, input_specs, ort_message, records_type,
)
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
from qconsist.store.hashing import hash_artifact, hash_file, read_model_and_external_data
from qconsist.store.manifest import MANIFEST_NAME, Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import OrtLog, capture_ort_log
from qconsist.store.run import SOURCE_KEY, Run
from qconsist.store.rundir import RunDirectory
from qconsist.store.sections import Accuracy, DumpSummary, InferenceSection, table_digest
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


def _model_record(source: ModelSource) -> _ModelRecord:
    model, external = read_model_and_external_data(source.path)
    hashes = hash_artifact(source.path, model=model).to_json()
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


def _restamp(source: Path, target: Path, sample: dict[str, np.ndarray], options: ExecutionOptions) -> Path:
    """``source`` re-stamped to take any batch, written to ``target`` once a step of two copies of a real
    sample gives, per row, what the original gives for the sample (within float rounding). Whether the graph
    computes per sample is the graph's property, checked on the CPU EP at the run's optimization level: on the
    CUDA EP the kernels themselves depend on the batch (open_nsfw QDQ on the H100: batch 2 and batch 1 one
    quantization step apart in ``prob``), which is what a run at another batch size is there to show."""
    _restamp_write(source, target)
    return _restamp_check(source, target, sample, options)


def _restamp_write(source: Path, target: Path) -> None:
    original = read_onnx(source, external_data=True)
    write_bytes_atomic(target, with_dynamic_batch(original).SerializeToString())


def _restamp_check(source: Path, target: Path, sample: dict[str, np.ndarray], options: ExecutionOptions) -> Path:
    """``_restamp``'s check of the file written (two CPU sessions, one thread each: 2.8 s of a 10,000-JPEG run's
    3.2 s start-up on the H200 machine, so ``_prepare`` runs it beside the run's own sessions)."""
    options = ExecutionOptions(graph_optimization_level=options.graph_optimization_level, intra_op_threads=1,
                               disabled_optimizers=options.disabled_optimizers)
    try:
        restamped = create_session(target, options)
        pair = restamped.run(None, {k: np.concatenate([v, v]) for k, v in sample.items()})
    except QconsistError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors at run time
        raise UnsupportedModelError(f"{source} cannot take another batch size (`dynamic_batch`): {ort_message(exc)}") from None
    single = create_session(source, options).run(None, sample)
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


def _prepare(source: ModelSource, inputs: InputSet, request: RunRequest, run: RunDirectory,
             model: _ModelRecord) -> _Prepared:
    options = request.options
    model_path = source.path
    check: Future | None = None
    if request.dynamic_batch:
        _check_outputs(_outputs_session(source.path, options), source.path)  # a sequence output: refused before re-stamping
        model_path = run.file("model/model.onnx")
        _restamp_write(source.path, model_path)
        # the check (CPU sessions) runs beside the run's own sessions, off the start-up's critical path; the run
        # waits for its verdict before its first step
        check = _BESIDE.submit(_restamp_check, source.path, model_path, inputs.sample(0), options)
        restamped = {k: v for k, v in hash_artifact(model_path, run.path).to_json().items() if k != "initializers"}
        model.record["dynamic_batch"] = {"path": "model/model.onnx", **restamped}
    try:
        prepared = _sessions(source, inputs, request, run, model_path)
    except BaseException:
        if check is not None:
            check.result()  # the check's verdict first: a re-stamped graph that is wrong may be why
        raise
    if check is not None:
        try:
            check.result()
        except BaseException:
            prepared.recorder.close()
            raise
    return prepared


def _outputs_session(path: Path, options: ExecutionOptions) -> Any:
    """A session that tells the model's outputs: on the CPU, graph unoptimized (milliseconds), not the run's own
    EP (on the CUDA EP a second session of the run's, 0.5 s and more before the first step); the run's EP where
    the CPU cannot load the model."""
    try:
        return create_session(path, ExecutionOptions(intra_op_threads=1), level=OptimizationLevel.DISABLE)
    except QconsistError:
        return create_session(path, options)


def _output_splits(model_path: Path, options: ExecutionOptions, probe: Probe, path: Path) -> dict[str, Split]:
    """Where each of the model's outputs holds the samples of a step, probed on the CPU with the graph unoptimized
    (``_outputs_session``). Which part of an output is whose is the graph's property, the same on every EP; the
    CPU computes a step of two as two steps of one, where the CUDA EP picks other convolution algorithms for
    another step size and a last-bit change before a QuantizeLinear moves a quantized output by a quantum — on an
    H200 open_nsfw QDQ's ``prob`` then had no batch axis and every ``--batch-size 32`` run was refused."""
    session = _outputs_session(model_path, options)
    names = [o.name for o in session.get_outputs()]
    splits = probe_splits(lambda feed: _run(session, feed, path), probe.first, probe.second, probe.stack, f"model {path}")
    return dict(zip(names, splits))


# work beside the run's own sessions: the re-stamp check, the accuracy's output
_BESIDE = ThreadPoolExecutor(2, thread_name_prefix="qconsist-beside")


def _sessions(source: ModelSource, inputs: InputSet, request: RunRequest, run: RunDirectory, model_path: Path) -> _Prepared:
    options, batch = request.options, request.batch_size
    # beside a dump on the CPU its idle threads sleep, as the dump session's do: spinning, they took a core from the
    # fingerprint worker (step of open_nsfw QDQ 78-118 ms against 121-161, load 3-4.5; kernels unchanged: dump.py)
    production = create_session(model_path, options, spinning=not (request.dump and options.provider == "cpu"))
    _check_outputs(production, source.path)
    if batch != 1:
        check_batching(input_specs(production), batch, len(inputs))
    outputs = [o.name for o in production.get_outputs()]
    # the probe runs steps of 1 and 2 samples: a model whose batch is fixed at the step's size cannot (``batch.ONE``)
    free = all(axis is not None for axis in input_axes(input_specs(production)).values())
    probe = _probe(inputs) if batch != 1 and len(inputs) > 1 and free else None
    finals = _output_splits(model_path, options, probe, source.path) if probe is not None else None
    plan = plan_dump(model_path, options, run.file("dump"), probe, finals) if request.dump else None
    splits = [ONE] * len(outputs)
    if plan is not None:
        splits = [plan.splits[plan.column(name)] for name in outputs]
    elif finals is not None:
        splits = [finals[name] for name in outputs]
        unknown = [(n, s) for n, s in zip(outputs, splits) if s.kind == "unknown"]
        if unknown:
            raise UnsupportedModelError(f"output {unknown[0][0]!r} cannot be split into the samples of a step "
                                        f"({unknown[0][1].why}); run with `batch_size` 1")
    reference = _Reference(request.reference, plan, len(inputs)) if plan and request.reference else None
    raw_columns = select_raw(plan, request.raw) if plan else set()
    if plan is not None and request.raw.mode is RawMode.AUTO:
        raw_columns = {plan.column(name) for name in plan.outputs}
    raw = {**request.raw.to_json(), "reference": str(request.reference) if request.reference else None, "dir": "dump/raw"}
    recorder = make_recorder(plan, options, run.path, len(inputs), _on_device(plan, request), raw_columns, raw,
                             request.raw.mode, reference.differing if reference else None)
    return _Prepared(model_path, production, outputs, plan, reference, recorder, splits)


def _probe(inputs: InputSet) -> Probe:
    """Samples 0 and another that differs from it, stacked as the run's steps stack them."""
    first = inputs.sample(0)
    second = distinct_second(inputs.sample, len(inputs), first)
    return Probe(first, second, lambda samples: stack(samples, 0, inputs.axes))


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


def _on_device(plan: DumpPlan | None, request: RunRequest) -> bool:
    """Whether a dump fingerprints on the GPU: asked for, or ``auto`` on the CUDA EP with CuPy installed."""
    cuda_auto = request.fingerprints == "auto" and request.options.provider == "cuda"
    on_device = plan is not None and (request.fingerprints == "device" or (cuda_auto and _cupy_installed()))
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
           labels: np.ndarray, task: Any) -> _Loop:
    """Every step: the recorder's part, production (alone, so its time per sample is its own), the outputs."""
    counter, position = accuracy
    loop = _Loop([], 0.0, counter)
    recorder, spans, clock = prepared.recorder, loop.spans, time.perf_counter
    steps, begun = iter(stream), clock()
    while True:
        mark = clock()
        made = next(steps, None)  # input workers prepare the next steps meanwhile (inputs.stream)
        spans["inputs"] += clock() - mark
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
    inputs: InputSet,
    request: RunRequest,
    runs_root: Path,
    *,
    run_id: str | None = None,
    command: Sequence[str] = (),
    progress: Progress = NULL_PROGRESS,
) -> InferenceResult:
    """Run every sample of ``inputs`` through ``source``'s model as ``request`` says; write a run directory."""
    if len(inputs) == 0:
        raise InputError(f"input set {inputs.source} is empty")
    begun = time.perf_counter()
    prefetch_gpus()  # nvidia-smi, which the manifest's environment asks at the end, answers meanwhile
    label = f"run-{source.describe().get('name') or source.path.stem}"
    if inputs.axes is None:  # a set not checked against the model: its inputs' batch axes from the graph
        axes = {name: axis for name, axis in input_axes(input_specs(source.path)).items() if axis}
        inputs = dataclasses.replace(inputs, axes=axes or None)
    with RunDirectory.create(runs_root, label, KIND, run_id) as run, \
            capture_ort_log(run.file(ORT_LOG), str(run.path / ORT_LOG)) as ort_log, \
            closing(inputs.steps(request.batch_size, borrowed=True)) as stream:
        # the input workers start now and prepare the first steps while the model is hashed and its sessions made
        model = _model_record(source)
        # the output whose accuracy is counted is read from the graph meanwhile (onnxruntime lets the GIL go)
        target = _BESIDE.submit(_accuracy_target, source, model.model, inputs)
        try:
            prepared = _prepare(source, inputs, request, run, model)
        except BaseException:
            wait([target])  # the sessions' error is the run's (the accuracy's came after it, when it ran after)
            raise
        counter, position, note = _accuracy_counter(target.result(), prepared.outputs)
        labels = labels_array(inputs.labels.of(inputs.names)) if counter is not None else np.zeros(0, np.int64)
        run.mark_progress("inference")
        writer = OutputWriter(run.path / "outputs", prepared.outputs, len(inputs))
        log.info("start-up: %.2f s from run_inference's start (imports, options and the input listing before it) to the first step", time.perf_counter() - begun)
        try:
            with progress.task("inference" + prepared.recorder.description, len(inputs)) as task:
                loop = _steps(stream, prepared, writer, (counter, position), labels, task)
            dump = prepared.recorder.finish(len(inputs), lambda s: _production_distinct(prepared.production, inputs, request.batch_size, s))
        finally:
            prepared.recorder.close()
        manifest, result = _record(source, inputs, request, run, model, prepared, writer, loop, dump, note, command)
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
            note: str, command: Sequence[str]) -> tuple[Manifest, InferenceResult]:
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
        accuracy_note=note,
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
