"""Production's inputs in page-locked host memory on the CUDA EP: the input workers' ring of step buffers
(``qconsist.inputs.stream``, a ``/dev/shm`` mapping whose views the steps are) registered with the CUDA runtime
(``cudaHostRegister``, through CuPy) for the whole run, so that onnxruntime's copy of each step to the GPU reads
page-locked memory (a DMA) instead of staging pageable memory through the driver's own buffer.

Measured on the GPU machine by the lead (a micro-benchmark: H200, onnxruntime-gpu 1.31.1, CuPy 14.2; open_nsfw QDQ
re-stamped to a dynamic batch, batch 32, EXHAUSTIVE, fed from a ring of 8 steps in a ``/dev/shm`` mapping): a step
8.29 ms pageable, 5.22 ms registered; the copy alone 2.39 ms against 0.35 ms; registering 147 MiB 5.2 ms,
unregistering 3 ms; the outputs bit-identical on all 8 steps. Page-locking changes how fast the bytes reach the
GPU, never which bytes: the outputs are the same bits either way (``tests/gpu/test_pinned_inputs.py``).

Only where it can help: the CUDA EP (``PROVIDERS``), and steps that are views of the ring (worker processes,
borrowed steps: ``stream.shared_ring``); a step made or stacked in this process is private memory that would have
to be registered per step, which costs more than the copy it saves. CuPy's import (0.3-0.9 s on the GPU machine) is
done in a start-up part beside production's session (``runner``'s ``pin inputs``), never on the main thread.

Never an error: where CuPy is missing or the driver refuses (``ulimit -l``, a file the kernel will not pin) the run
goes on pageable, says so once (a ``-v`` line) and records why (``InputMemory.note``).

The registration lives as long as the mapping: the ring's ``close`` — the end of the steps, an error, Ctrl-C, a
stream dropped unread, the interpreter's exit (the stream's finalizer runs in an ``atexit`` callback, before
``qconsist.interrupt``'s last one ends the process) — unregisters it before unmapping, in Python, so never after the
CUDA runtime's own teardown (which comes after Python's, where the process is not ended by ``os._exit``). A range
the driver may still hold (its unregistration refused) stays mapped until the process ends.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from qconsist.inference.cupy_loader import import_cupy
from qconsist.inference.session import ExecutionOptions
from qconsist.inputs.stream import shared_ring
from qconsist.store.sections import InputMemory

log = logging.getLogger(__name__)

PROVIDERS = ("cuda",)  # execution providers whose inputs are copied to a device from host memory
HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context, whatever device
MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: what cudaPointerGetAttributes says of a registered host range


def cuda_runtime() -> Any:
    """CuPy's binding of the CUDA runtime (``cupy.cuda.runtime``), imported here: 0.3-0.9 s on the GPU machine,
    so only in a thread beside the main one. The one place this module looks the runtime up."""
    return import_cupy().cuda.runtime  # one thread at a time: the device recorder's start imports CuPy too


def why_pageable(options: ExecutionOptions, steps: Any) -> str:
    """Why production's inputs are not page-locked for ``steps`` on ``options``' EP ("" where they can be)."""
    if options.provider not in PROVIDERS:
        return f"{options.provider.upper()} EP"
    return shared_ring(steps)[1]


def pin_inputs(steps: Any, options: ExecutionOptions) -> InputMemory:
    """The ring ``steps`` hands out views of, page-locked for the rest of its life where it can help
    (``why_pageable``); what was done, or why not, for the manifest. Never raises for a missing CuPy or the
    driver's refusal: the run goes on pageable, said once under ``-v``."""
    why = why_pageable(options, steps)
    if why:
        return _pageable(why, options)
    ring, _ = shared_ring(steps)
    try:
        runtime = cuda_runtime()
    except Exception as exc:  # noqa: BLE001 - ImportError, or CuPy's own error finding CUDA: the run goes on
        return _pageable(f"CuPy is not available ({_one_line(exc)}): install qconsist[gpu]", options)
    return page_lock(ring, runtime, int(options.option("device_id") or 0), options)


def page_lock(ring: Any, runtime: Any, device: int, options: ExecutionOptions | None = None) -> InputMemory:
    """``ring`` (``stream._Ring``: anything with ``page_lock(register)`` and ``map``) registered as page-locked
    host memory with ``runtime`` (``cuda_runtime``'s interface) on ``device``; checked with the driver
    (``cudaPointerGetAttributes`` must say host memory), unregistered by the ring's ``close``."""
    size = ring.map.size()

    def register(address: int, nbytes: int) -> Callable[[], bool]:
        with _on_device(runtime, device):
            runtime.hostRegister(address, nbytes, HOST_REGISTER_PORTABLE)
            try:
                kind = runtime.pointerGetAttributes(address).type
            except Exception:  # noqa: BLE001 - the check failed: unregistered, said as the refusal
                _unregister(runtime, device, address)
                raise
        if kind != MEMORY_TYPE_HOST:
            _unregister(runtime, device, address)
            raise RuntimeError(f"the driver says the registered range is of memory type {kind}, not host")
        return lambda: _unregister(runtime, device, address)

    try:
        locked = ring.page_lock(register)
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError (ulimit -l, a refusal) and the like: the run goes on
        return _pageable(f"cudaHostRegister of the input workers' ring ({size} bytes) was refused: {_one_line(exc)}",
                         options)
    if not locked:
        return _pageable("the input workers' ring was closed before it could be page-locked", options)
    log.info("inputs page-locked: the input workers' ring of %d bytes (%.1f MiB) registered with the CUDA runtime "
             "(device %d)", size, size / 2**20, device)
    return InputMemory(True, size)


def _pageable(note: str, options: ExecutionOptions | None) -> InputMemory:
    if options is None or options.provider in PROVIDERS:  # on the CPU EP nothing was expected: nothing said
        log.info("inputs pageable: %s", note)
    return InputMemory(False, 0, note)


def _unregister(runtime: Any, device: int, address: int) -> bool:
    """``cudaHostUnregister``; False (said as a warning) where the driver refused."""
    try:
        with _on_device(runtime, device):
            runtime.hostUnregister(address)
        return True
    except Exception as exc:  # noqa: BLE001 - the mapping is then kept mapped (stream._Ring.close)
        log.warning("the input workers' page-locked ring could not be unregistered (%s): kept mapped until the "
                    "process ends", _one_line(exc))
        return False


@contextmanager
def _on_device(runtime: Any, device: int) -> Iterator[None]:
    """This thread's current CUDA device set to ``device`` (the session's) meanwhile, then put back."""
    previous = runtime.getDevice()
    if previous != device:
        runtime.setDevice(device)
    try:
        yield
    finally:
        if previous != device:
            runtime.setDevice(previous)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
