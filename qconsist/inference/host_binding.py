"""The host dump's session run with every dumped tensor written into memory that is reused step after step.

``session.run(names, step)`` hands back every one of the exposed graph's outputs as a new numpy array: ONNX
Runtime computes each tensor in its own buffer and then copies it into a freshly allocated array (89.7 MB
per sample for open_nsfw QDQ on the CPU EP, page faults included). That copy, not the computation, made the
exposed session cost 1.6–2.4× production on the CPU here (benchmarks/dump_overhead.py). ``HostBinding`` binds
every output with IOBinding to a preallocated numpy array instead, so ORT writes each tensor straight into it
(0.85–1.0× production, the same run measured side by side): the kernels and their results are the same (the
dump's faithfulness check compares the final outputs with production's bit for bit on every sample).
With onnxruntime 1.31.1 ``session.run`` no longer copies: each output is a numpy array over the buffer ORT allocated
for it (its ``base`` a capsule holding that buffer), and the whole dump ran 1.02× slower a step without the binding
than with it (open_nsfw QDQ, 20 paired rounds, load 1.3; docs/dumps.md): the binding now saves ORT's allocations, little.

Two sets of buffers alternate (``SLOTS``): the fingerprint worker (``dump.DumpRecorder``) reads step i's
tensors while ORT writes step i + 1's into the other set; the recording side waits for the worker before a
third step is run, so a set is never written while it is read.

The buffers' shapes are learnt per input shape from a first ordinary run (whose arrays serve that step).
Where a binding cannot serve — an output whose shape depends on the values (``NonZero``: ORT refuses a
preallocated output of another shape), an element type numpy cannot name (bfloat16, float8), inputs of
another type than the graph's — that input shape falls back to ``session.run``, which records the same
tensors, and the fallback is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

log = logging.getLogger(__name__)

SLOTS = 2  # sets of buffers in turn: one read by the fingerprint worker, one written by ORT


@dataclass
class _Slot:
    binding: Any  # onnxruntime.IOBinding with every output bound to ``buffers``
    buffers: list[np.ndarray]


def _numpy_type(name: str) -> np.dtype | None:
    try:
        kind = np.dtype(name)
    except TypeError:
        return None
    return kind if kind.kind in "fiub" else None


class HostBinding:
    """Runs the exposed graph (``dump.DumpPlan.session``) on a step; its outputs land in reused host buffers."""

    def __init__(self, session: Any, names: Sequence[str], dtypes: Sequence[str]) -> None:
        self.session, self.names = session, list(names)
        self.types = [_numpy_type(d) for d in dtypes]
        self._slots: dict[tuple, list[_Slot] | None] = {}
        self._turn = 0
        self._quiet: Any = None
        self.bound_steps = 0  # steps written into bound buffers (the rest: session.run)

    def run(self, step: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Every dumped tensor of ``step``, in column order. The arrays stay valid until the step after next
        (``SLOTS``) is run."""
        key = tuple(sorted((name, tuple(a.shape), np.asarray(a).dtype.str) for name, a in step.items()))
        if key not in self._slots:
            arrays = self.session.run(self.names, step)
            self._slots[key] = self._bind(arrays)
            return arrays
        slots = self._slots[key]
        if slots is None:
            return self.session.run(self.names, step)
        slot = slots[self._turn % len(slots)]
        self._turn += 1
        try:
            for name, array in step.items():
                slot.binding.bind_cpu_input(name, np.ascontiguousarray(array))
            self.session.run_with_iobinding(slot.binding, self._run_options())
        except Exception as exc:  # noqa: BLE001 - ORT raises RuntimeError or its own Fail/InvalidArgument
            log.info("dump: outputs not bound to reused buffers for inputs %s (%s); running without",
                     ", ".join(f"{n} {s}" for n, s, _ in key), " ".join(str(exc).split())[:200])
            self._slots[key] = None
            return self.session.run(self.names, step)
        self.bound_steps += 1
        return list(slot.buffers)

    def _run_options(self) -> Any:
        """Run options that keep ORT from logging the refusal of a preallocated output as an error (the
        fallback runs the step again; the run's onnxruntime log should not carry a failure that was not one)."""
        if self._quiet is None:
            import onnxruntime as ort

            self._quiet = ort.RunOptions()
            self._quiet.log_severity_level = 4
        return self._quiet

    def _bind(self, arrays: list[np.ndarray]) -> list[_Slot] | None:
        if any(kind is None or np.asarray(a).dtype != kind for kind, a in zip(self.types, arrays)):
            log.info("dump: an output's element type has no numpy buffer; every step runs without bound outputs")
            return None
        slots = []
        for _ in range(SLOTS):
            buffers = [np.empty(a.shape, a.dtype) for a in arrays]
            binding = self.session.io_binding()
            for name, buffer in zip(self.names, buffers):
                binding.bind_output(name, "cpu", 0, buffer.dtype, list(buffer.shape), buffer.ctypes.data)
            slots.append(_Slot(binding, buffers))
        return slots
