"""The streaming input pipeline: samples decoded and preprocessed by parallel workers, digested where they are
made, and delivered in order, in steps of ``batch`` samples stacked on axis 0, a bounded number ahead of the
consumer so that preparing inputs overlaps with inference.

Workers (``resolve_workers``):

* **0**: in the caller's thread, one sample after the other (nothing ahead);
* **1**: one thread of this process, a few steps ahead (array inputs always take this road: reading them
  needs no decoding);
* **2 or more**: worker processes (fresh interpreters, never a fork of a process holding ONNX Runtime's
  threads), each preparing chunks of a step and writing them straight into a shared ring of step buffers (a
  memory-mapped file in ``/dev/shm``), so no tensor is pickled; the main process only learns which chunk is
  ready and its samples' digests. A thread of the main process (``_Feeder``) hands out the chunks and collects
  the reports from the moment the stream is made, whatever the consumer does meanwhile (creating its sessions,
  running a step): the ring's free slots alone bound how far ahead the workers go.

Threads or processes: preparing a 500x375 JPEG for open_nsfw (2.4 ms) holds the GIL for part of the time
(Pillow's header parsing, the Python around each call), and the main process wants it too (the session loop,
the outputs). Measured here: beside one busy Python thread, a sample prepared in a thread took 10.5-14.5 ms
instead of 2.4-4.6 ms (the GIL convoy; the thread held the GIL about half the time), which worker processes do
not share. On 2 cores busy with other work, 2 threads and 2 processes decoded 1,000 JPEGs alike (3.5 and
3.6 s, medians of 3, against 4.3 s in one process); ``benchmarks/input_pipeline.py`` measures both on the
machine at hand (16 threads against 16 processes on the GPU machine). Every worker count makes the same bytes:
each sample is made by the same function of its index (``prepare_sample``), whatever process runs it.

A step's arrays are the caller's to keep (``borrowed=False``), or views of the shared ring (``borrowed=True``)
valid until two more steps have been requested — the current and the previous step stay readable.

Errors: a sample that cannot be prepared raises its one-line error (``InputError``…) when the consumer reaches
its step, exactly as in one thread; a crash in a worker is a bug, raised as such. Ctrl-C, SIGTERM and any
error stop the workers at once (``terminate``) and remove the ring; workers run in sessions of their own, so the
terminal's Ctrl-C reaches the main process only, which decides what happens.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from qconsist.errors import ConfigError, QconsistError, ShapeMismatchError
from qconsist.inputs.digest import file_digest, sample_digest
from qconsist.inputs.loaders import Sample, file_of, prepare

log = logging.getLogger(__name__)

SAMPLES_PER_WORKER = 128  # a worker process is started only for this many samples (starting one costs ~0.1 s)
CHUNK = 4  # samples a worker prepares per task (a step of 32 is prepared by 8 workers at once)
THREAD_DEPTH = 3  # steps a worker thread prepares ahead
# chunks per worker process the ring holds beyond the two steps the consumer may read (each worker is given 2 at a
# time): room for a stall of the consumer's (a GPU's first step picking its algorithms, a collection) of about
# two chunks' decoding; 16 workers at batch 32 on a 224x224 model: 8 steps in flight, a ring of 10, 193 MB
AHEAD = 4
_POLL = 0.5  # seconds between checks that the worker processes are alive


@dataclass(frozen=True)
class SampleInfo:
    """What the worker learnt while making a sample: its digest (``digest.sample_digest``), the digest of the
    file it was read from, and an image's PIL mode before conversion."""

    digest: bytes
    file: bytes | None = None
    mode: str | None = None


