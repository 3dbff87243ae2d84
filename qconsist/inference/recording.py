"""What ``qconsist run`` records of each step besides production's outputs: a strategy per kind of dump.

``run_inference`` runs every step the same way — ``recorder.before(step)``, production, ``recorder.after(...)`` —
and a ``StepRecorder`` says what else happens:

* ``NoDump``: nothing (a plain run);
* ``HostDump``: the exposed graph (``dump.DumpPlan``) runs on the step, writing its tensors into reused numpy
  buffers, which a worker thread fingerprints on the CPU while the run goes on, helped by the recording thread
  while it waits (``dump.DumpRecorder``);
* ``DeviceDump``: the exposed graph runs with every tensor bound to GPU memory and fingerprinted there
  (``device.DeviceDump``); only the records, the final outputs and the raw tensors asked for come back.

Both dumps store their records in one fingerprint table (``qconsist.store.fingerprints``), check the dumped
final outputs against production's bit for bit, and ``finish`` with the same ``DumpSummary`` and index.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from qconsist.inference import dump as dump_module
from qconsist.inference import kernels
from qconsist.inference.device import DeviceDump as GpuFingerprints
from qconsist.inference.dump import DumpPlan, DumpRecorder, RawMode
from qconsist.inference.host_binding import HostBinding
from qconsist.inference.kernels import HASH_NAME
from qconsist.errors import QconsistError, UnsupportedModelError
from qconsist.inference.session import ExecutionOptions, ort_message
from qconsist.store.atomic import write_json_atomic
from qconsist.store.fingerprints import FORMAT as TABLE_FORMAT
from qconsist.store.fingerprints import TableWriter
from qconsist.store.sections import DumpSummary

TABLE_DIR = "dump/table"


class StepRecorder(Protocol):
    """What a run records of a step besides production's final outputs."""

    description: str  # shown in the progress: "" or " + dump"

    def before(self, step: dict[str, np.ndarray], count: int) -> None:
        """Before production runs the step (a dump session runs it here)."""

    def after(self, index: int, produced: list[np.ndarray], count: int) -> None:
        """Once production gave its outputs for the step of ``count`` samples starting at ``index``."""

    def finish(self, samples: int, distinct: Callable[[int], int]) -> DumpSummary | None:
        """After the last step: what was recorded (``distinct(sample)``: production's distinct outputs in repeated
        runs of the step holding ``sample``, asked only when the dump was not faithful)."""

    def close(self) -> None:
        """Stop any worker; called after ``finish`` and after an error alike."""


class NoDump:
    description = ""

    def before(self, step: dict[str, np.ndarray], count: int) -> None:
        return None

    def after(self, index: int, produced: list[np.ndarray], count: int) -> None:
        return None

    def finish(self, samples: int, distinct: Callable[[int], int]) -> DumpSummary | None:
        return None

    def close(self) -> None:
        return None


