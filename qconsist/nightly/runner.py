"""``run_nightly``: every model of a nightly file through pipeline, inference dumps, locate, diff and gate.

Each model's night is a task (``qconsist.nightly.entry``: pipeline, inference dumps, locate, gate) whose
evidence is a run directory of kind ``nightly-entry``; the night itself is a run directory of kind
``nightly`` holding the summary and ``report.html``. One model's error is recorded and the others go on.

The executor seam: a model's night is a pure task, ``run_entry(EntryTask) -> EntryOutcome`` (configuration
and baseline candidates in; the runs it made, their hashes and the verdict out), which an executor
(``qconsist.nightly.executors``) runs where it likes — ``local``: in this process, one after another; ``ray``:
as Ray tasks on a local Ray or a cluster. Only this, the head process, reads and writes the history
database: it looks up each model's baseline candidates before the tasks run and records the outcomes in
the nightly file's order, whatever order they arrive in. An entry's history row holds the times it ran (the task's
own start, measured where it ran, and that start plus its seconds), not when the head handed it out or recorded it
(``History.finish_entry``; the hand-out time is ``handed_out``).

Hand-out order (``qconsist.nightly.order``): an executor that runs tasks at once (``concurrent``: ray) is given
them longest first, by each history key's last recorded duration (the task's own seconds; unknown ones first);
the local executor keeps the file's order. The night's result (``handout``) says which order and the durations it
used; outcomes, results and summaries stay in the file's order.

GPU types: an entry with ``gpus = ["H100", "H200"]`` is one task per GPU type, each with its own history key
(``name@H100``), so a baseline is always of the same GPU type; among a key's good nights the task takes the
newest whose driver and onnxruntime match its own (like with like), else the newest (the gate's environment
check then says what changed).

Reliability: every run directory is written as ``qconsist.store.rundir`` describes (``RUNNING.json`` until
``manifest.json`` is written last), and the history records each model in its own transactions, so a
night killed mid-way leaves earlier runs and the history intact, its own runs incomplete, and its history
row ``running`` until the next nightly marks it ``incomplete``. A night stopped with Ctrl-C records what
finished and marks itself ``incomplete`` at once. A rerun starts a new night; it never reuses the
interrupted night's runs. An entry whose Ray worker was lost is run again by the executor (a bounded
number of times); the lost attempt's run directory stays incomplete, and the outcome and the night's
summary (``retries``) say which entry needed retries and why.

Once a night is recorded, the history page (``qconsist.report.history``: every night of every model at a glance)
is written again beside the history database (``history.sqlite`` -> ``history.html``); the night's report links
to it. A page that cannot be written is logged; the night stands.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from qconsist.environment import NUMERIC_ENV_VARS, fingerprint
from qconsist.errors import ConfigError
from qconsist.gate.evidence import ENTRY_KIND
from qconsist.history import History
from qconsist.nightly.across import GpuComparison, compare_across_devices, compare_across_gpus
from qconsist.nightly.config import NightlyConfig
from qconsist.nightly.entry import EntryOutcome, EntryTask, write_text
from qconsist.nightly.executors import Executor, ExecutorOptions, make_executor
from qconsist.nightly.order import HandOut, Order, hand_out
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.report import render_nightly_report
from qconsist.report.history import history_page_path, nightly_history_page
from qconsist.store.manifest import Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import capture_ort_log
from qconsist.store.rundir import RunDirectory
from qconsist.store.serde import dumps, serialized

log = logging.getLogger(__name__)

NIGHT_KIND = "nightly"
RESULT_SCHEMA = "qconsist.nightly/1"


@serialized(
    schema=RESULT_SCHEMA, derived=("passed", "summary", "retries"), error=ConfigError,
    refused="not a nightly result of schema {schema!r}", malformed="nightly result is malformed: {exc}",
)
@dataclass
class NightlyResult:
    night_id: str
    path: Path
    config: str
    entries: list[EntryOutcome] = field(default_factory=list)
    history: str = ""
    executor: str = "local"
    across_gpus: list[GpuComparison] = field(default_factory=list)  # one model across GPU types (on request) and devices
    seconds: float = 0.0  # the night's wall time, from its first task handed out to its last outcome and comparison
    handout: HandOut | None = None  # the order the tasks were handed out in, and why (none in older summaries)

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

    def retries(self) -> dict[str, list[str]]:
        """The entries that needed retries, and why each earlier attempt was lost."""
        return {e.model: [str(a) for a in e.attempts] for e in self.entries if e.attempts}


def _record(history: History, night_id: str, task: EntryTask, outcome: EntryOutcome) -> None:
    """The head process writes what a task did into the history (lost attempts as runs ``attempt-N``)."""
    for attempt in outcome.attempts:
        history.record_run(night_id, task.key, f"attempt-{attempt.attempt}", Path(attempt.entry_run).name, ENTRY_KIND, attempt.entry_run)
    for run in outcome.runs:
        history.record_run(night_id, task.key, run.role, run.run_id, run.kind, Path(run.path))
    if outcome.hashes:
        history.record_hashes(night_id, task.key, outcome.hashes)
    ran = outcome.started is not None  # None: it never ran (no node could run it, its worker was lost)
    # the entry's own start and seconds, as the task measured them where it ran: its history row's started and finished
    history.finish_entry(night_id, task.key, outcome.entry_run, outcome.verdict, outcome.baseline_night, outcome.error,
                         gpu_type=outcome.gpu_type, gpus=outcome.gpus, seconds=outcome.seconds if ran else None,
                         started=outcome.started if ran else None)
    if outcome.figures:  # the quantized model's accuracy on the evaluation set, as its inference run recorded it
        history.record_figures(night_id, task.key, outcome.figures)


class _InOrder:
    """Outcomes recorded in the tasks' order, whatever order they arrive in."""

    def __init__(self, tasks: Sequence[EntryTask], record: Callable[[EntryTask, EntryOutcome], None]) -> None:
        self.tasks, self.record = list(tasks), record
        self.arrived: dict[str, EntryOutcome] = {}
        self.recorded: dict[str, EntryOutcome] = {}

    def add(self, task: EntryTask, outcome: EntryOutcome) -> None:
        self.arrived[task.key] = outcome
        for waiting in self.tasks[len(self.recorded):]:
            if waiting.key not in self.arrived:
                break
            self.record(waiting, self.arrived[waiting.key])
            self.recorded[waiting.key] = self.arrived[waiting.key]

    def flush(self) -> None:
        """Record what arrived out of order (an interrupted night: earlier tasks will never arrive)."""
        for task in self.tasks:
            if task.key in self.arrived and task.key not in self.recorded:
                self.record(task, self.arrived[task.key])
                self.recorded[task.key] = self.arrived[task.key]


