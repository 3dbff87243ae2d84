"""``sensitivity(run, request)``: from blame to a verified fix (see the package docstring for the steps)."""

from __future__ import annotations

import hashlib
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import onnx

from qconsist.diff.quantization import QuantErrorResult, quantization_error
from qconsist.cpu import instruction_set
from qconsist.environment import fingerprint
from qconsist.errors import ConfigError, InputError, RunStoreError
from qconsist.locate.latency import LatencyOptions
from qconsist.inference.session import (
    ExecutionOptions, create_session, measurement_options, ort_logged, require_provider, run_outputs, sessions_opened,
)
from qconsist.inputs import InputSet
from qconsist.onnxfile import read_onnx
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.sensitivity.figures import standing
from qconsist.sensitivity.latency import latency_cost
from qconsist.sensitivity.probe import Probe, Prober, quantizable_nodes
from qconsist.sensitivity.result import (
    Cost, FirstPass, Latency, NodeSensitivity, Proposal, SensitivityResult, Step, Verification,
)
from qconsist.sensitivity.search import agreement, meets, propose
from qconsist.sensitivity.source import STAGE, QuantizedRun, open_quantized_run
from qconsist.sensitivity.target import Target
from qconsist.stages.base import stage as registered_stage
from qconsist.stages.quantize import QuantFormatChoice, QuantTypeChoice
from qconsist.store.atomic import write_atomic
from qconsist.store.manifest import Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import capture_ort_log
from qconsist.store.rundir import RunDirectory, open_run
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import dumps, loads
from qconsist.store.verify import run_file

log = logging.getLogger(__name__)

RESULT_FILE = "sensitivity.json"
DEFAULT_CANDIDATES = 16
FIRST_PASS_SAMPLES = 8  # quant-error observes every tensor of both models: a few samples rank the nodes


@dataclass(frozen=True)
class SensitivityRequest:
    """What to measure. ``candidates``: how many nodes to probe, the first pass's top ones (None: every
    quantizable node); ``targets``: what the proposal must reach (none: rank only)."""

    targets: tuple[Target, ...] = ()
    candidates: int | None = DEFAULT_CANDIDATES
    execution: ExecutionOptions = ExecutionOptions()
    first_pass_samples: int = FIRST_PASS_SAMPLES
    latency: LatencyOptions = LatencyOptions()
    alternatives: bool = True  # when keeping nodes in float cannot reach the targets, measure 16-bit quantization
    widen: bool = True  # targets not reached with the top ``candidates``: probe the next ones, until every node is

    def __post_init__(self) -> None:
        if self.candidates is not None and (isinstance(self.candidates, bool) or not isinstance(self.candidates, int)
                                            or self.candidates < 1):
            raise ConfigError(f"`candidates` must be an integer >= 1 (or every node), got {self.candidates!r}")
        if isinstance(self.first_pass_samples, bool) or not isinstance(self.first_pass_samples, int) or self.first_pass_samples < 1:
            raise ConfigError(f"`first_pass_samples` must be an integer >= 1, got {self.first_pass_samples!r}")
        if not all(isinstance(t, Target) for t in self.targets):
            raise ConfigError("`targets` must be Target objects (Target.parse(\"sqnr>=40\"))")


def _labels_per_sample(inputs: InputSet, labels: Mapping[str, int] | None) -> list[int | None] | None:
    """Each probe sample's class: from ``labels`` (sample name -> class) where given, else from the input set's
    own labels (class folders, a labels file beside its images); None where there are none."""
    if not labels:
        if inputs.labels is None:
            return None
        labels = inputs.labels.by_name
    found = [labels.get(name) for name in inputs.names]
    if not any(label is not None for label in found):
        shown = ", ".join(list(inputs.names)[:3])
        raise InputError(f"no sample of the inputs has a label (the labels name other samples; the inputs' samples: {shown}, …)")
    return found


def _first_pass(result: QuantErrorResult, model: onnx.ModelProto, names: Sequence[str]) -> dict[str, FirstPass]:
    """quant-error's figure for each node: the tensor it computes, or — where that tensor has no quantized twin (a
    Conv quantized together with the Relu after it) — the first matched tensor down its single-consumer chain."""
    errors = {e.tensor: e for e in [*result.tensors, *result.outputs]}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    by_name = {n.name: n for n in model.graph.node}
    found = {}
    for name in names:
        node = by_name[name]
        tensor = node.output[0] if node.output else ""
        for _ in range(3):
            if tensor in errors or len(consumers.get(tensor, [])) != 1 or not consumers[tensor][0].output:
                break
            tensor = consumers[tensor][0].output[0]
        error = errors.get(tensor)
        if error is not None:
            found[name] = FirstPass(error.tensor, error.sqnr_db, error.added_db)
    return found


