"""One model across GPU types, on request (``qconsist nightly --across-gpus``), and across the devices of one node
(an entry with ``devices``): which nodes' results depend on the GPU, told apart from those that vary run to run.

One dump on each GPU cannot tell a node whose results depend on the GPU from one that varies from run to run on
any GPU (the FCN head's deconvolution under EXHAUSTIVE differs between two fresh sessions on one GPU): its two
dumps differ either way. So each GPU dumps the model twice, in two fresh sessions (the repeat rule of ``locate``:
a node whose output differs between fresh sessions of one configuration on one device varies from run to run),
and the head process makes three diffs (``qconsist.diff``, the one comparison, with its origin rule):

* the first dumps of the two GPUs against each other: the nodes that differ between them, the origins (every
  input observed and identical, the output not) and the spans (identical observed inputs upstream, unobserved
  tensors in between);
* on each GPU, its second dump against its first (``RepeatCheck``): the nodes that vary from run to run there.

``classify`` then puts each differing node in one of two classes: it **varies from run to run** on GPU k (it
differed between the two sessions on k: never blamed on the GPU), or it is stable on each GPU, and where it is an
origin (or a span) of the first diff it **depends on the GPU** (same inputs on both, other output, the same
output twice on each). A differing node that is neither flows from an origin upstream. Where a second dump is
missing, whether a difference comes from the GPU or from run-to-run variation is **unknown**, and said so.

An entry with ``gpus = ["H100", "H200"]`` runs once per GPU type; each such run dumps the quantized model on the
CUDA EP under the entry's pinned GPU config (roles ``gpu`` and ``gpu-repeat``, where CUDA exists). Where a run
has no CUDA dump (no CUDA on its node), the CPU-EP dumps (roles ``quantized`` and ``repeat``, the entry's own
repeat) are compared instead and the comparison says so: then a difference names the nodes whose results depend
on the node's CPU. An entry with ``devices = 2`` or ``"all"`` dumps the model twice on each of its GPUs (roles
``gpu``, ``gpu:1``, … and ``gpu-repeat``, ``gpu:1-repeat``, …); every further device is compared with the first,
keyed by device (host index and UUID), on every night (the entry asked for it).

Comparisons recorded before the second dumps (no ``repeats``) are read as they were: "N node(s) differ", with no
blame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from qconsist.diff import diff_runs
from qconsist.errors import QconsistError
from qconsist.nightly.entry import EntryOutcome, gpu_role, repeat_role
from qconsist.store.serde import serialized


@serialized(derived=("varying",))
@dataclass(frozen=True)
class RepeatCheck:
    """One GPU's (or GPU type's) two dumps of the model, two fresh sessions, compared: the nodes whose outputs
    differed between them (they vary from run to run there), the origins and spans of that variation; or why
    there is no second dump to compare (``error``: then nothing is known of its run-to-run variation)."""

    where: str  # the GPU as the comparison names it: "GPU 0 (GPU-8d3c0f2a)" or a GPU type
    run_a: str = ""
    run_b: str = ""
    nodes: tuple[str, ...] = ()  # nodes whose output differed between the two sessions, in topological order
    origins: tuple[str, ...] = ()
    spans: tuple[str, ...] = ()
    span_nodes: tuple[tuple[str, ...], ...] = ()
    error: str | None = None

    @property
    def varying(self) -> tuple[str, ...]:
        """Every node seen to vary: those that differed, and those inside a span of the variation (unobserved,
        so not shown to be stable)."""
        inside = (node for span in self.span_nodes for node in span)
        return tuple(dict.fromkeys((*self.nodes, *self.spans, *inside)))

    @property
    def stable(self) -> bool:
        return self.error is None and not self.nodes and not self.spans

    def found(self) -> str:
        return _found(self.origins, self.spans, self.span_nodes)


@dataclass(frozen=True)
class Blame:
    """``classify``'s answer: the origins and spans of the difference between two GPUs that depend on the GPU,
    the differing nodes that vary from run to run (by GPU), and why blame is unknown where it is."""

    device_origins: tuple[str, ...] = ()
    device_spans: tuple[str, ...] = ()
    run_to_run: tuple[str, ...] = ()  # differing nodes (or nodes varying though the dumps agreed) that vary run to run
    unknown: str | None = None  # why neither class can be given (a second dump missing)


def classify(nodes: Sequence[str], origins: Sequence[str], spans: Sequence[str],
             span_nodes: Sequence[Sequence[str]], repeats: Sequence[RepeatCheck]) -> Blame:
    """Blame by construction, over the records of three diffs: ``nodes``/``origins``/``spans``/``span_nodes``, what
    the first dumps of two GPUs differ in; ``repeats``, each GPU's two sessions compared. A node that varied
    between the sessions on any GPU varies from run to run (whatever else holds of it); an origin or span of the
    difference whose nodes were all stable on every GPU depends on the GPU. Without every GPU's repeat, blame is
    unknown: a node not seen to vary was not seen to be stable either."""
    missing = [f"{r.where}: {r.error}" for r in repeats if r.error is not None]
    if not repeats or missing:
        return Blame(unknown="; ".join(missing) or "no GPU was dumped twice")
    varying = {node for r in repeats for node in r.varying}
    # the differing nodes that vary; where the dumps agreed, every node that varied (they agreed by chance)
    run_to_run = tuple(dict.fromkeys(n for n in nodes if n in varying) if nodes
                       else dict.fromkeys(n for r in repeats for n in r.varying))
    device_origins = tuple(dict.fromkeys(o for o in origins if o not in varying))
    device_spans = tuple(dict.fromkeys(span for span, inside in zip(spans, [*span_nodes, *[()] * len(spans)])
                                       if span not in varying and not varying.intersection(inside)))
    return Blame(device_origins, device_spans, run_to_run)


def _found(origins: Sequence[str], spans: Sequence[str], span_nodes: Sequence[Sequence[str]]) -> str:
    """Origins and spans, in words ("" where none was found)."""
    parts = []
    if origins:
        parts.append(f"origins: {', '.join(origins)}")
    if spans:
        parts.append("spans: " + ", ".join(f"{span} (nodes inside: {', '.join(inside)})" if inside else span
                                           for span, inside in zip(spans, [*span_nodes, *[()] * len(spans)])))
    return "; ".join(parts)


@serialized(derived=("first", "blame"))
@dataclass(frozen=True)
class GpuComparison:
    """One model on two GPU types (or two devices): ``identical``, else the diverging nodes in topological order,
    the first, and the origins and spans of the difference (where it starts rather than flows in); with each
    GPU's repeat (``repeats``), which of them depend on the GPU and which vary from run to run."""

    model: str
    gpu_a: str  # a GPU type, or a device ("GPU 0 (GPU-8d3c0f2a-1b)")
    gpu_b: str
    role: str  # the inference runs compared: gpu (CUDA EP) or quantized (CPU EP)
    run_a: str
    run_b: str
    identical: bool
    nodes: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()  # of the difference between the two GPUs' first dumps, whatever its cause
    error: str | None = None
    notes: tuple[str, ...] = field(default=())
    scope: str = "type"  # type: across GPU types; device: across devices of one node (an entry's ``devices``)
    spans: tuple[str, ...] = ()  # spans: where a divergence starts among tensors not all observed
    span_nodes: tuple[tuple[str, ...], ...] = ()  # the nodes inside each span, in topological order
    config: str | None = None  # the pinned GPU config both dumps ran under (the entry's gpu_config)
    devices: tuple[dict, ...] = ()  # scope device: the two devices (index, host_index, uuid, name)
    # each GPU's two fresh sessions compared (a, then b); none in comparisons recorded before them
    repeats: tuple[RepeatCheck, ...] = ()
    device_origins: tuple[str, ...] = ()  # origins that depend on the GPU: stable in both sessions on each GPU
    device_spans: tuple[str, ...] = ()
    run_to_run: tuple[str, ...] = ()  # nodes that vary between sessions on one GPU: not blamed on the GPU
    unknown: str | None = None  # why the cause cannot be told (a second dump missing)

    @property
    def first(self) -> str | None:
        return self.nodes[0] if self.nodes else None

    @property
    def what(self) -> str:
        return "the devices" if self.scope == "device" else "the GPU types"

    @property
    def blame(self) -> str:
        """``device``, ``run-to-run``, ``device and run-to-run``, ``none`` (bit-identical and stable), ``unknown``
        (a second dump missing, or recorded before them) or ``not compared``."""
        if self.error:
            return "not compared"
        if self.identical and not self.run_to_run and self.repeats and self.unknown is None:
            return "none"
        if self.unknown is not None or not self.repeats:
            return "unknown"
        device = bool(self.device_origins or self.device_spans)
        return ("device and run-to-run" if device and self.run_to_run else "device" if device
                else "run-to-run" if self.run_to_run else "none")

    def found(self) -> str:
        """The origins and spans of the difference, in words ("" where none was found)."""
        return _found(self.origins, self.spans, self.span_nodes)

    def _varies(self) -> str:
        """Where the run-to-run variation was seen: ``on GPU 0 (origins: deconvolution3)`` per GPU."""
        return "; ".join(f"on {r.where}" + (f" ({r.found()})" if r.found() else "") for r in self.repeats if r.nodes or r.spans)

    def __str__(self) -> str:
        under = f", {self.config}" if self.config and self.role == "gpu" else ""
        sessions = "; two fresh sessions on each" if self.repeats and self.unknown is None else ""
        head = f"{self.model}: {self.gpu_a} vs {self.gpu_b} ({'CUDA EP' if self.role == 'gpu' else 'CPU EP'} dumps{under}{sessions})"
        gpu = "the device" if self.scope == "device" else "the GPU type"
        if self.error:
            return f"{head}: not compared: {self.error}"
        if not self.repeats:  # recorded before the second dumps: one dump on each
            if self.identical:
                return (f"{head}: bit-identical; the two devices compute the same bits" if self.scope == "device"
                        else f"{head}: bit-identical; no node depends on the GPU type")
            found = self.found()
            return (f"{head}: {len(self.nodes)} node(s) differ between {self.what}, first {self.first}" + (f" ({found})" if found else "")
                    + "; one dump on each, so a node that varies from run to run on one GPU differs here too (locate tells them apart)")
        if self.identical and not self.run_to_run:
            if self.unknown is not None:
                return f"{head}: bit-identical in these dumps; whether each repeats its bits is unknown ({self.unknown})"
            return (f"{head}: bit-identical, each device's two sessions too; the two devices compute the same bits" if self.scope == "device"
                    else f"{head}: bit-identical, each GPU type's two sessions too; no node depends on the GPU type")
        if self.identical:
            return (f"{head}: bit-identical in these dumps, but {len(self.run_to_run)} node(s) vary from run to run "
                    f"({self._varies()}): the two agreed by chance")
        found = self.found()
        line = f"{head}: {len(self.nodes)} node(s) differ between {self.what}, first {self.first}"
        if self.unknown is not None:
            return line + (f" ({found})" if found else "") + f"; whether from {gpu} or from run-to-run variation is unknown ({self.unknown})"
        parts = []
        blamed = _found(self.device_origins, self.device_spans, self._inside(self.device_spans))
        if blamed:
            parts.append(f"depends on {gpu}: {blamed} (inputs identical on both, output stable in both sessions on each)")
        elif self.run_to_run:  # a node downstream of a varying one cannot be shown either way
            parts.append(f"no node shown to depend on {gpu}")
        else:
            parts.append(f"no origin or span found, so no node shown to depend on {gpu}")
        if self.run_to_run:
            parts.append(f"{len(self.run_to_run)} vary from run to run ({self._varies()}), not blamed on {gpu}")
        return line + "; " + "; ".join(parts)

    def _inside(self, spans: Sequence[str]) -> tuple[tuple[str, ...], ...]:
        inside = dict(zip(self.spans, self.span_nodes))
        return tuple(tuple(inside.get(span, ())) for span in spans)