class _Dump:
    """What both dumps share: the plan, the table, the recorder of rows and raw tensors, the time spent."""

    description = " + dump"
    on = "host"

    def __init__(self, plan: DumpPlan, options: ExecutionOptions, run_dir: Path, samples: int,
                 raw_columns: set[int], raw: dict[str, Any], differing: Callable[[int, np.ndarray], set[int]] | None) -> None:
        self.plan, self.options, self.run_dir, self.raw = plan, options, run_dir, raw
        self.names = [t.name for t in plan.tensors]
        self.table = TableWriter(run_dir / TABLE_DIR, samples, plan.dtypes)
        self.recorder = DumpRecorder(self.table, [self.names.index(n) for n in plan.outputs], raw_columns,
                                     lambda index: _raw_path(run_dir, index), differing)
        self.seconds = 0.0

    def _timed(self, work: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return work()
        finally:
            self.seconds += time.perf_counter() - start

    def finish(self, samples: int, distinct: Callable[[int], int]) -> DumpSummary:
        self._timed(self.recorder.wait)
        check = self.recorder.check
        table = self.table.close()
        summary = DumpSummary(
            faithful=check.faithful, samples_checked=check.samples, mismatched_samples=list(check.mismatched),
            max_abs_diff=check.max_abs_diff, tensors=len(self.plan.tensors), ms_per_sample=1000 * self.seconds / samples,
            structure=self.plan.structure, original_structure=self.plan.original_structure,
            level=self.options.graph_optimization_level.value, raw={**self.raw, "tensors_saved": self.recorder.raw_saved},
            fingerprints=TABLE_DIR, table_format=TABLE_FORMAT,
            bytes_per_tensor_per_sample=_bytes(self.run_dir / TABLE_DIR) / max(1, samples * len(self.names)),
            fingerprints_in_worker_thread=dump_module.OVERLAP and self.on == "host", fingerprints_on=self.on,
            seconds_per_sample=self._parts(samples), hash_function=HASH_NAME, beside_production=self.on == "device",
        )
        if not check.faithful:
            summary.production_distinct = distinct(check.mismatched[0])
        write_json_atomic(self.run_dir / "dump" / "index.json", self._index(table, check.mismatched))
        return summary

    def _parts(self, samples: int) -> dict[str, float]:
        return {}

    def _index(self, table: dict[str, Any], mismatched: list[int]) -> dict[str, Any]:
        return {
            "schema": "qconsist.dump/1",
            "hash_function": HASH_NAME,
            "axis_order": "original",  # relaid tensors (a "layout" permutation) are recorded in the original's order
            "nchwc_block": self.plan.block,  # the NCHWc block measured here (0: none); blocked tensors with "channels" are in NCHW
            "repair": self.plan.repair,  # what was changed in ORT's saved graph so that it reloads ("" nothing)
            "tensors": [{**t.to_json(), "dtype": d} for t, d in zip(self.plan.tensors, self.plan.dtypes)],
            "shapes": self.table.shapes.to_json(),
            "table": table,
            "outputs": self.plan.outputs,
            "mismatched_samples": mismatched,
            "splits": [split.to_json() for split in self.plan.splits],  # how each column divides among a step's samples
            "left_out": dict(self.plan.left_out),  # tensors not recorded, and why
        }

    def close(self) -> None:
        self.recorder.close()


class HostDump(_Dump):
    """Tensors written by ORT into reused host buffers (``host_binding.HostBinding``) and fingerprinted on the
    CPU a step behind the dump session (worker thread; this thread takes columns too while it waits). This thread
    only runs the sessions: the tensors go to the recorder as ORT holds them, and the threads that fingerprint a
    column first put it in its recorded form (NCHWc blocks in NCHW, relaid tensors in the original's order)."""

    _arrays: list[np.ndarray] = []  # the step's dumped tensors, from ``before`` to ``after``

    def __init__(self, plan: DumpPlan, options: ExecutionOptions, run_dir: Path, samples: int,
                 raw_columns: set[int], raw: dict[str, Any], differing: Callable[[int, np.ndarray], set[int]] | None) -> None:
        super().__init__(plan, options, run_dir, samples, raw_columns, raw, differing)
        self.binding = HostBinding(plan.session, self.names, plan.dtypes)
        # start-up: the kernels' first calls load numba (seconds), in the worker while the run gets ready
        self._starting = _needs_kernels(plan.session)
        if self._starting:
            self.recorder.start(lambda: kernels.prepare(plan.dtypes))

    def before(self, step: dict[str, np.ndarray], count: int) -> None:
        if self._starting:  # start-up's end, not the step's: its time is the run's start-up, not a sample's
            self._starting = False
            self.recorder.wait()

        def work() -> None:
            self._arrays = _dumped(lambda: self.binding.run(step))  # as ORT holds them: the recorder puts them in NCHW
            self.recorder.wait()

        self._timed(work)

    def after(self, index: int, produced: list[np.ndarray], count: int) -> None:
        arrays = self._arrays
        self._timed(lambda: self.recorder.submit(index, produced, arrays, plan=self.plan, count=count))


class DeviceDump(_Dump):
    """Tensors kept in GPU memory and fingerprinted there (CUDA EP, CuPy).

    The dump session runs each step in a thread of its own, beside production's run of the same step on the same
    GPU (onnxruntime lets the GIL go; each session has its own CUDA stream), so that the step costs the main thread
    the longer of the two, not their sum. The first step of each size runs alone, before production: there the
    sessions search their convolution algorithms (``cudnn_conv_algo_search`` EXHAUSTIVE times them), and one
    session's kernels running beside the other's timing would move its choice. ``after`` waits for the dump's
    step before the main thread takes the next step's inputs (the input workers reuse their buffers)."""

    on = "device"

    def __init__(self, plan: DumpPlan, options: ExecutionOptions, run_dir: Path, samples: int,
                 raw_columns: set[int], raw: dict[str, Any], differing: Callable[[int, np.ndarray], set[int]] | None,
                 auto_raw: bool) -> None:
        super().__init__(plan, options, run_dir, samples, raw_columns, raw, differing)
        relaid = {c: plan.tensors[c].layout for c in plan.relaid}
        self.device = GpuFingerprints(plan.session, self.names, plan.dtypes, plan.batched, self.table.shapes,
                                      int(options.option("device_id") or 0), relaid)
        # the columns copied back: final outputs (the faithfulness check) and raw tensors; with raw auto every
        # column, since which differ from the reference is known only once the records are
        self.host_columns = range(len(self.names)) if auto_raw else sorted(set(self.recorder.final_columns) | raw_columns)
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="qconsist-dump")
        self._sizes: set[int] = set()  # step sizes whose first step ran alone
        self._step: Future | None = None  # the dump session's run of the step production is running

    _waiting: tuple[int, list[np.ndarray]] | None = None  # the step whose records are on their way: index, production's outputs

    def before(self, step: dict[str, np.ndarray], count: int) -> None:
        # the step before's records come back as this step is submitted (the GPU fingerprinted them meanwhile)
        def submit() -> Any:
            with self.device.cp.cuda.Device(self.device.device_id):
                return _dumped(lambda: self.device.submit(step, count, self.host_columns))

        if count in self._sizes:
            self._step = self._beside.submit(submit)
        else:
            self._sizes.add(count)
            self._found = self._timed(submit)

    def after(self, index: int, produced: list[np.ndarray], count: int) -> None:
        if self._step is not None:
            step, self._step = self._step, None
            self._found = self._timed(step.result)  # the main thread's wait for the dump beside production
        self._record(self._found)
        self._waiting = (index, produced)

    def close(self) -> None:
        self._beside.shutdown(wait=True)  # a step still running (production failed beside it) ends first
        super().close()

    def finish(self, samples: int, distinct: Callable[[int], int]) -> DumpSummary:
        self._record(self._timed(self.device.collect))
        return super().finish(samples, distinct)

    def _record(self, found: tuple[np.ndarray, dict[int, np.ndarray]] | None) -> None:
        if found is None or self._waiting is None:
            return
        (index, produced), (records, host) = self._waiting, found
        self._waiting = None
        self._timed(lambda: self.recorder.record_device(index, produced, host, records))

    def _parts(self, samples: int) -> dict[str, float]:
        return {k: v / samples for k, v in self.device.seconds.items()}