def _first_pass_order(first: dict[str, FirstPass], names: Sequence[str]) -> list[str]:
    """Most blamed first: the SQNR a node loses (added), then its SQNR; nodes quant-error could not see last."""
    def key(name: str) -> tuple:
        f = first.get(name)
        if f is None:
            return (2, 0.0, 0.0, name)
        if f.added_db is None:
            return (1, 0.0, f.sqnr_db, name)
        return (0, -f.added_db, f.sqnr_db, name)
    return sorted(names, key=key)


def _strategy(probed: int, quantizable: int, batch: int, rounds: int, request: SensitivityRequest, stopped: str) -> str:
    """Which nodes were probed, in words."""
    if request.candidates is None or probed == quantizable and rounds == 1:
        return f"every quantizable node ({quantizable})"
    text = f"the first pass's top {probed} of {quantizable} quantizable nodes (quant-error's ranking"
    if rounds > 1:
        text += f"; widened {rounds - 1} time(s) by {batch}: the targets were not reached with fewer"
    if stopped:
        text += f"; stopped: {stopped}"
    return text + "; --all probes every one)"


def _md5(path: Path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def _alternatives(prober: Prober, run: QuantizedRun, proposal: Proposal, targets: Sequence[Target]) -> tuple[list[Step], Proposal | None]:
    """Where keeping nodes in float does not reach the targets: 16-bit activations (QDQ; the same ranges), alone and
    with the nodes the search chose, then 16-bit activations and weights. The first that reaches the targets is the
    proposal (16-bit QDQ runs in float on the CPU EP, which has no 16-bit kernels: its latency is measured too)."""
    options = run.options
    if options.format is not QuantFormatChoice.QDQ or options.activation_type not in (QuantTypeChoice.INT8, QuantTypeChoice.UINT8):
        return [], None
    wide = "int16" if options.activation_type is QuantTypeChoice.INT8 else "uint16"
    tries: list[tuple[dict, list[str]]] = [({"activation_type": wide}, [])]
    if proposal.nodes:
        tries.append(({"activation_type": wide}, list(proposal.nodes)))
    if options.weight_type in (QuantTypeChoice.INT8, QuantTypeChoice.UINT8):
        tries.append(({"activation_type": wide, "weight_type": "int16" if options.weight_type.signed else "uint16"}, []))
    steps, found = [], None
    for changes, nodes in tries:
        trial = prober.probe(nodes, changes)
        met = meets(trial, targets)
        label = ", ".join(f"{k} = {v}" for k, v in changes.items())
        steps.append(Step("alternative", label, list(nodes), trial.figures, met))
        if met:
            found = Proposal(list(nodes), trial.figures, True, proposal.method,
                             f"keeping nodes in float did not reach the targets; {label} (the same calibration ranges) does, "
                             "measured on the probe inputs", quantize_changes=changes, md5=trial.md5)
            break
    return steps, found


def _verify(prober: Prober, run: QuantizedRun, proposal: Proposal, targets: Sequence[Target], rundir: RunDirectory | None,
            scratch: Path, progress: Progress) -> tuple[Verification, object]:
    """The proposal re-made by the pipeline's own quantize stage — calibration on the run's calibration inputs
    included, as ``pipeline run`` with the proposed lines does — then run on the probe inputs and judged."""
    started = time.perf_counter()
    stage = registered_stage(STAGE)
    options = prober.options_for(proposal.nodes, proposal.quantize_changes)
    target = rundir.file(f"{STAGE}/model.onnx") if rundir is not None else scratch / "verified.onnx"
    context = run.stage_context(rundir.file if rundir is not None else None, rundir.path if rundir is not None else None, progress)
    record = stage.run(run.float_model, target, options, context)
    with ort_logged():
        outputs = run_outputs(create_session(target, prober.execution), prober.inputs)
    measured = prober.judge(outputs)
    check = next((v for k, v in record.checks.items() if k.startswith("outputs_vs_")), None)
    md5 = _md5(target)
    verification = Verification(
        model=str(target.relative_to(rundir.path)) if rundir is not None else str(target), md5=md5,
        same_as_predicted=md5 == proposal.md5, measured=measured, reached=measured.meets_all(targets),
        stage_check=check, stage_failures=list(record.result.failures), seconds=time.perf_counter() - started,
    )
    return verification, record


def _rounds(prober: Prober, baseline: Probe, first_order: list[str], quantizable: int, request: SensitivityRequest,
            seconds: dict[str, float], step, progress: Progress) -> tuple[dict[str, Probe], Proposal | None, str]:
    """Probe the first pass's nodes a batch of ``candidates`` at a time, searching after each batch, while the targets
    are missed and the search comes closer (see the package docstring): the single probes, the proposal, the
    strategy in words."""
    targets = request.targets
    batch = len(first_order) if request.candidates is None else request.candidates
    single: dict[str, Probe] = {}
    proposal: Proposal | None = None
    seconds["probes"] = seconds["search"] = 0.0
    rounds, stopped, best = 0, "", None
    while len(single) < len(first_order):
        step("probes")
        mark = time.perf_counter()
        chosen = first_order[len(single):len(single) + batch]
        with progress.task("probing nodes", len(chosen)) as task:
            for name in chosen:
                single[name] = prober.probe([name])
                task.advance()
        rounds += 1
        seconds["probes"] += time.perf_counter() - mark
        if not targets:
            break
        step("search")
        mark = time.perf_counter()
        proposal = propose(lambda nodes: prober.probe(nodes), baseline, single, targets, progress)
        seconds["search"] += time.perf_counter() - mark
        if proposal.reached or not request.widen:
            break
        # widen while it helps: a round of probes whose search comes no closer to the targets than the last one
        # stops it (they are then out of reach of nodes kept in float: the alternatives are measured instead of
        # every remaining node)
        now = standing(proposal.predicted, targets, baseline.figures)
        if best is not None and now <= best:
            stopped = "a round of probes brought the search no closer to the targets"
            break
        best = now
    return single, proposal, _strategy(len(single), quantizable, batch, rounds, request, stopped)


def _ranked(single: dict[str, Probe], baseline: Probe, first: dict[str, FirstPass], first_order: list[str],
            ops: dict[str, str], targets: Sequence[Target]) -> tuple[list[NodeSensitivity], object]:
    """Every quantizable node, the probed ones ranked by their effect on the outputs, and how quant-error's ranking
    relates to it."""
    by_standing = sorted(single, key=lambda n: (tuple(-v for v in standing(single[n].figures, targets, baseline.figures)), n))
    rank = {name: i + 1 for i, name in enumerate(by_standing)}
    gains = {n: p.figures.worst_sqnr_db - baseline.figures.worst_sqnr_db for n, p in single.items()}
    first_rank = {name: i + 1 for i, name in enumerate(first_order) if name in first}
    nodes = []
    for name in [*by_standing, *[n for n in first_order if n not in single]]:
        p = single.get(name)
        nodes.append(NodeSensitivity(
            node=name, op_type=ops[name], first_pass=first.get(name), first_pass_rank=first_rank.get(name),
            probe=p.figures if p else None, md5=p.md5 if p else "", gain_db=gains.get(name), rank=rank.get(name),
            same_model_as_baseline=bool(p and p.md5 == baseline.md5), seconds=p.seconds if p else 0.0))
    agreed = None
    if len(single) >= 3:
        agreed = agreement({n: f.added_db for n, f in first.items()}, {n: f.sqnr_db for n, f in first.items()},
                           {n: gains[n] for n in single}, [n for n in first_order if n in single], by_standing, 10)
    return nodes, agreed


def _cost(prober: Prober, sessions: int, seconds: dict[str, float]) -> Cost:
    """What it all cost, with the median parts of a probe that ran (not the all-quantized one, not a reused one)."""
    measured = [p for p in prober.measured() if p.excluded or p.options]

    def median(part: str) -> float:
        return statistics.median([getattr(p, part) for p in measured]) if measured else 0.0

    return Cost(sessions=sessions, quantizations=prober.cost.quantizations, probes=prober.probes, reused=prober.cost.reused,
                seconds=seconds, probe_parts={"quantize": median("quantize_seconds"), "session": median("session_seconds"),
                                              "inference": median("inference_seconds")})


def _probed_nodes(run: QuantizedRun, request: SensitivityRequest,
                  per_sample: list[int | None] | None) -> tuple[onnx.ModelProto, list[str], int]:
    """The float model and the names of its nodes onnxruntime quantizes (and how many such nodes have no name),
    once the targets are checked against what the run judges."""
    judged = run.judged()
    for target in request.targets:
        target.check(judged, per_sample is not None)
    model = read_onnx(run.float_model, error=RunStoreError)
    found, unnamed = quantizable_nodes(model, run.options)
    names = [n.name for n in found]
    if not names:
        raise InputError(f"the {run.float_stage} model of {run.path} has no named node that onnxruntime quantizes "
                         f"({unnamed} unnamed): nothing to keep in float; onnxruntime excludes nodes by name: set "
                         "[optimize] name_nodes = true in the pipeline to name them, and run it again")
    return model, names, unnamed


def _first_pass_of(run: QuantizedRun, request: SensitivityRequest, inputs: InputSet, measuring: ExecutionOptions,
                   model: onnx.ModelProto, names: list[str], progress: Progress) -> tuple[dict[str, FirstPass], list[str]]:
    """quant-error's figures on the first samples, per node, and the order they give the nodes."""
    first_inputs = inputs.subset(0, min(request.first_pass_samples, len(inputs)))
    errors = quantization_error(run.path, first_inputs, measuring, float_stage=run.float_stage,
                                quantized_stage=STAGE, progress=progress)
    first = _first_pass(errors, model, names)
    return first, _first_pass_order(first, names)


def _settle(prober: Prober, run: QuantizedRun, proposal: Proposal, request: SensitivityRequest, inputs: InputSet,
            rundir: RunDirectory | None, scratch: Path, seconds: dict[str, float], step,
            progress: Progress) -> tuple[Proposal, list[Step], Verification, Latency | None, object]:
    """The search's proposal, an alternative where it misses the targets, verified and its latency measured:
    ``(proposal, alternatives, verification, latency, record)``."""
    mark = time.perf_counter()
    alternatives: list[Step] = []
    if not proposal.reached and request.alternatives:
        alternatives, found = _alternatives(prober, run, proposal, request.targets)
        if found is not None:
            found.steps = proposal.steps
            proposal = found
    seconds["search"] += time.perf_counter() - mark
    step("verify")
    mark = time.perf_counter()
    verification, record = _verify(prober, run, proposal, request.targets, rundir, scratch, progress)
    seconds["verify"] = time.perf_counter() - mark
    latency = None
    if proposal.nodes or proposal.quantize_changes:
        step("latency")
        mark = time.perf_counter()
        verified = rundir.path / verification.model if rundir is not None else Path(verification.model)
        latency = latency_cost(run.float_model, prober.model([]), verified, request.execution, inputs, request.latency, progress)
        seconds["latency"] = time.perf_counter() - mark
    return proposal, alternatives, verification, latency, record


def analyse(run: QuantizedRun, request: SensitivityRequest, inputs: InputSet, labels: Mapping[str, int] | None,
            scratch: Path, rundir: RunDirectory | None = None, progress: Progress = NULL_PROGRESS) -> tuple[SensitivityResult, object]:
    """The analysis itself (``sensitivity`` opens the run and the run directory around it)."""
    started = time.perf_counter()
    sessions_before = sessions_opened()

    def step(name: str) -> None:  # an interrupted run says where it stopped (RUNNING.json)
        if rundir is not None:
            rundir.mark_progress(f"sensitivity:{name}")

    seconds: dict[str, float] = {}
    per_sample = _labels_per_sample(inputs, labels)
    model, names, unnamed = _probed_nodes(run, request, per_sample)
    ops = {n.name: n.op_type for n in model.graph.node}
    # the probes on one intra-op thread unless a count is given (recorded figures do not change with the machine's
    # cores: qconsist.threads); the latency is timed with the options as given
    measuring = measurement_options(request.execution)
    prober = Prober(run, inputs, measuring, scratch, per_sample)
    baseline = prober.probe([], keep=True)
    run_md5 = _md5(run.quantized_model)

    step("first-pass")
    mark = time.perf_counter()
    first, first_order = _first_pass_of(run, request, inputs, measuring, model, names, progress)
    seconds["first_pass"] = time.perf_counter() - mark

    targets = request.targets
    single, proposal, strategy = _rounds(prober, baseline, first_order, len(names), request, seconds, step, progress)
    nodes, agreed = _ranked(single, baseline, first, first_order, ops, targets)

    verification = latency = record = None
    alternatives: list[Step] = []
    if proposal is not None:
        proposal, alternatives, verification, latency, record = _settle(
            prober, run, proposal, request, inputs, rundir, scratch, seconds, step, progress)
    seconds["total"] = time.perf_counter() - started
    cost = _cost(prober, sessions_opened() - sessions_before, seconds)
    result = SensitivityResult(
        run=str(run.given or run.path), model=run.name, float_stage=run.float_stage, execution=measuring.to_json(),
        inputs={**inputs.describe(), "digest": inputs.digest()}, samples=len(inputs), targets=list(targets),
        strategy=strategy, quantizable=len(names), unnamed=unnamed, baseline=baseline.figures, baseline_md5=baseline.md5,
        run_md5=run_md5, nodes=nodes, existing_exclusions=list(run.options.nodes_to_exclude), agreement=agreed,
        proposal=proposal, verification=verification, latency=latency, alternatives=alternatives, cost=cost,
        labels=sum(1 for label in per_sample or [] if label is not None), instruction_set=instruction_set().to_json(),
    )
    return result, record


def sensitivity(run_path: Path | str, request: SensitivityRequest = SensitivityRequest(), inputs: InputSet | None = None,
                labels: Mapping[str, int] | None = None, runs_dir: Path | None = None, run_id: str | None = None,
                command: Sequence[str] | None = None, progress: Progress = NULL_PROGRESS) -> tuple[SensitivityResult, Path | None]:
    """Per-node sensitivity of a pipeline run's quantization and, with targets, a verified list of nodes to keep in
    float. ``inputs``: the probe inputs (default: the run's evaluation inputs, opened again and digest-checked);
    ``labels``: sample name -> class, for accuracy (default: the inputs' own labels, where they have them). With ``runs_dir``, a run directory of kind ``sensitivity`` is
    written (``sensitivity.json``, the verified model as its quantize stage, the manifest last); its path is
    returned beside the result."""
    run = open_quantized_run(run_path)
    require_provider(request.execution.provider)
    chosen = inputs if inputs is not None else run.inputs("evaluation")
    if len(chosen) == 0:
        raise InputError("the probe inputs hold no sample")
    if runs_dir is None:
        with scratch_dir("qconsist-sensitivity-") as scratch:
            result, _ = analyse(run, request, chosen, labels, scratch, None, progress)
        return result, None
    with RunDirectory.create(Path(runs_dir), f"{run.name}-sensitivity", "sensitivity", run_id) as rundir, \
            capture_ort_log(rundir.file(ORT_LOG), str(rundir.path / ORT_LOG)) as ort_log, \
            scratch_dir("qconsist-sensitivity-") as scratch:
        result, record = analyse(run, request, chosen, labels, scratch, rundir, progress)
        write_atomic(rundir.file(RESULT_FILE), lambda tmp: tmp.write_text(dumps(result), encoding="utf-8"))
        manifest = Manifest(
            kind="sensitivity", command=list(command if command is not None else sys.argv),
            model={"name": run.name, "run": str(run.path)}, inputs=result.inputs,
            stages=[record.to_json()] if record is not None else [], environment=fingerprint(),
            sections={"sensitivity": summary(result)},
        )
        if record is not None:
            manifest.calibration = dict(record.manifest.get("calibration") or {})
        if ort_log.refresh():
            manifest.sections["onnxruntime_log"] = ort_log.to_json()
        path = rundir.finish(manifest)
    return result, path


def load_sensitivity(run_dir: Path, manifest: Manifest | None = None) -> SensitivityResult:
    """The ``SensitivityResult`` of a complete sensitivity run directory (``sensitivity.json``, verified)."""
    run_dir = Path(run_dir)
    manifest = manifest if manifest is not None else open_run(run_dir)
    if manifest.kind != "sensitivity":
        raise RunStoreError(f"run {run_dir} is a(n) {manifest.kind} run, not a sensitivity run")
    path = run_file(run_dir, manifest, RESULT_FILE, "sensitivity result")
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunStoreError(f"cannot read {path}: {exc}") from None
    try:
        return SensitivityResult.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise RunStoreError(f"{path} is not a sensitivity result ({' '.join(str(exc).split())})") from None


def summary(result: SensitivityResult) -> dict:
    """The manifest's ``sections.sensitivity``: the verdict and what a reader needs first."""
    return {
        "schema": "qconsist.sensitivity/1", "result": RESULT_FILE, "run": result.run, "passed": result.passed,
        "targets": [t.text for t in result.targets],
        "proposal": result.proposal.nodes if result.proposal is not None else None,
        "quantize_changes": result.proposal.quantize_changes if result.proposal is not None else {},
        "reached": result.verification.reached if result.verification is not None else None,
    }
