"""One model's night as a pure task: ``run_entry(EntryTask) -> EntryOutcome``.

For each model, in order: the pipeline (a pipeline run), two inference runs of the quantized model with
fingerprint dumps on the evaluation inputs (the second checks that inference repeats bit for bit), the
locate step where a GPU exists (otherwise skipped with the reason recorded), for an entry with ``gpus`` or
``devices`` the quantized model's dumps on its GPU(s), twice on each in fresh sessions (``nightly.across`` compares
them across the GPUs and tells a node that depends on the GPU from one that varies run to run), the gate against the baseline
(the diff to the first diverging node happens inside the gate), and, where the entry asks for it
(``sensitivity = {target = ...}``) and the gate failed, the candidate fix: a sensitivity run of the night's
pipeline run, its verified list of nodes to keep in float recorded with the entry. The model's evidence is a run directory of
kind ``nightly-entry`` whose ``RUNNING.json`` names the step under way (``ENTRY_STEPS``) until it is complete.

A task reads no history and writes nothing but run directories: the head process (``qconsist.nightly.runner``)
decides the baseline candidates, and an executor (``qconsist.nightly.executors``) runs the task where it likes.
Baselines are like with like: among the candidates (the history key's good nights, newest first) the task
takes the newest whose GPU, driver and onnxruntime are its own, else the newest (the gate's environment
check then says what changed).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from datetime import datetime, timezone
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qconsist.environment import compare_environments, fingerprint
from qconsist.errors import QconsistError, RunStoreError, UnavailableError
from qconsist.gate import GateVerdict, Policy, evaluate_gate, load_policy
from qconsist.gate.evidence import ENTRY_KIND, ENTRY_SECTION, LABELS_FILE, Side, evaluation_inputs
from qconsist.locate.config import GpuConfig
from qconsist.locate.run import MAX_SAMPLES, LocateRequest, run_locate
from qconsist.inputs.options import InputOptions
from qconsist.history.summary import gpu_label
from qconsist.inference.model import resolve_model
from qconsist.inference.runner import RunRequest, run_inference
from qconsist.inference.session import MEASUREMENT, require_provider
from qconsist.nightly.config import ModelEntry, SensitivityWhen
from qconsist.nightly.devices import GpuDevice, visible_gpus
from qconsist.pipeline.runner import run_pipeline
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.report import render_entry_report
from qconsist.sensitivity import sensitivity
from qconsist.sensitivity.analysis import summary
from qconsist.store.atomic import write_atomic
from qconsist.store.manifest import Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import OrtLog, capture_ort_log
from qconsist.store.atomic import write_json_atomic
from qconsist.store.run import Run
from qconsist.store.rundir import RunDirectory
from qconsist.store.serde import dumps, serialized

log = logging.getLogger(__name__)

# The steps of an entry, as its RUNNING.json names them while it runs (executors show them as progress).
ENTRY_STEPS = ("pipeline", "inference:quantized", "inference:repeat", "locate", "inference:gpu", "gate", "sensitivity",
               "report")
# What makes two environments "like" for a baseline (names of ``qconsist.environment.NUMERICS``).
LIKE_WITH_LIKE = ("gpu", "driver", "onnxruntime")


@dataclass(frozen=True)
class EntryTask:
    """Everything one run of a model's night needs, decided by the head process: the entry, where runs go,
    the night, the baseline candidates (the key's good nights, newest first: ``(night_id, entry_run)``) and,
    where the executor decides it, the entry run's id and the attempt (a retry after a lost worker)."""

    entry: ModelEntry
    runs_dir: Path
    night_id: str
    baselines: tuple[tuple[str, str], ...] = ()
    key: str = ""  # the history key: the entry's name, or name@GPU-type
    gpu_type: str | None = None
    entry_run_id: str | None = None
    attempt: int = 1
    command: tuple[str, ...] = ()  # the head process's command line, recorded in the manifests (not a worker's)
    numerics_env: tuple[tuple[str, str | None], ...] = ()  # the head process's numerics environment variables
    device_assigned: bool = False  # a scheduler chose the GPU (CUDA_VISIBLE_DEVICES): its index may change nightly

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.entry.name)

    @property
    def entry_run(self) -> Path | None:
        return self.runs_dir / self.entry_run_id if self.entry_run_id else None


@dataclass(frozen=True)
class RunRecord:
    """A run directory a task made, for the history."""

    role: str  # entry, pipeline, quantized, repeat, locate
    run_id: str
    kind: str
    path: str