def check_only(config: NightlyConfig, only: Sequence[str]) -> None:
    known = {m.name for m in config.models} | {key for m in config.models for key, _ in m.keys()}
    missing = sorted(set(only) - known)
    if missing:
        raise ConfigError(f"{config.path} lists no model '{missing[0]}'; models: {', '.join(m.name for m in config.models)}")


def night_tasks(config: NightlyConfig, history: History, night_id: str, only: Sequence[str] = ()) -> list[EntryTask]:
    """The night's tasks in file order: one per entry, or per GPU type of an entry with ``gpus``; ``only``
    names entries (every GPU type) or history keys (``name@H100``)."""
    check_only(config, only)
    tasks = []
    for entry in config.models:
        for key, gpu in entry.keys():
            if only and entry.name not in only and key not in only:
                continue
            baselines = tuple((good.night_id, good.entry_run) for good in history.good_runs(key, before=night_id))
            tasks.append(EntryTask(entry, config.runs_dir, night_id, baselines, key=key, gpu_type=gpu, command=tuple(sys.argv),
                                   numerics_env=tuple((name, os.environ.get(name)) for name in NUMERIC_ENV_VARS)))
    return tasks


def run_nightly(config: NightlyConfig, progress: Progress = NULL_PROGRESS, only: Sequence[str] = (),
                executor: ExecutorOptions | Executor | None = None, across_gpus: bool = False,
                order: Order | str | None = None) -> NightlyResult:
    """Run every model of ``config`` (or those named in ``only``) with ``executor`` (options or an executor;
    default: local); one model's failure does not stop the others. ``across_gpus``: also compare each model
    fanned out over GPU types across them (``qconsist.nightly.across``). ``order``: the hand-out order (default:
    longest first where the executor runs tasks at once, else the file's; ``qconsist.nightly.order``). Ctrl-C
    (``KeyboardInterrupt``) stops the executor, records what finished, marks the night incomplete, and is raised
    again."""
    runner = executor if isinstance(executor, Executor) else make_executor(executor)
    check_only(config, only)
    rule = _rule(runner, order)
    with runner:
        return _night(config, runner, progress, only, across_gpus, rule)


