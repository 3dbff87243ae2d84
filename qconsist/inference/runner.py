"""``qconsist run``: inference of a model on an input set, written to a run directory of kind ``inference``.

Files written (besides ``manifest.json``)::

    outputs/fingerprints.npy   RECORD[samples, outputs] of the production session's final outputs
    outputs/<sample>.npz       the final outputs of each sample (keys o<index>, order of sections.inference.outputs)
    inputs/samples.jsonl       every sample's name, digest, file digest and label (qconsist.inputs.record)
    dump/...                   with --dump (see qconsist.inference.dump)
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from qconsist.compare import compare_outputs
from qconsist.environment import fingerprint as environment_fingerprint
from qconsist.errors import ConfigError, InputError, QconsistError, UnsupportedModelError
from qconsist.inference import dump as dump_module
from qconsist.inference.dump import (
    DumpPlan, DumpRecorder, RawMode, RawSelection, observed_graph, plan_dump, save_npz, select_raw,
)
from qconsist.inference.device import DeviceDump
from qconsist.inference.engines import EngineRecord, EngineRequest, record_engines
from qconsist.inference.fingerprint import HASH_FUNCTION, RECORD, FingerprintTable, check_hash_functions
from qconsist.inference.kernels import HASH_NAME
from qconsist.inference.graphmap import structure_hash
from qconsist.inference.model import ModelSource, with_dynamic_batch
from qconsist.inference.session import ExecutionOptions, create_session, input_specs, ort_message
from qconsist.inputs.digest import SHA256, digest_kind, same_inputs
from qconsist.inputs.inputset import InputSet, check_batch_size, check_batching
from qconsist.inputs.record import SAMPLES_FILE, record_inputs
from qconsist.inputs.stream import SampleInfo
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.atomic import write_bytes_atomic, write_json_atomic
from qconsist.store.hashing import hash_artifact
from qconsist.store.manifest import Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import OrtLog, capture_ort_log
from qconsist.store.rundir import RunDirectory
from qconsist.store.serde import structure, to_jsonable
from qconsist.inference.reader import load_dump

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


@dataclass
class DumpSummary:
    """What a ``--dump`` recorded (the manifest's ``sections.dump``): the faithfulness verdict against
    production, the tensors dumped and where the files are."""

    faithful: bool
    samples_checked: int
    mismatched_samples: list[int]
    max_abs_diff: float
    tensors: int
    ms_per_sample: float
    structure: str
    original_structure: str
    level: str
    raw: dict[str, Any]
    optimized: str = "dump/optimized.onnx"
    index: str = "dump/index.json"
    fingerprints: str = "dump/fingerprints.npy"
    bytes_per_tensor_per_sample: int = RECORD.itemsize
    fingerprints_in_worker_thread: bool = True
    fingerprints_on: str = "host"  # "device": computed on the GPU (qconsist.inference.device)
    hash_function: str = HASH_NAME
    # seconds per sample in the dump session's parts (device dumps): ORT with every output exposed,
    # the fingerprint kernels, copies of final outputs and raw tensors to the host
    seconds_per_sample: dict[str, float] = field(default_factory=dict)
    # when not faithful: does production itself give other outputs from run to run on the first mismatched
    # sample (distinct outputs in PRODUCTION_REPEATS runs)? Then no dump can match it bit for bit.
    production_distinct: int | None = None

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DumpSummary":
        return structure(cls, data)


@dataclass
class InferenceResult:
    run_dir: Path
    run_id: str
    samples: int
    ms_per_sample: float  # production session
    outputs: list[str]
    dump: DumpSummary | None = None
    onnxruntime_log: OrtLog | None = None  # onnxruntime's own log lines, kept in the run directory

    @property
    def passed(self) -> bool:
        """False when a dump did not reproduce the production outputs bit for bit."""
        return self.dump is None or self.dump.faithful

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir), "run_id": self.run_id, "samples": self.samples,
            "ms_per_sample": self.ms_per_sample, "outputs": self.outputs,
            "dump": self.dump.to_json() if self.dump is not None else None, "passed": self.passed,
            "onnxruntime_log": self.onnxruntime_log.to_json() if self.onnxruntime_log else None,
        }


_CURRENT = (0, 0.0, 0.0, 0.0, 0, 0, 0, 0, 1, HASH_FUNCTION)  # a record of the hash function this run writes


class _Reference:
    """The fingerprints of a reference dump, looked up by the key two dumps share."""

    def __init__(self, run_dir: Path, plan: DumpPlan, samples: int) -> None:

        ref = load_dump(run_dir)
        check_hash_functions(ref.table, np.array([[_CURRENT]], dtype=RECORD), f"`reference` {run_dir}", "this run")
        if ref.table.shape[0] != samples:
            raise ConfigError(f"`reference` {run_dir} has {ref.table.shape[0]} samples, this run {samples}")
        same_graph = ref.structure == plan.structure
        keys = [t.name if same_graph else t.original for t in plan.tensors]
        ref_keys = {(t.name if same_graph else t.original): i for i, t in enumerate(ref.tensors)}
        self.pairs = [(c, ref_keys[k]) for c, k in enumerate(keys) if k is not None and k in ref_keys]
        self.table = ref.table
        self.digest = ref.inputs_digest
        self.run_dir = run_dir

    def differing(self, sample: int, row: np.ndarray) -> set[int]:
        """Columns of this run's ``row`` whose bytes or type differ from the reference's sample."""
        ref_row = self.table[sample]
        return {
            c for c, r in self.pairs
            if row[c]["hash"] != ref_row[r]["hash"] or row[c]["dtype"] != ref_row[r]["dtype"]
        }


def _model_record(source: ModelSource) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    model = onnx.load(str(source.path))
    hashes = hash_artifact(source.path, model=model).to_json()
    hashes["path"] = str(source.path.resolve())
    structure = structure_hash(model)
    record = {**source.describe(), "path": str(source.path.resolve()), "artifact": hashes, "structure": structure}
    if source.stages:
        stages = [dict(s) for s in source.stages]
        for stage in stages:
            artifact = stage.get("artifact")
            if isinstance(artifact, dict) and source.run_dir is not None and not Path(artifact.get("path", "/")).is_absolute():
                stage["artifact"] = {**artifact, "path": str((source.run_dir / artifact["path"]).resolve())}
    else:
        stages = [{"name": "model", "params": {}, "artifact": hashes}]
    return record, stages, structure


def _rows(step: dict[str, np.ndarray]) -> int:
    first = next(iter(step.values()))
    return int(first.shape[0]) if first.ndim else 1


def _restamp(source: Path, target: Path, sample: dict[str, np.ndarray], options: ExecutionOptions) -> Path:
    """``source`` re-stamped to take any batch, written to ``target`` once a step of two copies of a real
    sample gives, per row, what the original gives for the sample (within float rounding)."""
    original = onnx.load(str(source))
    write_bytes_atomic(target, with_dynamic_batch(original).SerializeToString())
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
        graph_path, observed = plan.optimized_path, observed_graph(onnx.load(str(plan.optimized_path)), plan)
        order, labels = [n.name for n in observed.nodes], {n.name: n.label for n in observed.nodes}
    else:
        create_session(model_path, options, optimized_model_filepath=optimized)
        graph_path, order, labels = optimized, None, None
    label = options.provider + "/" + "/".join(f"{k}={v}" for k, v in sorted(options.provider_options.items()))
    return record_engines(EngineRequest(model_path, options, step, request.engine_runs), graph_path, label, order, labels)


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
    options, batch = request.options, request.batch_size
    label = f"run-{source.describe().get('name') or source.path.stem}"
    with RunDirectory.create(runs_root, label, KIND, run_id) as run, \
            capture_ort_log(run.file(ORT_LOG), str(run.path / ORT_LOG)) as ort_log:
        stream = inputs.steps(batch, borrowed=True)  # the input workers start while the model loads
        model_record, stages, structure = _model_record(source)
        model_path = source.path
        if request.dynamic_batch:
            model_path = _restamp(source.path, run.file("model/model.onnx"), inputs.sample(0), options)
            model_record["dynamic_batch"] = {"path": "model/model.onnx", **hash_artifact(model_path, run.path).to_json()}
        production = create_session(model_path, options)
        if batch != 1:
            check_batching(input_specs(production), batch, len(inputs))
        output_names = [o.name for o in production.get_outputs()]
        probe = inputs.sample(0) if batch != 1 else None
        plan = plan_dump(model_path, options, run.file("dump"), probe) if request.dump else None
        reference = _Reference(request.reference, plan, len(inputs)) if plan and request.reference else None
        raw_columns = select_raw(plan, request.raw) if plan else set()
        if plan is not None and request.raw.mode is RawMode.AUTO:
            raw_columns = {plan.column(name) for name in plan.outputs}
        run.mark_progress("inference")
        outputs_table = FingerprintTable(run.file("outputs/fingerprints.npy"), len(inputs), len(output_names))
        infos: list[SampleInfo] = []  # what the input workers learnt of each sample: digests, image modes
        names = [t.name for t in plan.tensors] if plan else []
        recorder = DumpRecorder(
            FingerprintTable(run.file("dump/fingerprints.npy"), len(inputs), len(plan.tensors)),
            [names.index(n) for n in output_names], raw_columns,
            lambda index: run.file(f"dump/raw/{index:06d}.npz"), reference.differing if reference else None,
        ) if plan else None
        seconds = {"production": 0.0, "dump": 0.0}
        on_device = plan is not None and (request.fingerprints == "device" or (
            request.fingerprints == "auto" and options.provider == "cuda" and _cupy_installed()))
        if plan is not None and request.fingerprints == "auto" and options.provider == "cuda" and not on_device:
            log.warning("CuPy is not installed (qconsist[gpu] brings cupy-cuda13x): fingerprinting on the host, "
                        "which copies every tensor off the GPU; the hashes are the same function (qc-mix64/1)")
        device = None
        if on_device:
            device = DeviceDump(plan.session, names, plan.dtypes, plan.batched, recorder.table.shapes,  # type: ignore[union-attr]
                                int(options.option("device_id") or 0), {c: plan.tensors[c].layout for c in plan.relaid})  # type: ignore[union-attr]
            host_columns = sorted(set(recorder._final) | raw_columns) if request.raw.mode is not RawMode.AUTO else None  # type: ignore[union-attr]
        try:
            with progress.task("inference" + (" + dump" if plan else ""), len(inputs)) as task:
                for index, step, step_infos in stream:
                    # Input workers prepare the next steps meanwhile (qconsist.inputs.stream). The dump session
                    # runs while the recorder fingerprints the previous step; the production session runs
                    # alone, so its time per sample is not disturbed by the dump.
                    count = _rows(step)
                    infos += step_infos
                    if device is not None:
                        start = time.perf_counter()
                        records, host = device.run(step, count, host_columns if host_columns is not None else range(len(names)))
                        seconds["dump"] += time.perf_counter() - start
                    elif recorder is not None:
                        start = time.perf_counter()
                        arrays = plan.to_original(plan.session.run(names, step))  # type: ignore[union-attr]
                        recorder.wait()
                        seconds["dump"] += time.perf_counter() - start
                    start = time.perf_counter()
                    produced = production.run(None, step)
                    seconds["production"] += time.perf_counter() - start
                    for row in range(count):
                        outputs = [o[row:row + 1] if count > 1 and o.ndim and o.shape[0] == count else o for o in produced]
                        outputs_table.write_row(index + row, outputs)
                        save_npz(run.file(f"outputs/{index + row:06d}.npz"), {f"o{i}": a for i, a in enumerate(outputs)})
                    if device is not None:
                        start = time.perf_counter()
                        recorder.record_device(index, produced, host, records)  # type: ignore[union-attr]
                        seconds["dump"] += time.perf_counter() - start
                    elif recorder is not None:
                        start = time.perf_counter()
                        recorder.submit(index, produced, arrays, plan.rows(arrays, count))  # type: ignore[union-attr]
                        seconds["dump"] += time.perf_counter() - start
                    task.advance(count)
                if recorder is not None:
                    start = time.perf_counter()
                    recorder.wait()
                    seconds["dump"] += time.perf_counter() - start
        finally:
            if recorder is not None:
                recorder.close()
        outputs_table.close()
        recorded_inputs = record_inputs(inputs, infos, run.file(SAMPLES_FILE), SAMPLES_FILE)
        if reference is not None and not _same_inputs(reference.digest, recorded_inputs["digest"], inputs):
            raise InputError(f"`reference` {reference.run_dir} ran on other inputs (digest differs); `raw` auto needs the same input set")
        samples = len(inputs)
        sections: dict[str, Any] = {
            "inference": {
                "options": options.to_json(),
                "providers": production.get_providers(),
                "samples": samples,
                "batch_size": batch,
                "ms_per_sample": 1000 * seconds["production"] / samples,
                "outputs": output_names,
                "fingerprints": "outputs/fingerprints.npy",
                "arrays": "outputs/<sample>.npz",
            }
        }
        dump = None
        if plan is not None:
            check, dump_table = recorder.check, recorder.table  # type: ignore[union-attr]
            dump_table.close()
            dump = DumpSummary(
                faithful=check.faithful, samples_checked=check.samples, mismatched_samples=list(check.mismatched),
                max_abs_diff=check.max_abs_diff, tensors=len(plan.tensors), ms_per_sample=1000 * seconds["dump"] / samples,
                structure=plan.structure, original_structure=plan.original_structure,
                level=options.graph_optimization_level.value,
                raw={**request.raw.to_json(), "reference": str(request.reference) if request.reference else None,
                     "tensors_saved": recorder.raw_saved, "dir": "dump/raw"},  # type: ignore[union-attr]
                fingerprints_in_worker_thread=dump_module.OVERLAP and device is None,
                fingerprints_on="device" if device is not None else "host",
                seconds_per_sample={k: v / samples for k, v in device.seconds.items()} if device is not None else {},
            )
            index = {
                "schema": "qconsist.dump/1",
                "hash_function": HASH_NAME,
                "axis_order": "original",  # relaid tensors (a "layout" permutation) are recorded in the original's order
                "repair": plan.repair,  # what was changed in ORT's saved graph so that it reloads ("" nothing)
                "tensors": [{**t.to_json(), "dtype": d} for t, d in zip(plan.tensors, plan.dtypes)],
                "shapes": dump_table.shapes.to_json(),
                "outputs": plan.outputs,
                "mismatched_samples": check.mismatched,
            }
            if not check.faithful:
                dump.production_distinct = _production_distinct(production, inputs, batch, check.mismatched[0])
            write_json_atomic(run.file("dump/index.json"), index)
            sections["dump"] = dump.to_json()
            if not check.faithful:
                log.warning(
                    "dump is NOT faithful: final outputs of %d/%d samples differ from production (max %.3g)",
                    len(check.mismatched), samples, check.max_abs_diff,
                )
        sections["inference"]["output_shapes"] = outputs_table.shapes.to_json()
        if request.engines:
            run.mark_progress("engines")
            sections["engines"] = _engines(model_path, options, inputs.step(0, batch), request, plan,
                                           run.file("engines/optimized.onnx")).to_json()
        manifest = Manifest(
            kind=KIND,
            command=list(command),
            model=model_record,
            inputs=recorded_inputs,
            stages=stages,
            calibration=source.manifest.calibration if source.manifest is not None else {},
            environment=environment_fingerprint(),
            sections=sections,
        )
        if ort_log.refresh():
            manifest.sections["onnxruntime_log"] = ort_log.to_json()
        path = run.finish(manifest)
    return InferenceResult(path, run.run_id, samples, sections["inference"]["ms_per_sample"], output_names, dump,
                           ort_log if ort_log.lines else None)


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