@serialized
@dataclass(frozen=True)
class Attempt:
    """An attempt of an entry lost with its worker (killed, out of memory, node gone): its entry run directory,
    left incomplete (``RUNNING.json``, no manifest) as a killed local run is, the step it reached and why."""

    attempt: int
    entry_run: str
    state: str  # run_state of the entry run: incomplete (started) or missing (lost before it started)
    stage: str | None
    reason: str

    def __str__(self) -> str:
        where = f" during {self.stage}" if self.stage else (" before it started" if self.state == "missing" else "")
        return f"attempt {self.attempt} lost{where}: {self.reason}"


@dataclass
class EntryOutcome:
    """One model's night: ``pass``, ``fail`` (the gate said no) or ``error`` (it could not be judged), with
    the runs it made and its stages' hashes (what the head process writes into the history)."""

    model: str  # the history key: name, or name@GPU-type
    status: str
    entry_run: str | None = None
    pipeline_run: str | None = None
    baseline: str | None = None
    baseline_night: str | None = None
    locate_skipped: str | None = None
    verdict: GateVerdict | None = None
    error: str | None = None
    # the task's own wall seconds, from its start to its outcome, measured where it ran (this process or its Ray
    # worker; ``guarded_entry``); 0.0: it never ran (no node could run it, its worker was lost). The history keeps
    # them, and the next night hands its tasks out longest first by them (``qconsist.nightly.order``)
    seconds: float = 0.0
    started: str | None = None  # when the task started, where it ran (UTC, to the millisecond); None: it never ran
    runs: list[RunRecord] = field(default_factory=list)
    hashes: list[dict[str, Any]] = field(default_factory=list)  # the pipeline's stage entries
    gpu_type: str | None = None  # the GPU type the entry asked for
    gpus: list[str] = field(default_factory=list)  # the GPUs it ran on (names), as its node reported them
    attempts: list[Attempt] = field(default_factory=list)  # earlier attempts lost with their worker
    figures: dict[str, float] = field(default_factory=dict)  # the night's own figures for the history (accuracy)
    sensitivity: dict[str, Any] | None = None  # the candidate fix (``sensitivity`` of the entry), or why there is none
    # the GPU(s) it ran on: the one its CUDA sessions use (device 0 of its process), or with ``devices`` every one it
    # was dumped on (run role ``gpu`` on the first, ``gpu:N`` on device N of its process); none without a GPU
    devices: list[GpuDevice] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "status": self.status, "entry_run": self.entry_run, "pipeline_run": self.pipeline_run,
            "baseline": self.baseline, "baseline_night": self.baseline_night, "locate_skipped": self.locate_skipped, "error": self.error,
            "seconds": round(self.seconds, 3), "started": self.started, "verdict": self.verdict.to_json() if self.verdict is not None else None,
            "runs": [r.__dict__ for r in self.runs], "gpu_type": self.gpu_type, "gpus": self.gpus, "gpu_label": self.gpu_label,
            "attempts": [a.to_json() for a in self.attempts], "figures": dict(self.figures), "sensitivity": self.sensitivity,
            "devices": [d.to_json() for d in self.devices],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EntryOutcome":
        values = {k: data.get(k) for k in ("model", "status", "entry_run", "pipeline_run", "baseline", "baseline_night", "locate_skipped", "error",
                                           "gpu_type")}
        verdict = GateVerdict.from_json(data["verdict"]) if data.get("verdict") else None
        return cls(**values, verdict=verdict, seconds=float(data.get("seconds") or 0.0), started=data.get("started"),
                   runs=[RunRecord(**r) for r in data.get("runs", [])], gpus=list(data.get("gpus") or []),
                   attempts=[Attempt(**a) for a in data.get("attempts") or []],
                   figures={str(k): float(v) for k, v in (data.get("figures") or {}).items()}, sensitivity=data.get("sensitivity"),
                   devices=[GpuDevice.from_json(d) for d in data.get("devices") or []])

    @property
    def gpu_label(self) -> str:
        """The GPU-type column of reports: the type asked for, else the GPUs the entry's node has, else none."""
        return gpu_label(self.gpu_type, self.gpus)


def _locate(entry: ModelEntry, pipeline_run: Path, runs_dir: Path, progress: Progress) -> tuple[Path | None, str | None]:
    """The locate run of the quantized model where a GPU exists; otherwise why it was skipped."""
    if not entry.locate:
        return None, "locate = false in the nightly file"

    try:
        require_provider("cuda")
    except UnavailableError as exc:
        return None, exc.message

    evaluation = entry.pipeline.evaluation or entry.pipeline.calibration.inputs
    request = LocateRequest(model=pipeline_run, inputs=InputOptions(evaluation.data, offset=evaluation.offset,
                                                                    count=min(evaluation.count or 8, MAX_SAMPLES)),
                            stage="quantize")
    _, path = run_locate(request, runs_dir, command=["qconsist", "nightly"], progress=progress)
    return path, None


