"""``run_nightly``: every model of a nightly file through pipeline, inference dumps, locate, diff and gate.

For each model, in order: the pipeline (a pipeline run), two inference runs of the quantized model with
fingerprint dumps on the evaluation inputs (the second checks that inference repeats bit for bit), the
locate step where a GPU exists (otherwise skipped with the reason recorded), the gate against the last
night whose gate passed (the diff to the first diverging node happens inside the gate). Each model's
evidence is a run directory of kind ``nightly-entry``; the night itself is a run directory of kind
``nightly`` holding the summary and ``report.html``. One model's error is recorded and the others go on.

The executor seam: a model's night is a pure task, ``run_entry(EntryTask) -> EntryOutcome`` (configuration
and baseline in; the runs it made, their hashes and the verdict out), which an executor runs where it
likes — ``LocalExecutor`` in this process, one after another. Only this, the head process, reads and writes
the history database: it looks up each model's baseline before the tasks run and records each outcome as
it arrives.

Reliability: every run directory is written as ``qconsist.store.rundir`` describes (``RUNNING.json`` until
``manifest.json`` is written last), and the history records each model in its own transactions, so a
night killed mid-way leaves earlier runs and the history intact, its own runs incomplete, and its history
row ``running`` until the next nightly marks it ``incomplete``. A rerun starts a new night; it never
reuses the interrupted night's runs.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from qconsist.store.serde import dumps
from qconsist.environment import fingerprint
from qconsist.errors import ConfigError, QconsistError, UnavailableError
from qconsist.gate import GateVerdict, evaluate_gate, load_policy
from qconsist.gate.evidence import ENTRY_KIND, ENTRY_SECTION, Side, evaluation_inputs
from qconsist.history import History
from qconsist.nightly.config import ModelEntry, NightlyConfig
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.atomic import write_atomic
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RunDirectory, open_run
from qconsist.inference.session import require_provider
from qconsist.gpu.run import LocateRequest, run_locate
from qconsist.inference.model import resolve_model
from qconsist.inference.runner import RunRequest, run_inference
from qconsist.pipeline.runner import run_pipeline
from qconsist.report import render_entry_report
from qconsist.report import render_nightly_report

log = logging.getLogger(__name__)

NIGHT_KIND = "nightly"
RESULT_SCHEMA = "qconsist.nightly/1"


@dataclass(frozen=True)
class EntryTask:
    """Everything one model's night needs, decided by the head process: the entry, where runs go, the night
    and the baseline (the model's last night whose gate passed)."""

    entry: ModelEntry
    runs_dir: Path
    night_id: str
    baseline_run: str | None = None
    baseline_night: str | None = None


@dataclass(frozen=True)
class RunRecord:
    """A run directory a task made, for the history."""

    role: str  # entry, pipeline, quantized, repeat, locate
    run_id: str
    kind: str
    path: str


@dataclass
class EntryOutcome:
    """One model's night: ``pass``, ``fail`` (the gate said no) or ``error`` (it could not be judged), with
    the runs it made and its stages' hashes (what the head process writes into the history)."""

    model: str
    status: str
    entry_run: str | None = None
    pipeline_run: str | None = None
    baseline: str | None = None
    baseline_night: str | None = None
    locate_skipped: str | None = None
    verdict: GateVerdict | None = None
    error: str | None = None
    seconds: float = 0.0
    runs: list[RunRecord] = field(default_factory=list)
    hashes: list[dict[str, Any]] = field(default_factory=list)  # the pipeline's stage entries

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "status": self.status, "entry_run": self.entry_run, "pipeline_run": self.pipeline_run,
            "baseline": self.baseline, "baseline_night": self.baseline_night, "locate_skipped": self.locate_skipped, "error": self.error,
            "seconds": round(self.seconds, 3), "verdict": self.verdict.to_json() if self.verdict is not None else None,
            "runs": [r.__dict__ for r in self.runs],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EntryOutcome":
        values = {k: data.get(k) for k in ("model", "status", "entry_run", "pipeline_run", "baseline", "baseline_night", "locate_skipped", "error")}
        verdict = GateVerdict.from_json(data["verdict"]) if data.get("verdict") else None
        return cls(**values, verdict=verdict, seconds=float(data.get("seconds", 0.0)),
                   runs=[RunRecord(**r) for r in data.get("runs", [])])


@dataclass
class NightlyResult:
    night_id: str
    path: Path
    config: str
    entries: list[EntryOutcome] = field(default_factory=list)
    history: str = ""

    @property
    def passed(self) -> bool:
        return all(e.status == "pass" for e in self.entries)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def exit_code(self) -> int:
        """0 every gate passed, 1 a gate failed, 2 a model could not be judged."""
        if any(e.status == "error" for e in self.entries):
            return 2
        return 0 if self.passed else 1

    def summary(self) -> dict[str, int]:
        return {s: sum(1 for e in self.entries if e.status == s) for s in ("pass", "fail", "error")}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA, "night_id": self.night_id, "path": str(self.path), "config": self.config,
            "history": self.history, "passed": self.passed, "summary": self.summary(),
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "NightlyResult":
        if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
            raise ConfigError(f"not a nightly result of schema {RESULT_SCHEMA!r}")
        return cls(night_id=data["night_id"], path=Path(data["path"]), config=data["config"], history=data.get("history", ""),
                   entries=[EntryOutcome.from_json(e) for e in data["entries"]])


def _locate(entry: ModelEntry, pipeline_run: Path, runs_dir: Path, progress: Progress) -> tuple[Path | None, str | None]:
    """The locate run of the quantized model where a GPU exists; otherwise why it was skipped."""
    if not entry.locate:
        return None, "locate = false in the nightly file"

    try:
        require_provider("cuda")
    except UnavailableError as exc:
        return None, exc.message

    evaluation = entry.pipeline.evaluation or entry.pipeline.calibration.inputs
    request = LocateRequest(model=pipeline_run, inputs=evaluation.data, stage="quantize", offset=evaluation.offset,
                            count=min(evaluation.count or 8, 256))
    _, path = run_locate(request, runs_dir, command=["qconsist", "nightly"], progress=progress)
    return path, None


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _inference(pipeline_run: Path, side: Side, runs_dir: Path, progress: Progress) -> Path:

    source = resolve_model(pipeline_run, "quantize")
    result = run_inference(source, evaluation_inputs(side), RunRequest(dump=True), runs_dir,
                           command=["qconsist", "nightly"], progress=progress)
    return result.run_dir


def run_entry(task: EntryTask, progress: Progress = NULL_PROGRESS) -> EntryOutcome:
    """One model's night, a pure task: no history, no state outside the run directories it writes.
    Errors propagate; ``guarded_entry`` turns them into an ``error`` outcome."""

    entry, runs_dir, night_id = task.entry, task.runs_dir, task.night_id
    policy = load_policy(entry.policy)
    runs: list[RunRecord] = []
    with RunDirectory.create(runs_dir, f"{entry.name}-entry", ENTRY_KIND) as run:
        record: dict[str, Any] = {
            "model": entry.name, "night_id": night_id, "pinned_gpu": entry.gpu_config, "labels": entry.labels,
            "baseline": task.baseline_run, "baseline_night": task.baseline_night,
        }
        runs.append(RunRecord("entry", run.run_id, ENTRY_KIND, str(run.path)))
        run.mark_progress("pipeline")
        result = run_pipeline(entry.pipeline, runs_dir, progress=progress)
        pipeline_manifest = open_run(result.path)
        runs.append(RunRecord("pipeline", result.run_id, "pipeline", str(result.path)))
        record["pipeline_run"] = result.run_id
        side = Side(path=run.path, manifest=Manifest(kind=ENTRY_KIND, sections={ENTRY_SECTION: record}),
                    pipeline_path=result.path, pipeline=pipeline_manifest, pinned_gpu=entry.gpu_config, labels=entry.labels)
        inference_runs: dict[str, str] = {}
        for role in ("quantized", "repeat"):
            run.mark_progress(f"inference:{role}")
            path = _inference(result.path, side, runs_dir, progress)
            runs.append(RunRecord(role, path.name, "inference", str(path)))
            inference_runs[role] = path.name
            side.inference[role] = path
        record["inference_runs"] = inference_runs
        run.mark_progress("locate")
        locate_run, skipped = _locate(entry, result.path, runs_dir, progress)
        record["locate_run"] = locate_run.name if locate_run else None
        record["locate_skipped"] = skipped
        side.locate_path, side.locate_skipped = locate_run, skipped
        if locate_run:
            runs.append(RunRecord("locate", locate_run.name, "locate", str(locate_run)))
        run.mark_progress("gate")
        verdict = evaluate_gate(side, Path(task.baseline_run) if task.baseline_run else None, policy, progress=progress)
        _write_text(run.file("verdict.json"), dumps(verdict))
        _write_text(run.file("verdict.md"), verdict.to_markdown())
        _write_text(run.file("junit.xml"), verdict.to_junit())
        manifest = Manifest(
            kind=ENTRY_KIND, command=list(sys.argv), model={"name": entry.name, **pipeline_manifest.model},
            inputs=pipeline_manifest.inputs, stages=pipeline_manifest.stages, environment=fingerprint(),
            sections={ENTRY_SECTION: record, "gate": verdict.to_json(), "policy": policy.to_json()},
        )
        run.mark_progress("report")

        _write_text(run.file("report.html"), render_entry_report(run.path, manifest, side))
        run.finish(manifest)
    return EntryOutcome(
        model=entry.name, status="pass" if verdict.passed else "fail", entry_run=str(run.path),
        pipeline_run=str(result.path), baseline=task.baseline_run, baseline_night=task.baseline_night,
        locate_skipped=skipped, verdict=verdict, runs=runs, hashes=list(pipeline_manifest.stages),
    )


def guarded_entry(task: EntryTask, progress: Progress = NULL_PROGRESS) -> EntryOutcome:
    """``run_entry``, its errors recorded in the outcome: one model's failure must not stop the others."""
    start = time.perf_counter()
    try:
        outcome = run_entry(task, progress)
    except QconsistError as exc:
        log.error("model %s: %s", task.entry.name, exc.message)
        outcome = EntryOutcome(model=task.entry.name, status="error", error=exc.message)
    except Exception as exc:  # noqa: BLE001 - a bug in one model's work must not stop the others; it is recorded
        log.error("model %s: internal error\n%s", task.entry.name, traceback.format_exc())
        outcome = EntryOutcome(model=task.entry.name, status="error", error=f"internal error: {type(exc).__name__}: {exc}")
    outcome.seconds = time.perf_counter() - start
    return outcome


class Executor(Protocol):
    """Runs the night's tasks; tells the head process (``started``, ``done``, both called in it) when a task
    starts and hands over each outcome as it arrives."""

    def run(self, tasks: Sequence[EntryTask], started: Callable[[EntryTask], None],
            done: Callable[[EntryTask, EntryOutcome], None], progress: Progress) -> None: ...


class LocalExecutor:
    """The tasks one after another, in this process: nothing else to install."""

    name = "local"

    def run(self, tasks: Sequence[EntryTask], started: Callable[[EntryTask], None],
            done: Callable[[EntryTask, EntryOutcome], None], progress: Progress = NULL_PROGRESS) -> None:
        with progress.task("nightly", len(tasks)) as handle:
            for task in tasks:
                started(task)
                done(task, guarded_entry(task, progress))
                handle.advance()


def _record(history: History, night_id: str, task: EntryTask, outcome: EntryOutcome) -> None:
    """The head process writes what a task did into the history, in order."""
    for run in outcome.runs:
        history.record_run(night_id, task.entry.name, run.role, run.run_id, run.kind, Path(run.path))
    if outcome.hashes:
        history.record_hashes(night_id, task.entry.name, outcome.hashes)
    history.finish_entry(night_id, task.entry.name, outcome.entry_run, outcome.verdict, outcome.baseline_night, outcome.error)


def run_nightly(config: NightlyConfig, progress: Progress = NULL_PROGRESS, only: Sequence[str] = (),
                executor: Executor | None = None) -> NightlyResult:
    """Run every model of ``config`` (or those named in ``only``); one model's failure does not stop the others."""
    models = [m for m in config.models if not only or m.name in only]
    missing = sorted(set(only) - {m.name for m in config.models})
    if missing:
        raise ConfigError(f"{config.path} lists no model '{missing[0]}'; models: {', '.join(m.name for m in config.models)}")
    executor = executor or LocalExecutor()
    history = History(config.history)
    abandoned = history.mark_abandoned()
    if abandoned:
        log.warning("marked interrupted night(s) incomplete: %s", ", ".join(abandoned))
    with RunDirectory.create(config.runs_dir, "nightly", NIGHT_KIND) as night:
        history.start_night(night.run_id, str(config.path), fingerprint())
        result = NightlyResult(night_id=night.run_id, path=night.path, config=str(config.path), history=str(config.history))
        tasks = []
        for entry in models:
            baseline = history.last_good(entry.name, before=night.run_id)
            tasks.append(EntryTask(entry, config.runs_dir, night.run_id, baseline.entry_run if baseline else None,
                                   baseline.night_id if baseline else None))
        outcomes: dict[str, EntryOutcome] = {}

        def started(task: EntryTask) -> None:
            night.mark_progress(task.entry.name)
            history.start_entry(night.run_id, task.entry.name)

        def done(task: EntryTask, outcome: EntryOutcome) -> None:
            _record(history, night.run_id, task, outcome)
            outcomes[task.entry.name] = outcome

        executor.run(tasks, started, done, progress)
        result.entries = [outcomes[t.entry.name] for t in tasks if t.entry.name in outcomes]
        manifest = Manifest(kind=NIGHT_KIND, command=list(sys.argv), environment=fingerprint(),
                            sections={"nightly": result.to_json(), "config": config.to_json()})

        _write_text(night.file("summary.json"), dumps(result))
        _write_text(night.file("report.html"), render_nightly_report(result))
        night.finish(manifest)
        history.finish_night(night.run_id, result.summary())
    return result
