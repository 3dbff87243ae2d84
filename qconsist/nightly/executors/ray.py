"""``ray``: the night's tasks as Ray tasks, on a local Ray started in this process or an existing cluster.

Each task (one entry, or one GPU type of an entry) declares what it needs: ``cpus`` and ``memory_gb`` from the
nightly file, one GPU where it runs ``locate`` on a cluster with GPUs, and for ``gpus = ["H100", ...]`` one
GPU of that type (Ray's ``accelerator_type``: the ``accelerator_type:H100`` resource Ray gives every node
with such a GPU). A task nobody can run (no node of that GPU type) is an ``error`` entry at once.

Tasks are submitted in the order the night gives them (longest first by their last recorded durations:
``qconsist.nightly.order``); Ray starts the queued tasks of one resource shape first in, first out as resources free up.

Tasks write their run directories under the nightly's ``runs_dir``, which must be one path every node can
reach (a shared file system); they return only the small ``EntryOutcome`` (verdict, run paths, hashes), and
the head process alone writes the history. While they run, the head process reads each running entry's
``RUNNING.json`` (its step) for one progress line per running entry.

A task whose worker is lost (killed, out of memory, node gone) is run again, at most ``max_retries`` times,
as a new attempt with a new entry run directory; the lost attempt's directories stay as a killed local
run's do (``RUNNING.json``, no manifest: incomplete to every reader) and the outcome lists each lost
attempt with the step it reached and Ray's reason. Retries are the executor's, not Ray's own
(``max_retries=0`` on the task), so that the night can say why. Ctrl-C cancels every outstanding task
(their workers are killed, their run directories left incomplete) and lets ``KeyboardInterrupt`` through.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from dataclasses import replace
from typing import Any, Callable, Sequence

from qconsist.errors import UnavailableError
from qconsist.nightly.entry import ENTRY_STEPS, Attempt, EntryOutcome, EntryTask, guarded_entry
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.rundir import RUNNING_NAME, new_run_id, run_state

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
CONNECT_SECONDS = 5.0
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # outcomes are small: a local Ray needs no large object store


# Ray sets these in its workers; the entry runs with the head process's values instead, except the device
# Ray assigned to the task.
RAY_ASSIGNED = ("CUDA_VISIBLE_DEVICES",)


def worker_environment(task: EntryTask) -> dict[str, str]:
    """The numerics environment variables the head process has set (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
    ``OPENBLAS_CORETYPE``…), except the GPU Ray assigns: given to the task's worker process when Ray starts it
    (``runtime_env``), so that its libraries read them when they are imported, before any task runs."""
    return {name: value for name, value in task.numerics_env if value is not None and name not in RAY_ASSIGNED}


def entry_task(task: EntryTask) -> EntryOutcome:
    """What a Ray worker runs: one entry, its errors recorded in the outcome. It runs as the head process
    would: with its command line in the manifests (not the worker's) and its numerics environment variables,
    except the GPU Ray assigned. Those the head has set reached the worker process at its start
    (``worker_environment``); one the head has not set but Ray sets in workers (``OMP_NUM_THREADS``) is removed
    here, so the manifests record the head's environment. A worker runs one task at a time, so both are
    restored afterwards. (What the entry records does not depend on these either: ``qconsist.threads``.)"""
    argv, saved = sys.argv, {name: os.environ.get(name) for name, _ in task.numerics_env}
    sys.argv = list(task.command) or argv
    _set_environment({name: value for name, value in task.numerics_env if name not in RAY_ASSIGNED})
    try:
        return guarded_entry(task)
    finally:
        sys.argv = argv
        _set_environment(saved)


def _set_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class RayExecutor:
    name = "ray"
    concurrent = True  # tasks run at once: they are handed out longest first (qconsist.nightly.order)

    def __init__(self, options) -> None:  # ExecutorOptions
        self.options = options
        self.ray: Any = None
        self.owned = False

    def __enter__(self) -> "RayExecutor":
        self.ray, self.owned = self._connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.owned:
            self.ray.shutdown()
        self.ray, self.owned = None, False

    # -- connecting ----------------------------------------------------------------------------------------
    def _connect(self) -> tuple[Any, bool]:
        """The ``ray`` module, connected; and whether this call started the connection (then it ends it)."""
        try:
            import ray
        except ImportError:
            raise UnavailableError("`executor` ray needs Ray: pip install 'qconsist[ray]'") from None
        if ray.is_initialized():
            return ray, False
        common = {"include_dashboard": False, "configure_logging": False, "log_to_driver": False}
        address = self.options.address
        if address:
            _check_reachable(address)
        try:
            if address:
                ray.init(address=address, **common)
            else:
                ray.init(num_cpus=self.options.num_cpus, num_gpus=self.options.num_gpus,
                         resources=dict(self.options.resources) or None, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **common)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise UnavailableError(f"cannot start or reach {where}: {_first_line(exc)}") from None
        return ray, True

    def run(self, tasks: Sequence[EntryTask], started: Callable[[EntryTask], None],
            done: Callable[[EntryTask, EntryOutcome], None], progress: Progress = NULL_PROGRESS) -> None:
        if self.ray is None:
            with self:
                return self.run(tasks, started, done, progress)
        _Night(self.ray, self.options.max_retries, started, done, progress).run(tasks)


def _check_reachable(address: str) -> None:
    """Fail at once, not after Ray's minutes of retries, when nothing listens at ``host:port``
    (``ray://host:port`` too; ``auto`` is Ray's to find)."""
    text = address.removeprefix("ray://")
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise UnavailableError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; start it with "
                               "`ray start --head` or check `address`") from None


def node_gpus(ray: Any) -> float:
    """The most GPUs one live node of the Ray cluster has (an entry with ``devices`` needs them on one node)."""
    try:
        return max((float(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")), default=0.0)
    except Exception:  # noqa: BLE001 - an older or remote Ray without the node table: the cluster's total instead
        return float(ray.cluster_resources().get("GPU", 0))


def needs(task: EntryTask, cluster: dict[str, float], largest_node: float | None = None) -> dict[str, Any] | str:
    """The Ray task options of ``task`` on a cluster with ``cluster`` resources (``largest_node``: the most GPUs
    of one node; default the cluster's), or why no node can run it."""
    entry = task.entry
    options: dict[str, Any] = {"num_cpus": entry.cpus, "max_retries": 0, "retry_exceptions": False}
    largest = cluster.get("GPU", 0) if largest_node is None else largest_node
    if entry.memory_gb is not None:
        options["memory"] = int(entry.memory_gb * 2**30)
    if task.gpu_type is not None:
        types = sorted(k.split(":", 1)[1] for k in cluster if k.startswith("accelerator_type:"))
        if cluster.get(f"accelerator_type:{task.gpu_type}", 0) <= 0:
            return (f"no node of the Ray cluster has a {task.gpu_type} GPU "
                    f"(GPU types there: {', '.join(types) or 'none'})")
        if cluster.get("GPU", 0) < 1:
            return f"needs a {task.gpu_type} GPU; the Ray cluster declares {task.gpu_type} nodes but no GPUs"
        options.update(num_gpus=1, accelerator_type=task.gpu_type)
    elif entry.locate and cluster.get("GPU", 0) > 0:
        options["num_gpus"] = 1  # locate runs where a GPU exists, as it does locally
    if entry.devices is not None:  # that many distinct GPUs of one node, at once: Ray gives each task its own
        wanted = int(largest) if entry.devices == "all" else int(entry.devices)
        if wanted < 1 or largest < wanted:
            asked = "every GPU of a node (devices = \"all\")" if entry.devices == "all" else f"{wanted} GPUs of one node (devices = {wanted})"
            return f"needs {asked}; the largest node of the Ray cluster has {largest:g}"
        options["num_gpus"] = wanted
    if entry.cpus > cluster.get("CPU", 0):
        return f"needs {entry.cpus:g} CPUs; the Ray cluster has {cluster.get('CPU', 0):g}"
    if "memory" in options and options["memory"] > cluster.get("memory", 0):
        return f"needs {entry.memory_gb:g} GB of memory; the Ray cluster has {cluster.get('memory', 0) / 2**30:.1f} GB for tasks"
    return options


class _Night:
    """One night on Ray: submit, wait, retry lost workers, show progress, cancel on Ctrl-C."""

    def __init__(self, ray: Any, max_retries: int, started: Callable, done: Callable, progress: Progress) -> None:
        self.ray, self.max_retries, self.started, self.done, self.progress = ray, max_retries, started, done, progress
        self.remote = ray.remote(entry_task)
        self.pending: dict[Any, tuple[EntryTask, EntryTask, dict[str, Any], list[Attempt]]] = {}
        self.lines: dict[str, tuple[Any, Any, int]] = {}  # entry run id -> (context, handle, steps shown)

    def submit(self, task: EntryTask, options: dict[str, Any], attempt: int, attempts: list[Attempt]) -> None:
        run = replace(task, entry_run_id=new_run_id(f"{task.key}-entry"), attempt=attempt,
                      device_assigned=options.get("num_gpus", 0) > 0)
        variables = worker_environment(task)
        environment = {"runtime_env": {"env_vars": variables}} if variables else {}
        ref = self.remote.options(**options, **environment, name=f"qconsist-{task.key}").remote(run)
        self.pending[ref] = (task, run, options, attempts)

    def run(self, tasks: Sequence[EntryTask]) -> None:
        cluster = self.ray.cluster_resources()
        largest = node_gpus(self.ray) if any(t.entry.devices is not None for t in tasks) else None
        with self.progress.task(f"nightly on Ray ({len(tasks)} entries)", len(tasks)) as overall:
            self.overall = overall
            for task in tasks:
                self.started(task)
                options = needs(task, cluster, largest)
                if isinstance(options, str):
                    self._finish(task, None, EntryOutcome(model=task.key, status="error", error=options, gpu_type=task.gpu_type))
                    continue
                self.submit(task, options, 1, [])
            try:
                while self.pending:
                    ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=POLL_SECONDS)
                    for ref in ready:
                        self._collect(ref)
                    self._show()
            except KeyboardInterrupt:
                for ref in self.pending:
                    self.ray.cancel(ref, force=True)
                raise
            finally:
                for context, _, _ in self.lines.values():
                    context.__exit__(None, None, None)
                self.lines.clear()

    def _collect(self, ref: Any) -> None:
        from ray.exceptions import RayError, RayTaskError

        task, run, options, attempts = self.pending.pop(ref)
        try:
            outcome = self.ray.get(ref)
        except RayTaskError as exc:  # raised inside the task past guarded_entry: a bug, not a lost worker
            outcome = EntryOutcome(model=task.key, status="error", gpu_type=task.gpu_type,
                                   error=f"internal error in the Ray task: {_first_line(exc.cause or exc)}")
        except RayError as exc:  # the worker or its node was lost (killed, out of memory, preempted)
            lost = Attempt(attempt=run.attempt, entry_run=str(run.entry_run), state=run_state(run.entry_run),
                           stage=_stage(run), reason=_first_line(exc))
            attempts.append(lost)
            self._close(run)
            if run.attempt <= self.max_retries:
                log.warning("model %s: %s; running it again (attempt %d of %d)", task.key, lost, run.attempt + 1, self.max_retries + 1)
                self.submit(task, options, run.attempt + 1, attempts)
                return
            outcome = EntryOutcome(model=task.key, status="error", gpu_type=task.gpu_type,
                                   error=f"its worker was lost {len(attempts)} time(s); last: {lost}")
        outcome.attempts = list(attempts)
        self._finish(task, run, outcome)

    def _finish(self, task: EntryTask, run: EntryTask | None, outcome: EntryOutcome) -> None:
        if run is not None:
            self._close(run)
        self.done(task, outcome)
        self.overall.advance()

    # -- progress: one line per running entry, its steps read from its RUNNING.json --------------------------
    def _show(self) -> None:
        for _, run, _, _ in self.pending.values():
            stage = _stage(run)
            if stage is None:
                continue
            if run.entry_run_id not in self.lines:
                context = self.progress.task(f"{run.key}" + (f" (attempt {run.attempt})" if run.attempt > 1 else ""), len(ENTRY_STEPS))
                self.lines[run.entry_run_id] = (context, context.__enter__(), 0)
            context, handle, shown = self.lines[run.entry_run_id]
            step = ENTRY_STEPS.index(stage) if stage in ENTRY_STEPS else shown
            if step > shown:
                handle.advance(step - shown)
                self.lines[run.entry_run_id] = (context, handle, step)

    def _close(self, run: EntryTask) -> None:
        line = self.lines.pop(run.entry_run_id, None)
        if line is not None:
            line[0].__exit__(None, None, None)


def _stage(run: EntryTask) -> str | None:
    """The step an entry run is at, from its RUNNING.json (``None``: not started, or finished)."""
    try:
        return json.loads((run.entry_run / RUNNING_NAME).read_text()).get("stage") or "start"
    except (OSError, ValueError, AttributeError):
        return None


EXECUTOR = RayExecutor