def _gpu_dump(entry: ModelEntry, pipeline_run: Path, side: Side, runs_dir: Path, progress: Progress,
              device: int = 0) -> tuple[Path | None, str | None]:
    """The quantized model's dumps on the CUDA EP under the entry's pinned GPU config (else ORT's default), on
    ``device`` (the CUDA device id in this process); where CUDA is missing, why not."""
    try:
        require_provider("cuda")
    except UnavailableError as exc:
        return None, exc.message
    config = GpuConfig.parse(entry.gpu_config) if entry.gpu_config else GpuConfig()
    options = config.execution_options()
    if device:
        options = options.with_options(device_id=device)
    result = run_inference(resolve_model(pipeline_run, "quantize"), evaluation_inputs(side),
                           RunRequest(options=options, dump=True), runs_dir,
                           command=["qconsist", "nightly"], progress=progress)
    return result.run_dir, None


def _sensitivity(entry: ModelEntry, pipeline_run: Path, passed: bool, runs_dir: Path,
                 progress: Progress) -> tuple[dict[str, Any] | None, Path | None]:
    """The entry's candidate fix: ``qconsist sensitivity`` of the night's pipeline run (CPU), when the entry asks for
    it and the gate failed (or always); its summary, or why it could not be made, and its run directory. A
    sensitivity that fails does not change the entry's verdict: the failure is recorded with it."""
    wanted = entry.sensitivity
    if wanted is None or (wanted.when is SensitivityWhen.FAIL and passed):
        return None, None
    try:
        result, path = sensitivity(pipeline_run, wanted.request, labels=entry.labels, runs_dir=runs_dir,
                                   command=["qconsist", "nightly"], progress=progress)
    except QconsistError as exc:
        log.error("model %s: sensitivity: %s", entry.name, exc.message)
        return {"error": exc.message, "targets": [t.text for t in wanted.request.targets]}, None
    return {**summary(result), "run": path.name if path else None,
            "lines": result.proposal.pipeline_lines(result.existing_exclusions)
            if result.proposal is not None and result.passed else []}, path


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _inference(pipeline_run: Path, side: Side, runs_dir: Path, progress: Progress) -> Path:
    """The quantized model's dumps on the CPU with one intra-op thread: the night's hashes do not change with
    the core count of the machine (or Ray node) that ran them (``qconsist.threads``)."""
    source = resolve_model(pipeline_run, "quantize")
    result = run_inference(source, evaluation_inputs(side), RunRequest(options=MEASUREMENT, dump=True), runs_dir,
                           command=["qconsist", "nightly"], progress=progress)
    return result.run_dir


