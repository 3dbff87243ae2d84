"""One model across GPU types, on request (``qconsist nightly --across-gpus``): which nodes' results differ
between GPUs.

An entry with ``gpus = ["H100", "H200"]`` runs once per GPU type; each such run also dumps the quantized
model on the CUDA EP under the entry's pinned GPU config (role ``gpu``, where CUDA exists). Across GPU types
the head process diffs those dumps (``qconsist.diff``, the one comparison) of every type against the first
type listed: the nodes that diverge. One dump on each GPU cannot tell a node whose results depend on the GPU
from one that varies from run to run on any GPU (the FCN head's deconvolution under EXHAUSTIVE): the comparison
says so, and the entry's ``locate`` (repeated fresh sessions on one GPU) tells them apart. Where a run has no CUDA
dump (no CUDA on its node), the CPU-EP dumps (role ``quantized``) are compared instead and the comparison
says so: then a difference names the nodes whose results depend on the node's CPU.

One model across devices of one type (an entry with ``devices = 2`` or ``"all"``): its task dumps the same
quantized model on each of its GPUs under the entry's pinned config; the dumps on every further device are
diffed against the first device's, keyed by device (host index and UUID), on every night (the entry asked for it).

Each comparison names the origins (a node whose every input is observed and identical, whose output differs)
and the spans (identical observed inputs upstream, a differing output, unobserved tensors in between: the
nodes inside are listed), as the diff's origin rule finds them.
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
    gpu_a: str  # a GPU type, or a device ("GPU 0 (GPU-8d3c0f2a-1b)")
    gpu_b: str
    role: str  # the inference runs compared: gpu (CUDA EP) or quantized (CPU EP)
    run_a: str
    run_b: str
    identical: bool
    nodes: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()
    error: str | None = None
    notes: tuple[str, ...] = field(default=())
    scope: str = "type"  # type: across GPU types; device: across devices of one node (an entry's ``devices``)
    spans: tuple[str, ...] = ()  # spans: where a divergence starts among tensors not all observed
    span_nodes: tuple[tuple[str, ...], ...] = ()  # the nodes inside each span, in topological order
    config: str | None = None  # the pinned GPU config both dumps ran under (the entry's gpu_config)
    devices: tuple[dict, ...] = ()  # scope device: the two devices (index, host_index, uuid, name)

    @property
    def first(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    @property
    def what(self) -> str:
        return "the devices" if self.scope == "device" else "the GPU types"

    def found(self) -> str:
        """The origins and spans, in words ("" where none was found)."""
        parts = []
        if self.origins:
            parts.append(f"origins: {', '.join(self.origins)}")
        if self.spans:
            parts.append("spans: " + ", ".join(f"{span} (nodes inside: {', '.join(inside)})" if inside else span
                                               for span, inside in zip(self.spans, self.span_nodes or [()] * len(self.spans))))
        return "; ".join(parts)

    def __str__(self) -> str:
        under = f", {self.config}" if self.config and self.role == "gpu" else ""
        head = f"{self.model}: {self.gpu_a} vs {self.gpu_b} ({'CUDA EP' if self.role == 'gpu' else 'CPU EP'} dumps{under})"
        if self.error:
            return f"{head}: not compared: {self.error}"
        if self.identical:
            return (f"{head}: bit-identical; the two devices compute the same bits" if self.scope == "device"
                    else f"{head}: bit-identical; no node depends on the GPU type")
        found = self.found()
        return (f"{head}: {len(self.nodes)} node(s) differ between {self.what}, first {self.first}" + (f" ({found})" if found else "")
                + "; one dump on each, so a node that varies from run to run on one GPU differs here too (locate tells them apart)")


def _runs(outcome: EntryOutcome) -> dict[str, str]:
    return {run.role: run.path for run in outcome.runs}


def _compare(base: dict, run_a: str, run_b: str) -> GpuComparison:
    """Diff two dumps (the one comparison) and keep what names the GPU's part: nodes, origins, spans."""
    try:
        diff = diff_runs(run_a, run_b)
    except QconsistError as exc:
        return GpuComparison(**base, identical=False, error=exc.message)
    tensors = diff.tensors
    nodes = tuple(n.label for n in tensors.nodes) if tensors is not None else ()
    origins = tuple(n.label for n in tensors.origins) if tensors is not None else ()
    spans = tuple(n.label for n in tensors.spans) if tensors is not None else ()
    inside = tuple(tuple(n.span) for n in tensors.spans) if tensors is not None else ()
    identical = not nodes and (diff.outputs is None or diff.outputs.identical)
    return GpuComparison(**base, identical=identical, nodes=nodes, origins=origins, spans=spans, span_nodes=inside,
                         notes=tuple(diff.notes))


def compare_across_devices(entries: Sequence[EntryOutcome], configs: dict[str, str | None] | None = None) -> list[GpuComparison]:
    """Every entry dumped on several devices (``devices``): each further device's CUDA-EP dumps against the first
    device's. ``configs``: the pinned GPU config of each model (history key), named in the comparison."""
    comparisons = []
    for outcome in entries:
        if len(outcome.devices) < 2 and not any(r.role.startswith("gpu:") for r in outcome.runs):
            continue
        runs = _runs(outcome)
        first = outcome.devices[0]
        for device in outcome.devices[1:]:
            role = "gpu" if device.index == 0 else f"gpu:{device.index}"
            base = dict(model=outcome.model, gpu_a=first.short, gpu_b=device.short, role="gpu", run_a=runs.get("gpu", ""),
                        run_b=runs.get(role, ""), scope="device", config=(configs or {}).get(outcome.model),
                        devices=(first.to_json(), device.to_json()))
            if not base["run_a"] or not base["run_b"]:
                comparisons.append(GpuComparison(**base, identical=False,
                                                 error=f"{outcome.model} made no CUDA-EP dumps on both devices "
                                                       f"({outcome.error or outcome.locate_skipped or outcome.status})"))
                continue
            comparisons.append(_compare(base, base["run_a"], base["run_b"]))
    return comparisons


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
            comparisons.append(_compare(base, base["run_a"], base["run_b"]))
    return comparisons