def _runs(outcome: EntryOutcome) -> dict[str, str]:
    return {run.role: run.path for run in outcome.runs}


def _diff(run_a: str, run_b: str) -> tuple[dict, str | None]:
    """Two dumps diffed (the one comparison): what names a difference's part (nodes, origins, spans), or why not."""
    try:
        diff = diff_runs(run_a, run_b)
    except QconsistError as exc:
        return {}, exc.message
    tensors = diff.tensors
    found = dict(nodes=tuple(dict.fromkeys(n.label for n in tensors.nodes)) if tensors is not None else (),
                 origins=tuple(dict.fromkeys(n.label for n in tensors.origins)) if tensors is not None else (),
                 spans=tuple(n.label for n in tensors.spans) if tensors is not None else (),
                 span_nodes=tuple(tuple(n.span) for n in tensors.spans) if tensors is not None else ())
    return {**found, "identical": not found["nodes"] and (diff.outputs is None or diff.outputs.identical),
            "notes": tuple(diff.notes)}, None


def repeat_check(where: str, run_a: str, run_b: str, missing: str) -> RepeatCheck:
    """One GPU's two sessions compared; ``missing``: why there is no second dump, where ``run_b`` is empty."""
    if not run_a or not run_b:
        return RepeatCheck(where, run_a, run_b, error=missing)
    found, error = _diff(run_a, run_b)
    if error is not None:
        return RepeatCheck(where, run_a, run_b, error=error)
    if found["identical"] and not found["nodes"]:
        return RepeatCheck(where, run_a, run_b)
    return RepeatCheck(where, run_a, run_b, found["nodes"] or ("(final outputs)",), found["origins"], found["spans"],
                       found["span_nodes"])