def choose_baseline(task: EntryTask, environment: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(entry_run, night_id)`` of the baseline: the newest candidate whose GPU, driver and onnxruntime are those
    of ``environment`` (like with like), else the newest (its environment differences are then the gate's to
    judge), else none."""
    for night, run in task.baselines:
        try:
            manifest = Run.open(run).manifest
        except RunStoreError:
            continue
        changes = compare_environments(manifest.environment, environment).numerics
        if not any(change.name in LIKE_WITH_LIKE for change in changes):
            return run, night
    if task.baselines:
        night, run = task.baselines[0]
        return run, night
    return None, None


def _entry_policy(task: EntryTask) -> Policy:
    policy = load_policy(task.entry.policy)
    if task.device_assigned:  # which GPU of its type a scheduler gave the entry is no change of environment
        allowed = tuple(sorted({*policy.environment.allow_changed, "CUDA_VISIBLE_DEVICES"}))
        policy = replace(policy, environment=replace(policy.environment, allow_changed=allowed))
    return policy


def _inference_runs(run: RunDirectory, side: Side, pipeline_run: Path, runs_dir: Path, runs: list[RunRecord],
                    progress: Progress) -> dict[str, str]:
    """The two inference runs of the quantized model (the second checks that the first repeats), by role."""
    inference_runs: dict[str, str] = {}
    for role in ("quantized", "repeat"):
        run.mark_progress(f"inference:{role}")  # ENTRY_STEPS
        path = _inference(pipeline_run, side, runs_dir, progress)
        runs.append(RunRecord(role, path.name, "inference", str(path)))
        inference_runs[role] = path.name
        side.inference[role] = path
    return inference_runs


def entry_devices(task: EntryTask, visible: list[GpuDevice]) -> list[GpuDevice]:
    """The GPUs the entry uses, of those its process sees: with ``devices``, that many (or all of them), else the
    one its CUDA sessions take (device 0), if any. Fewer than ``devices`` asks for: the entry cannot be judged."""
    wanted = task.entry.devices
    if wanted is None:
        return visible[:1]
    seen = f"{len(visible)}: {', '.join(g.short for g in visible)}" if visible else "none"
    if wanted == "all":
        if not visible:
            raise UnavailableError("asks for every GPU of its node (devices = \"all\"); its process sees none")
        return list(visible)
    if len(visible) < int(wanted):
        raise UnavailableError(f"asks for {wanted} distinct GPUs (devices = {wanted}); its process sees {seen}"
                               + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
                                  if os.environ.get("CUDA_VISIBLE_DEVICES") is not None else ""))
    return list(visible[:int(wanted)])


def gpu_role(index: int) -> str:
    """The run role of the CUDA-EP dumps on device ``index`` of the entry's process."""
    return "gpu" if index == 0 else f"gpu:{index}"


def repeat_role(role: str) -> str:
    """The run role of the second dump, in a fresh session, of the runs of ``role``: ``repeat`` for the CPU's
    ``quantized``, ``gpu-repeat`` for ``gpu``, ``gpu:1-repeat`` for ``gpu:1``."""
    return "repeat" if role == "quantized" else f"{role}-repeat"


SESSIONS = 2  # dumps on each GPU, each in a fresh session: the across-GPU comparison tells the GPU from run to run


def _device_runs(task: EntryTask, run: RunDirectory, side: Side, pipeline_run: Path, record: dict[str, Any],
                 runs: list[RunRecord], progress: Progress, devices: list[GpuDevice]) -> None:
    """The locate run and, for a GPU type, the dumps on it; each recorded, or why it was skipped."""
    run.mark_progress("locate")
    locate_run, skipped = _locate(task.entry, pipeline_run, task.runs_dir, progress)
    record["locate_run"] = locate_run.name if locate_run else None
    record["locate_skipped"] = skipped
    side.locate_path, side.locate_skipped = locate_run, skipped
    if locate_run:
        runs.append(RunRecord("locate", locate_run.name, "locate", str(locate_run)))
    if task.gpu_type is not None or task.entry.devices is not None:  # the dumps on the GPU(s), compared across them
        run.mark_progress("inference:gpu")
        targets = devices if task.entry.devices is not None else devices[:1]
        # each GPU twice, in fresh sessions (all GPUs once, then again): the comparison across them (``across``)
        # tells a node that depends on the GPU from one that varies from run to run on one
        for session in range(1, SESSIONS + 1):
            for device in targets or [None]:
                index = device.index if device is not None else 0
                role = gpu_role(index) if session == 1 else repeat_role(gpu_role(index))
                gpu_run, skipped = _gpu_dump(task.entry, pipeline_run, side, task.runs_dir, progress, index)
                if index == 0 and session == 1:
                    record["gpu_run"], record["gpu_skipped"] = (gpu_run.name if gpu_run else None), skipped
                record.setdefault("gpu_runs", []).append({"role": role, "run": gpu_run.name if gpu_run else None,
                                                          "device": device.to_json() if device else None, "session": session})
                if gpu_run:
                    runs.append(RunRecord(role, gpu_run.name, "inference", str(gpu_run)))
                if skipped:
                    return


def _write_verdict(run: RunDirectory, verdict: GateVerdict) -> None:
    write_text(run.file("verdict.json"), dumps(verdict))
    write_text(run.file("verdict.md"), verdict.to_markdown())
    write_text(run.file("junit.xml"), verdict.to_junit())


def _entry_manifest(entry: ModelEntry, pipeline: Manifest, environment: dict[str, Any], record: dict[str, Any],
                    verdict: GateVerdict, policy: Policy, ort_log: OrtLog) -> Manifest:
    manifest = Manifest(
        kind=ENTRY_KIND, command=list(sys.argv), model={"name": entry.name, **pipeline.model},
        inputs=pipeline.inputs, stages=pipeline.stages, environment=environment,
        sections={ENTRY_SECTION: record, "gate": verdict.to_json(), "policy": policy.to_json()},
    )
    if ort_log.refresh():
        manifest.sections["onnxruntime_log"] = ort_log.to_json()
    return manifest


def run_entry(task: EntryTask, progress: Progress = NULL_PROGRESS) -> EntryOutcome:
    """One model's night, a pure task: no history, no state outside the run directories it writes.
    Errors propagate; ``guarded_entry`` turns them into an ``error`` outcome."""

    entry, runs_dir, night_id = task.entry, task.runs_dir, task.night_id
    policy = _entry_policy(task)
    devices = entry_devices(task, visible_gpus())
    environment = fingerprint()
    baseline_run, baseline_night = choose_baseline(task, environment)
    runs: list[RunRecord] = []
    with RunDirectory.create(runs_dir, f"{task.key}-entry", ENTRY_KIND, run_id=task.entry_run_id) as run, \
            capture_ort_log(run.file(ORT_LOG), str(run.path / ORT_LOG)) as ort_log:  # the gate's and locate's sessions
        record: dict[str, Any] = {
            "model": task.key, "night_id": night_id, "pinned_gpu": entry.gpu_config, "labels": None,
            "baseline": baseline_run, "baseline_night": baseline_night, "gpu_type": task.gpu_type,
            "devices": [d.to_json() for d in devices],  # the GPU(s) it used: index here and on the host, UUID, name
        }
        if entry.labels:  # kept in a file of the entry (its manifest refers to it), not copied into the manifest
            write_json_atomic(run.file(LABELS_FILE), entry.labels)
            record["labels"] = LABELS_FILE
        runs.append(RunRecord("entry", run.run_id, ENTRY_KIND, str(run.path)))
        run.mark_progress(ENTRY_STEPS[0])
        result = run_pipeline(entry.pipeline, runs_dir, progress=progress)
        pipeline = Run.open(result.path)
        runs.append(RunRecord("pipeline", result.run_id, "pipeline", str(result.path)))
        record["pipeline_run"] = result.run_id
        side = Side(run=Run(run.path, Manifest(kind=ENTRY_KIND, sections={ENTRY_SECTION: record})),
                    pipeline=pipeline, pinned_gpu=entry.gpu_config, labels=entry.labels)
        record["inference_runs"] = _inference_runs(run, side, result.path, runs_dir, runs, progress)
        _device_runs(task, run, side, result.path, record, runs, progress, devices)
        run.mark_progress("gate")
        verdict = evaluate_gate(side, Path(baseline_run) if baseline_run else None, policy, progress=progress)
        _write_verdict(run, verdict)
        run.mark_progress("sensitivity")
        found, sensitivity_run = _sensitivity(entry, result.path, verdict.passed, runs_dir, progress)
        if found is not None:
            record["sensitivity"] = found
            if sensitivity_run is not None:
                runs.append(RunRecord("sensitivity", sensitivity_run.name, "sensitivity", str(sensitivity_run)))
        manifest = _entry_manifest(entry, pipeline.manifest, environment, record, verdict, policy, ort_log)
        run.mark_progress("report")

        write_text(run.file("report.html"), render_entry_report(Run(run.path, manifest), side))
        run.finish(manifest)
    quantized = Run.open(side.inference["quantized"]).inference.accuracy
    return EntryOutcome(
        model=task.key, status="pass" if verdict.passed else "fail", entry_run=str(run.path),
        pipeline_run=str(result.path), baseline=baseline_run, baseline_night=baseline_night,
        locate_skipped=side.locate_skipped, verdict=verdict, runs=runs, hashes=list(pipeline.manifest.stages),
        gpu_type=task.gpu_type, gpus=[str(g.get("name")) for g in environment.get("gpus") or []],
        figures=quantized.figures() if quantized is not None else {}, sensitivity=record.get("sensitivity"),
        devices=devices,
    )


def guarded_entry(task: EntryTask, progress: Progress = NULL_PROGRESS) -> EntryOutcome:
    """``run_entry``, its errors recorded in the outcome: one model's failure must not stop the others. The outcome
    carries the task's own wall seconds and start time, measured here, where the task runs."""
    started = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    start = time.perf_counter()
    try:
        outcome = run_entry(task, progress)
    except QconsistError as exc:
        log.error("model %s: %s", task.key, exc.message)
        outcome = EntryOutcome(model=task.key, status="error", error=exc.message, gpu_type=task.gpu_type)
    except Exception as exc:  # noqa: BLE001 - a bug in one model's work must not stop the others; it is recorded
        log.error("model %s: internal error\n%s", task.key, traceback.format_exc())
        outcome = EntryOutcome(model=task.key, status="error", error=f"internal error: {type(exc).__name__}: {exc}",
                               gpu_type=task.gpu_type)
    outcome.seconds, outcome.started = time.perf_counter() - start, started
    return outcome
