"""One model across GPU types, on request (``qconsist nightly --across-gpus``): which nodes' results depend on
the GPU.

An entry with ``gpus = ["H100", "H200"]`` runs once per GPU type; each such run also dumps the quantized
model on the CUDA EP under the entry's pinned GPU config (role ``gpu``, where CUDA exists). Across GPU types
the head process diffs those dumps (``qconsist.diff``, the one comparison) of every type against the first
type listed: the nodes that diverge are the ones whose results depend on the GPU. Where a run has no CUDA
dump (no CUDA on its node), the CPU-EP dumps (role ``quantized``) are compared instead and the comparison
says so: then a difference names the nodes whose results depend on the node's CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from qconsist.diff import diff_runs
from qconsist.errors import QconsistError
from qconsist.nightly.entry import EntryOutcome
from qconsist.store.serde import serialized


@serialized(derived=("first",))
@dataclass(frozen=True)
class GpuComparison:
    """One model on two GPU types: ``identical``, else the diverging nodes in topological order, the first,
    and the origins (where a divergence starts rather than flows in)."""

    model: str
    gpu_a: str
    gpu_b: str
    role: str  # the inference runs compared: gpu (CUDA EP) or quantized (CPU EP)
    run_a: str
    run_b: str
    identical: bool
    nodes: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    error: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def first(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    def __str__(self) -> str:
        head = f"{self.model}: {self.gpu_a} vs {self.gpu_b} ({'CUDA EP' if self.role == 'gpu' else 'CPU EP'} dumps)"
        if self.error:
            return f"{head}: not compared: {self.error}"
        if self.identical:
            return f"{head}: bit-identical; no node depends on the GPU type"
        return (f"{head}: {len(self.nodes)} node(s) depend on the GPU type, first {self.first}"
                + (f" (origins: {', '.join(self.origins)})" if self.origins else ""))


def _runs(outcome: EntryOutcome) -> dict[str, str]:
    return {run.role: run.path for run in outcome.runs}


def compare_across_gpus(entries: Sequence[EntryOutcome]) -> list[GpuComparison]:
    """Every model run on several GPU types: each type's dumps against the first type's."""
    by_model: dict[str, list[EntryOutcome]] = {}
    for outcome in entries:
        if outcome.gpu_type is not None:
            by_model.setdefault(outcome.model.rsplit("@", 1)[0], []).append(outcome)
    comparisons = []
    for model, outcomes in by_model.items():
        first = outcomes[0]
        for other in outcomes[1:]:
            runs_a, runs_b = _runs(first), _runs(other)
            role = "gpu" if "gpu" in runs_a and "gpu" in runs_b else "quantized"
            base = dict(model=model, gpu_a=str(first.gpu_type), gpu_b=str(other.gpu_type), role=role,
                        run_a=runs_a.get(role, ""), run_b=runs_b.get(role, ""))
            if not base["run_a"] or not base["run_b"]:
                failed = first if not base["run_a"] else other
                comparisons.append(GpuComparison(**base, identical=False,
                                                 error=f"{failed.model} made no dumps ({failed.error or failed.status})"))
                continue
            try:
                diff = diff_runs(base["run_a"], base["run_b"])
            except QconsistError as exc:
                comparisons.append(GpuComparison(**base, identical=False, error=exc.message))
                continue
            tensors = diff.tensors
            nodes = tuple(n.label for n in tensors.nodes) if tensors is not None else ()
            origins = tuple(n.label for n in tensors.origins) if tensors is not None else ()
            identical = not nodes and (diff.outputs is None or diff.outputs.identical)
            comparisons.append(GpuComparison(**base, identical=identical, nodes=nodes, origins=origins, notes=tuple(diff.notes)))
    return comparisons