def _needs_kernels(session: Any) -> bool:
    """Whether a dump's tensors will be fingerprinted by the compiled kernels (one of them, by the graph's shapes,
    holds more elements than ``kernels.SMALL`` or has a size known only at run time), not by numpy alone."""
    for out in session.get_outputs():
        dims = list(out.shape or [])
        if any(not isinstance(d, int) for d in dims) or int(np.prod(dims, dtype=np.int64)) > kernels.SMALL:
            return True
    return False


def _dumped(run: Callable[[], Any]) -> Any:
    """The dump session's run; onnxruntime failing on the model is the model's failure, said in one line."""
    try:
        return run()
    except QconsistError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors at run time
        raise UnsupportedModelError(f"onnxruntime cannot run the model (its dumped graph): {ort_message(exc)}") from None


def make_recorder(plan: DumpPlan | None, options: ExecutionOptions, run_dir: Path, samples: int, on_device: bool,
                  raw_columns: set[int], raw: dict[str, Any], raw_mode: RawMode,
                  differing: Callable[[int, np.ndarray], set[int]] | None) -> StepRecorder:
    """The recorder a run needs: none without a plan, else a dump on the device or on the host."""
    if plan is None:
        return NoDump()
    if on_device and not plan.device_splits:
        logging.getLogger(__name__).warning("dump: some tensors hold their samples on another axis than the first; "
                                            "fingerprinting on the host")
    if on_device and plan.unblocked:  # NCHWc blocks (CPU kernels in the session) are put in NCHW on the host
        on_device = False
        logging.getLogger(__name__).warning("dump: some tensors are held in NCHWc blocks; fingerprinting on the host")
    if on_device and plan.device_splits:
        return DeviceDump(plan, options, run_dir, samples, raw_columns, raw, differing, raw_mode is RawMode.AUTO)
    return HostDump(plan, options, run_dir, samples, raw_columns, raw, differing)


def _raw_path(run_dir: Path, index: int) -> Path:
    path = run_dir / "dump" / "raw" / f"{index:06d}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