class Step(NamedTuple):
    start: int  # index of the step's first sample
    arrays: Sample  # samples stacked on axis 0
    infos: list[SampleInfo]  # one per sample


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or ``taskset`` sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_workers(requested: int | None, samples: int, parallel: bool) -> int:
    """The workers a stream of ``samples`` uses: ``requested`` as given (0 = the caller's thread), or as many as
    help — the available cores, one process per ``SAMPLES_PER_WORKER`` samples, one thread below two; inputs
    that need no decoding (``parallel`` false) are read by one thread."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
            raise ConfigError(f"`workers` must be a whole number >= 0, got {requested!r}")
        return requested if parallel else min(requested, 1)
    if not parallel:
        return 1
    return max(1, min(available_cores(), samples // SAMPLES_PER_WORKER))


def prepare_sample(loader: Any, index: int) -> tuple[Sample, SampleInfo]:
    """Sample ``index`` and what the worker learnt making it: the one function every worker runs."""
    path = file_of(loader, index)
    digest = file_digest(path) if path is not None else None
    sample, mode = prepare(loader, index)
    return sample, SampleInfo(sample_digest(sample), digest, mode)


def stack(samples: Sequence[Sample], start: int, axes: dict[str, int] | None = None) -> Sample:
    """Samples stacked on each input's batch axis (``axes``, by input name: axis 0 where not named; a state
    ``[2, B, 128]`` is stacked on axis 1), one sample as it is."""
    if len(samples) == 1:
        return samples[0]
    axes = axes or {}
    first = samples[0]
    for offset, sample in enumerate(samples[1:], 1):
        for name, array in sample.items():
            axis = axes.get(name, 0)
            if array.ndim != first[name].ndim or array.ndim <= axis or _without(array.shape, axis) != _without(first[name].shape, axis) \
                    or array.dtype != first[name].dtype:
                raise ShapeMismatchError(
                    f"samples {start} and {start + offset} of one step have shapes {list(first[name].shape)} and "
                    f"{list(array.shape)} (input '{name}'): a step of several samples needs one shape; "
                    "declare [preprocess] resize, or run with `batch_size` 1")
    return {name: np.concatenate([s[name] for s in samples], axis=axes.get(name, 0)) for name in first}


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1:]


def steps(loader: Any, count: int, batch: int, workers: int = 1, borrowed: bool = False,
          axes: dict[str, int] | None = None) -> Iterator[Step]:
    """Samples ``0 .. count-1`` of ``loader`` in steps of ``batch``, prepared by ``workers`` (module docstring);
    ``axes``: each input's batch axis where it is not 0 (such steps are stacked by a thread of this process)."""
    if axes and any(axes.values()):
        workers = min(workers, 1)
    if workers >= 2 and count > 1:
        return _processes(loader, count, batch, workers, borrowed)
    if workers == 1:
        return _threaded(loader, count, batch, axes)
    return _serial(loader, count, batch, axes)


def _serial(loader: Any, count: int, batch: int, axes: dict[str, int] | None = None) -> Iterator[Step]:
    for start in range(0, count, batch):
        made = [prepare_sample(loader, i) for i in range(start, min(start + batch, count))]
        yield Step(start, stack([m[0] for m in made], start, axes), [m[1] for m in made])