def _compare(base: dict, repeats: Sequence[RepeatCheck]) -> GpuComparison:
    """The two GPUs' first dumps diffed, and each difference classified with the GPUs' repeats."""
    found, error = _diff(base["run_a"], base["run_b"])
    if error is not None:
        return GpuComparison(**base, identical=False, error=error, repeats=tuple(repeats))
    notes = found.pop("notes")
    blame = classify(found["nodes"], found["origins"], found["spans"], found["span_nodes"], repeats)
    return GpuComparison(**base, **found, notes=notes, repeats=tuple(repeats), device_origins=blame.device_origins,
                         device_spans=blame.device_spans, run_to_run=blame.run_to_run, unknown=blame.unknown)


NO_SECOND = "no second dump among the entry's runs"


def compare_across_devices(entries: Sequence[EntryOutcome], configs: dict[str, str | None] | None = None) -> list[GpuComparison]:
    """Every entry dumped on several devices (``devices``): each further device's CUDA-EP dumps against the first
    device's, each device's two sessions against each other. ``configs``: the pinned GPU config of each model
    (history key), named in the comparison."""
    comparisons = []
    for outcome in entries:
        if len(outcome.devices) < 2 and not any(r.role.startswith("gpu:") for r in outcome.runs):
            continue
        runs = _runs(outcome)
        checks: dict[int, RepeatCheck] = {}

        def repeat(device) -> RepeatCheck:
            if device.index not in checks:
                role = gpu_role(device.index)
                checks[device.index] = repeat_check(device.short, runs.get(role, ""), runs.get(repeat_role(role), ""),
                                                    NO_SECOND)
            return checks[device.index]

        first = outcome.devices[0]
        for device in outcome.devices[1:]:
            base = dict(model=outcome.model, gpu_a=first.short, gpu_b=device.short, role="gpu", run_a=runs.get("gpu", ""),
                        run_b=runs.get(gpu_role(device.index), ""), scope="device", config=(configs or {}).get(outcome.model),
                        devices=(first.to_json(), device.to_json()))
            if not base["run_a"] or not base["run_b"]:
                comparisons.append(GpuComparison(**base, identical=False,
                                                 error=f"{outcome.model} made no CUDA-EP dumps on both devices "
                                                       f"({outcome.error or outcome.locate_skipped or outcome.status})"))
                continue
            comparisons.append(_compare(base, (repeat(first), repeat(device))))
    return comparisons


def compare_across_gpus(entries: Sequence[EntryOutcome]) -> list[GpuComparison]:
    """Every model run on several GPU types: each type's dumps against the first type's, each type's two
    sessions against each other."""
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
            repeats = tuple(repeat_check(str(o.gpu_type), runs[role], runs.get(repeat_role(role), ""), NO_SECOND)
                            for o, runs in ((first, runs_a), (other, runs_b)))
            comparisons.append(_compare(base, repeats))
    return comparisons