def _rule(runner: Executor, order: Order | str | None) -> tuple[Order, str]:
    """The hand-out order and why."""
    concurrent = bool(getattr(runner, "concurrent", False))
    if order is not None:
        try:
            return Order(order), "asked for"
        except ValueError:
            raise ConfigError(f"unknown hand-out `order` {order!r}; choose one of: "
                              f"{', '.join(o.value for o in Order)}") from None
    if concurrent:
        return Order.LONGEST_FIRST, ""
    return Order.FILE, f"the {runner.name} executor runs one entry after another: the order changes nothing of the wall time"


def _night(config: NightlyConfig, runner: Executor, progress: Progress, only: Sequence[str], across_gpus: bool,
           rule: tuple[Order, str]) -> NightlyResult:
    history = History(config.history)
    with RunDirectory.create(config.runs_dir, "nightly", NIGHT_KIND) as night, \
            capture_ort_log(night.file(ORT_LOG), str(night.path / ORT_LOG)) as ort_log:
        tasks = night_tasks(config, history, night.run_id, only)
        handed, handout = hand_out(tasks, history, night.run_id, *rule)
        log.info("%s", handout)
        abandoned = history.mark_abandoned()
        if abandoned:
            log.warning("marked interrupted night(s) incomplete: %s", ", ".join(abandoned))
        history.start_night(night.run_id, str(config.path), fingerprint())
        result = NightlyResult(night_id=night.run_id, path=night.path, config=str(config.path), history=str(config.history),
                               executor=runner.name, handout=handout)
        outcomes: dict[str, EntryOutcome] = {}

        def record(task: EntryTask, outcome: EntryOutcome) -> None:
            _record(history, night.run_id, task, outcome)
            outcomes[task.key] = outcome

        in_order = _InOrder(tasks, record)

        def started(task: EntryTask) -> None:
            night.mark_progress(task.key)
            history.start_entry(night.run_id, task.key)

        start = time.perf_counter()
        try:
            runner.run(handed, started, in_order.add, progress)
        except BaseException:  # Ctrl-C, or an executor's failure: what finished is recorded, the night is incomplete
            in_order.flush()
            history.interrupt_night(night.run_id)
            raise
        result.entries = [outcomes[t.key] for t in tasks if t.key in outcomes]
        if across_gpus:
            result.across_gpus = compare_across_gpus(result.entries)
        # an entry with `devices` asked for its comparison across them: made on every night
        result.across_gpus += compare_across_devices(result.entries, {t.key: t.entry.gpu_config for t in tasks})
        result.seconds = time.perf_counter() - start
        manifest = Manifest(kind=NIGHT_KIND, command=list(sys.argv), environment=fingerprint(),
                            sections={"nightly": result.to_json(), "config": config.to_json()})
        if ort_log.refresh():
            manifest.sections["onnxruntime_log"] = ort_log.to_json()

        write_text(night.file("summary.json"), dumps(result))
        page = os.path.relpath(history_page_path(config.history), night.path)  # written once the night is recorded
        write_text(night.file("report.html"), render_nightly_report(result, page))
        night.finish(manifest)
        history.finish_night(night.run_id, result.summary())
    nightly_history_page(config.history)
    return result
