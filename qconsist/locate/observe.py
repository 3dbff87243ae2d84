"""Observe every tensor that actually runs, with fresh sessions on demand.

Built on the dump machinery of ``qconsist.inference.dump``: ONNX Runtime optimizes the model for the
execution options and saves the graph it will run; every node output of *that* graph is exposed and the
graph is reloaded with optimizations off, so the observed session runs the production kernels. Each call
of ``fresh_session()`` creates a new session of the exposed graph — on the CUDA EP a new session searches
its cuDNN algorithms again at its first run — without re-optimizing the model.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from qconsist.inference.dump import expose_all, observed_graph, plan_dump
from qconsist.inference.fingerprint import tensor_hash
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session
from qconsist.onnxfile import read_onnx
from qconsist.store.scratch import scratch_parent

log = logging.getLogger(__name__)


@dataclass
class Observation:
    """Every observed tensor of one sample, by name, with its xxh3 hash."""

    arrays: dict[str, np.ndarray]
    hashes: dict[str, int]

    def outputs(self, names: list[str] | tuple[str, ...]) -> list[np.ndarray]:
        return [self.arrays[n] for n in names]


class Observer:
    """One model under one set of execution options: the plan, and fresh observing sessions."""

    def __init__(self, model_path: Path, options: ExecutionOptions, workdir: Path | None = None) -> None:
        self.model_path = Path(model_path)
        self.options = options
        self._tmp = tempfile.TemporaryDirectory(prefix="qconsist-observe-", dir=scratch_parent()) if workdir is None else None
        self.workdir = Path(workdir) if workdir is not None else Path(self._tmp.name)
        self.plan = plan_dump(self.model_path, options, self.workdir)
        optimized = read_onnx(self.plan.optimized_path, external_data=True, what="ORT's optimized graph")
        self.graph = observed_graph(optimized, self.plan)
        self._exposed_model = expose_all(optimized)[0].SerializeToString()
        self._first_session_used = False
        self.input_names = [i.name for i in self.plan.session.get_inputs()]  # type: ignore[attr-defined]

    @property
    def structure(self) -> str:
        return self.plan.structure

    def fresh_session(self) -> Any:
        """A new observing session (the plan's own session the first time)."""
        if not self._first_session_used:
            self._first_session_used = True
            return self.plan.session
        return create_session(self._exposed_model, self.options, level=OptimizationLevel.DISABLE)

    def production_session(self) -> Any:
        """A session as the application runs it: the original model, the options' optimization level."""
        return create_session(self.model_path, self.options)

    @staticmethod
    def observe(session: Any, feed: Mapping[str, np.ndarray]) -> Observation:
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, dict(feed))
        arrays = {n: np.asarray(v) for n, v in zip(names, values)}
        return Observation(arrays, {n: tensor_hash(a) for n, a in arrays.items()})

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