_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _threaded(loader: Any, count: int, batch: int, axes: dict[str, int] | None = None) -> Iterator[Step]:
    ready: queue.Queue = queue.Queue(maxsize=THREAD_DEPTH)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for step in _serial(loader, count, batch, axes):
                if not offer(step):
                    return
            offer(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            offer(_Failure(exc))

    thread = threading.Thread(target=produce, name="qconsist-inputs", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join()


# --- worker processes ---------------------------------------------------------------------------------------


class _Ring:
    """``slots`` step buffers of ``slot_bytes`` in one memory-mapped file, unlinked as soon as every worker
    has mapped it (so nothing stays behind, whatever ends the process). On the CUDA EP the run registers the
    whole mapping as page-locked host memory (``page_lock``; ``qconsist.inference.pinned``), and ``close``
    unregisters it before the mapping is unmapped."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots, self.slot_bytes = slots, slot_bytes
        size = max(1, slots * slot_bytes)
        handle, self.path = tempfile.mkstemp(prefix="qconsist-inputs-", dir=_ring_folder(size))
        try:
            os.ftruncate(handle, size)
            self.map = mmap.mmap(handle, size)
        finally:
            os.close(handle)
        self._lock = threading.Lock()  # page_lock (a start-up thread) against close (the consumer, a finalizer)
        self._closed = False
        self._release: Callable[[], bool] | None = None

    def page_lock(self, register: Callable[[int, int], Callable[[], bool]]) -> bool:
        """Register the whole mapping with ``register(address, size)`` (page-locking it), which returns the function
        that unregisters it (true where it did). ``close`` calls that function before the mapping is unmapped,
        whatever closes the ring — the end of the steps, an error, Ctrl-C, a stream dropped unread —, so no
        registered range is ever unmapped under the driver. False where the ring is closed already (nothing is
        registered); ``register``'s error is raised (nothing is registered either)."""
        with self._lock:
            if self._closed:
                return False
            if self._release is None:
                view = np.frombuffer(self.map, dtype=np.uint8, count=1)  # the mapping's address (the view goes at once)
                address = int(view.ctypes.data)
                del view
                self._release = register(address, self.map.size())
            return True

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            release, self._release = self._release, None
            if release is not None and not release():
                # the driver may still hold the range: it stays mapped until the process ends, never unmapped under it
                self.unlink()
                return
        self.unlink()
        try:
            self.map.close()
        except BufferError:  # the consumer still holds a borrowed step: the mapping goes with its last view
            pass


def shared_ring(steps: Any) -> tuple[_Ring | None, str]:
    """The ring of step buffers whose views ``steps`` (``steps()``, or ``InputSet.steps``, which keeps it as
    ``source``) hands out, or why there is none: only worker processes write a ring, and only borrowed steps are
    its views (the others are copies, or arrays this process stacked)."""
    made = getattr(steps, "source", steps)
    if not isinstance(made, _Stream):
        return None, ("the steps are made in this process (no input workers' ring: fewer than 2 workers, a single "
                      "sample, or inputs stacked on another axis than 0)")
    if not made.borrowed:
        return None, "the steps are copies of the input workers' ring"
    return made.ring, ""


def _ring_folder(size: int) -> str | None:
    """``/dev/shm`` where it has room for the ring (memory, not disk), else the system's temporary folder."""
    try:
        stats = os.statvfs("/dev/shm")
        if stats.f_bavail * stats.f_frsize > 2 * size and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    except OSError:
        pass
    return None


def _views(buffer: Any, offset: int, layout: list[tuple[str, tuple[int, ...], np.dtype]], rows: int) -> Sample:
    """The arrays of a step of ``rows`` samples in ``buffer`` at ``offset`` (inputs one after the other)."""
    arrays = {}
    for name, shape, dtype in layout:
        arrays[name] = np.ndarray((rows, *shape), dtype=dtype, buffer=buffer, offset=offset)
        offset += rows * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return arrays


def _fits(sample: Sample, layout: list[tuple[str, tuple[int, ...], np.dtype]]) -> bool:
    return len(sample) == len(layout) and all(
        name in sample and sample[name].shape == (1, *shape) and sample[name].dtype == dtype for name, shape, dtype in layout)


def serve() -> None:
    """A worker process (started by ``_Workers``): set up from the first message, then prepare the chunks it
    is given into the ring and report their samples' digests (or the error), until its connection closes."""
    connection = Connection(int(sys.argv[1]))
    loader, path, size, slot_bytes, layout = connection.recv()
    with open(path, "r+b") as handle:
        ring = mmap.mmap(handle.fileno(), size)
    connection.send(("ready",))
    while True:
        try:
            number, slot, start, first, stop, rows = connection.recv()
        except (EOFError, OSError):
            return
        infos, spilled, index = [], {}, first
        try:
            step = _views(ring, slot * slot_bytes, layout, rows)
            for index in range(first, stop):
                sample, info = prepare_sample(loader, index)
                if _fits(sample, layout):
                    for name, array in sample.items():
                        step[name][index - start] = array[0]
                else:
                    spilled[index] = sample  # another shape than sample 0's: sent whole (batch 1 only)
                infos.append(info)
            message: tuple = ("done", number, first, infos, spilled)
        except QconsistError as exc:
            message = ("error", number, index, type(exc), exc.template)
        except Exception as exc:  # noqa: BLE001 - a bug: reported to the main process, which raises it
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            message = ("crash", number, index, detail, traceback.format_exc())
        connection.send(message)


class _Worked(Exception):
    """A worker process failed: a bug (its traceback is logged at debug level)."""


class _Workers:
    """Worker processes, each a fresh interpreter (``serve``) in a session of its own — the terminal's Ctrl-C
    reaches the main process only, which stops them — joined to the main process by a socket pair: a worker
    whose main process is gone reads the end of its connection and exits."""

    def __init__(self, count: int, setup: tuple) -> None:
        self.processes: list[subprocess.Popen] = []
        self.connections: list[Connection] = []
        code = f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; from {__name__} import serve; serve()"
        try:
            for _ in range(count):
                mine, theirs = socket.socketpair()
                with theirs:
                    self.processes.append(subprocess.Popen(
                        [sys.executable, "-c", code, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                        stdin=subprocess.DEVNULL, start_new_session=True))
                self.connections.append(Connection(mine.detach()))
            # pickled once for all workers: the loader holds every file's path (50,000 for an ImageNet folder),
            # pickled per worker it cost 1.45 s of start-up for 10,000 files and 16 workers on the GPU machine
            payload = bytes(ForkingPickler.dumps(setup))
            for connection in self.connections:
                connection.send_bytes(payload)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        """Until every worker has started and mapped the ring (their imports overlap with the caller's work)."""
        for connection in self.connections:
            self.receive(connection)

    def receive(self, connection: Connection) -> tuple:
        try:
            return connection.recv()
        except (EOFError, OSError):
            self.check()
            raise _Worked("an input worker closed its connection") from None

    def check(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise _Worked(f"input worker {process.pid} stopped (exit code {process.returncode}) while preparing samples")

    def ready(self, *others: Any) -> list[Any]:
        """The connections (and ``others``) with a message waiting, after at most ``_POLL`` seconds; a dead
        worker raises."""
        found = wait([*self.connections, *others], timeout=_POLL)
        if not found:
            self.check()
        return found

    def terminate(self) -> None:
        """Ask every worker to stop now (its connection then reads the end)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()

    def stop(self) -> None:
        """Stop every worker now (they hold nothing that needs cleaning up)."""
        for connection in self.connections:
            connection.close()
        self.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class _Pending:
    """A step being prepared: chunks not yet reported, the samples' infos, samples sent whole, errors by sample."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.infos: dict[int, SampleInfo] = {}
        self.spilled: dict[int, Sample] = {}
        self.errors: dict[int, BaseException] = {}

    def add(self, message: tuple) -> None:
        self.chunks -= 1
        if message[0] == "done":
            _, _, first, infos, spilled = message
            self.infos.update(zip(range(first, first + len(infos)), infos))
            self.spilled.update(spilled)
        elif message[0] == "error":
            _, _, index, cls, template = message
            self.errors[index] = cls(template)
        else:
            _, _, index, detail, trace = message
            log.debug("input worker traceback (sample %d):\n%s", index, trace)
            self.errors[index] = _Worked(f"input worker failed on sample {index}: {detail}")


def _processes(loader: Any, count: int, batch: int, workers: int, borrowed: bool) -> "_Stream":
    """Start the workers and the thread that feeds them now: the first steps are prepared while the caller goes
    on (a run creates its sessions meanwhile), and later ones while it is busy with a step."""
    first_sample, _ = prepare(loader, 0)  # its layout sizes the ring (its digests are the workers' to make)
    layout = [(name, tuple(a.shape[1:]), a.dtype) for name, a in first_sample.items()]
    row_bytes = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for _, shape, dtype in layout)
    chunk = max(1, min(batch, CHUNK))
    workers = min(workers, math.ceil(count / chunk))
    in_flight = max(1, math.ceil(AHEAD * workers / math.ceil(batch / chunk)))  # steps being prepared
    slots = in_flight + 2  # and the two steps the consumer may hold
    ring = _Ring(slots, batch * row_bytes)
    try:
        pool = _Workers(workers, (loader, ring.path, ring.map.size(), ring.slot_bytes, layout))
    except BaseException:
        ring.close()
        raise
    feeder = _Feeder(pool, ring, count, batch, chunk, slots, borrowed)
    made = _Stream(feeder, layout, count, batch, borrowed)
    weakref.finalize(made, feeder.close)  # a stream dropped before it is read stops its workers too
    feeder.start()
    return made


class _Feeder(threading.Thread):
    """The thread that keeps the workers busy: it gives them the chunks of every step the ring has room for
    (``slots`` steps, less those the consumer may still read) and collects their reports, whatever the consumer
    is doing — creating its sessions before the first step, running one, writing its outputs. Before, the
    consumer's own thread handed out chunks only while it waited for a step, so the workers stood idle during
    start-up and, once their two chunks were done, during every step of inference."""

    def __init__(self, pool: _Workers, ring: _Ring, count: int, batch: int, chunk: int, slots: int,
                 borrowed: bool) -> None:
        super().__init__(name="qconsist-input-feeder", daemon=True)
        self.pool, self.ring, self.count, self.batch, self.chunk, self.slots = pool, ring, count, batch, chunk, slots
        self.total = math.ceil(count / batch)
        self.held = 1 if borrowed else 0  # steps before the requested one whose slots the consumer may still read
        self.condition = threading.Condition()
        self.requested = 0  # the step the consumer asks for (it is done with those before, less ``held``)
        self.done: dict[int, _Pending] = {}  # steps every chunk of which was reported, not yet taken
        self.failure: BaseException | None = None
        self.stopping = False
        self.wake_reader, self.wake_writer = socket.socketpair()
        self.wake_writer.setblocking(False)

    # the consumer's side

    def take(self, number: int) -> _Pending:
        """Step ``number``'s reports, once every chunk is in (the consumer is then done with earlier steps)."""
        with self.condition:
            self.requested = number
            self._wake()
            while number not in self.done:
                if self.failure is not None:
                    raise self.failure
                self.condition.wait(_POLL)
            return self.done.pop(number)

    def close(self) -> None:
        """Stop the workers and this thread, and remove the ring (any thread; more than once is harmless)."""
        with self.condition:
            self.stopping = True
            self._wake()
        self.pool.terminate()  # a feeder blocked on a worker's connection reads its end
        if self.is_alive() and self is not threading.current_thread():
            self.join()
        self.pool.stop()
        self.ring.close()
        self.wake_reader.close()
        self.wake_writer.close()

    def _wake(self) -> None:
        try:
            self.wake_writer.send(b"\0")
        except (BlockingIOError, OSError):  # already woken (the buffer is full) or closed
            pass

    # the thread

    def run(self) -> None:
        try:
            self._feed()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            with self.condition:
                if not self.stopping:
                    self.failure = exc
                self.condition.notify_all()

    def _feed(self) -> None:
        pool = self.pool
        pool.wait_ready()
        self.ring.unlink()  # every worker holds the mapping: the file's name is no longer needed
        busy = dict.fromkeys(pool.connections, 0)  # chunks given to each worker and not yet reported
        pending: dict[int, _Pending] = {}
        queued: deque[tuple] = deque()  # chunks of submitted steps no worker has yet
        submitted = completed = 0
        while completed < self.total:
            with self.condition:
                if self.stopping:
                    return
                room = min(self.total, self.requested - self.held + self.slots)  # the slots no one may read
            while submitted < room:
                start, stop = submitted * self.batch, min(submitted * self.batch + self.batch, self.count)
                chunks = range(start, stop, self.chunk)
                pending[submitted] = _Pending(len(chunks))
                queued.extend((submitted, submitted % self.slots, start, first, min(first + self.chunk, stop),
                               stop - start) for first in chunks)
                submitted += 1
            for connection in pool.connections:
                while queued and busy[connection] < 2:
                    connection.send(queued.popleft())
                    busy[connection] += 1
            for ready in pool.ready(self.wake_reader):
                if ready is self.wake_reader:
                    self.wake_reader.recv(4096)
                    continue
                message = pool.receive(ready)
                busy[ready] -= 1
                state = pending[message[1]]
                state.add(message)
                if state.chunks == 0:
                    with self.condition:
                        self.done[message[1]] = pending.pop(message[1])
                        completed += 1
                        self.condition.notify_all()


class _Stream:
    """The steps the workers make, in order (an iterator; ``close`` stops the workers before the end)."""

    def __init__(self, feeder: _Feeder, layout: list, count: int, batch: int, borrowed: bool) -> None:
        self._feeder, self._layout, self._count, self._batch, self._borrowed = feeder, layout, count, batch, borrowed
        self._next = 0

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> Step:
        feeder, number = self._feeder, self._next
        if number >= feeder.total:
            feeder.close()
            raise StopIteration
        try:
            state = feeder.take(number)
        except BaseException:
            feeder.close()
            raise
        self._next += 1
        if state.errors:
            feeder.close()
            raise state.errors[min(state.errors)]  # the first failing sample, as in one thread
        start = number * self._batch
        rows = min(self._batch, self._count - start)
        infos = [state.infos[i] for i in range(start, start + rows)]
        arrays = _views(feeder.ring.map, (number % feeder.slots) * feeder.ring.slot_bytes, self._layout, rows)
        if state.spilled:  # a sample of another shape than sample 0's
            if rows != 1:
                feeder.close()
                stack([state.spilled.get(i) or {n: v[i - start: i - start + 1] for n, v in arrays.items()}
                       for i in range(start, start + rows)], start)  # raises the error naming both shapes
            arrays = state.spilled[start]
        elif not self._borrowed:
            arrays = {name: array.copy() for name, array in arrays.items()}
        return Step(start, arrays, infos)

    @property
    def borrowed(self) -> bool:
        """Whether the steps' arrays are views of the ring (``ring``), not copies."""
        return self._borrowed

    @property
    def ring(self) -> _Ring:
        return self._feeder.ring

    def close(self) -> None:
        self._feeder.close()
