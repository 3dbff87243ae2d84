"""``diff_runs``: compare two run directories — artifacts, calibration, tensors, final outputs."""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.compare import OutputEffect, OutputJudgement, TensorStats
from qconsist.compare.kinds import JudgedOutput, judged_outputs, parse_kinds
from qconsist.compare.tolerance import Tolerance
from qconsist.diff.accuracy import AccuracyChange, Predictions, cause, class_scores, compare_predictions
from qconsist.diff.artifacts import ArtifactComparison, CalibrationComparison, compare_artifacts, compare_calibration
from qconsist.diff.replay import NodeReplay
from qconsist.diff.tensors import SAMPLES_KEPT, TensorComparison, compare_tensors
from qconsist.environment import EnvironmentDiff, compare_environments, describe_changes
from qconsist.errors import QconsistError, RunStoreError
from qconsist.inference.engines import EngineRecord
from qconsist.inference.reader import load_dump
from qconsist.inference.runner import PRODUCTION_REPEATS
from qconsist.inference.session import ExecutionOptions
from qconsist.inputs.digest import digest_kind, same_inputs
from qconsist.inputs.record import read_samples
from qconsist.inputs.recorded import recorded_subset
from qconsist.onnxfile import read_onnx
from qconsist.store.arrays import OutputArrays, blocks, merged
from qconsist.store.run import Run
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)
SCHEMA = "qconsist.diff/1"


@dataclass
class EngineChange:
    """One convolution node's cuDNN kernels in the two runs (each run's recording session: engine per run)."""

    node: str  # the label users know
    op_type: str
    engines_a: list[str]
    engines_b: list[str]
    why_a: str | None = None  # why cuDNN says run A's kernel is not reproducible
    why_b: str | None = None
    origin: bool = False  # an origin node of the tensor comparison
    span: str | None = None  # the span of the tensor comparison this node lies inside (the span's label)

    @property
    def same(self) -> bool:
        return self.engines_a == self.engines_b

    def describe(self) -> str:
        def runs(engines: list[str]) -> str:
            distinct = list(dict.fromkeys(engines))
            return f"{distinct[0]} in all {len(engines)} runs" if len(distinct) == 1 else ", ".join(engines)

        text = f"{self.node} ({self.op_type}): A {runs(self.engines_a)}; B {runs(self.engines_b)}"
        if not self.same:
            text += " — the two runs executed different kernels"
        why = self.why_a or self.why_b
        if why:
            text += f"; {why}" + (" — the same kernel gives different results from run to run" if self.same else "")
        if self.origin:
            text += "; an origin of the tensor comparison"
        elif self.span is not None:
            text += f"; inside the span {self.span} of the tensor comparison"
        return text


def compare_engines(a: Run, b: Run, origins: set[str], spans: dict[str, str] | None = None,
                    ) -> tuple[list[EngineChange], list[str]]:
    """The convolution nodes whose kernels differ between the runs, are marked non-deterministic, are origins or
    lie inside a span (``spans``: node label → the span's label); and notes where only one run recorded its
    kernels (``qconsist run --engines``)."""
    spans = spans or {}
    record_a, record_b = a.sections.get("engines"), b.sections.get("engines")
    if not record_a and not record_b:
        return [], []
    if not record_a or not record_b:
        return [], ["only one run recorded its cuDNN engines; rerun the other with --engines to compare kernels"]
    engines_a, engines_b = EngineRecord.from_json(record_a), EngineRecord.from_json(record_b)
    nodes_b = {n.label: n for n in engines_b.nodes}
    changes = []
    for node in engines_a.nodes:
        other = nodes_b.get(node.label)
        if other is None:
            continue
        change = EngineChange(node.label, node.op_type, list(node.runs), list(other.runs), node.why, other.why,
                              node.label in origins, None if node.label in origins else spans.get(node.label))
        if not change.same or change.why_a or change.why_b or change.origin or change.span is not None:
            changes.append(change)
    return changes, []


@serialized(
    schema=SCHEMA, derived=("passed", "cause"), error=RunStoreError, refused="diff result schema {found!r} is not {schema!r}",
    malformed="diff result is malformed: {exc}",
)
@dataclass
class DiffResult:
    """Where two runs part. ``passed`` (and truth) means identical at every level compared."""

    run_a: str
    run_b: str
    artifacts: ArtifactComparison
    calibration: CalibrationComparison
    tensors: TensorComparison | None
    outputs: OutputEffect | None
    options: list[str] = field(default_factory=list)  # execution option differences
    environment: list[str] = field(default_factory=list)
    versions: EnvironmentDiff = EnvironmentDiff()  # what changes results: onnxruntime, onnx, numpy, CUDA, cuDNN, driver…
    capture: list[str] = field(default_factory=list)  # commands that capture the missing raw tensors
    notes: list[str] = field(default_factory=list)
    engines: list[EngineChange] = field(default_factory=list)  # cuDNN kernels of conv nodes, when both runs recorded them
    tolerance: Tolerance = field(default_factory=Tolerance)  # exact unless --atol/--rtol or a policy's [diff]
    output_stats: list[TensorStats] = field(default_factory=list)  # with a tolerance: each final output against it
    same_run: bool = False  # A and B are one run (one folder, or a copy of it): identical by construction
    accuracy: AccuracyChange | None = None  # where the runs have labels and a class-scores output
    judged: list[dict[str, Any]] = field(default_factory=list)  # each final output (and part) of B against A, by kind
    replays: list[NodeReplay] = field(default_factory=list)  # origins replayed in isolation (diff --replay)

    @property
    def passed(self) -> bool:
        """Identical at every level compared; with a tolerance, tensors and final outputs only need to be
        within it (artifacts and calibration stay exact)."""
        if self.tolerance.exact:
            outputs_ok = not (self.outputs and not self.outputs.identical)
        else:
            outputs_ok = all(s.passed for s in self.output_stats)
        return (
            self.artifacts.identical
            and not self.calibration.changed
            and not (self.tensors and self.tensors.beyond)
            and outputs_ok
        )

    def __bool__(self) -> bool:
        return self.passed

    @property
    def top1_agreement(self) -> float | None:
        """The class-scores outputs' per-sample top-1 agreement (the lowest of them); None where none is."""
        found = [entry["top1_agreement"] for entry in self.judged
                 if entry.get("top1_agreement") is not None and entry.get("part") is None]
        return min(found) if found else None

    @property
    def cause(self) -> str | None:
        """The instruction set as the cause, where it is the one difference the diff found: the artifacts,
        calibration and execution options are the same, the recorded onnxruntime/onnx/numpy versions too, the
        instruction sets chose other CPU kernels, and the tensors or final outputs diverge. ``None`` otherwise."""
        change = self.versions.kernels
        diverged = bool(self.outputs and not self.outputs.identical) or bool(self.tensors and self.tensors.nodes)
        if (change is None or len(self.versions.numerics) != 1 or self.options or not diverged
                or self.artifacts.first_differing_stage is not None or self.calibration.changed):
            return None
        what = " and ".join(part for part, differs in (("tensors", bool(self.tensors and self.tensors.nodes)),
                                                       ("final outputs", bool(self.outputs and not self.outputs.identical)))
                            if differs)
        line = next((entry for entry in self.environment if entry.startswith("ran different CPU kernels")),
                    f"ran different CPU kernels: {change.old} vs {change.new}")
        return f"{line}; the artifacts, calibration, options and versions are the same and the {what} diverge"


def capture_command(run: Run, keys: list[str] | None, disable: tuple[str, ...] = (),
                    subset: tuple[int, int] | None = None) -> str:
    """The ``qconsist run`` command that repeats ``manifest``'s run with a dump keeping the raw tensors of
    ``keys`` (``None``: no raw tensors), with the graph transformers ``disable`` switched off besides its own,
    on the samples ``subset`` (offset, count) of its input set (default: where the run's samples lie in it,
    when it can be opened again). It runs as printed: paths absolute and shell-quoted, every recorded
    execution option, the batch size, and — for images given to a model file — the run directory itself as the
    model (``--stage model``), which brings the run's preprocessing."""
    manifest = run.manifest
    model = manifest.model
    if model.get("run"):
        parts = ["qconsist", "run", str(Path(model["run"]).resolve())]
        if model.get("stage"):
            parts += ["--stage", model["stage"]]
    elif manifest.inputs.get("kind") == "images":
        parts = ["qconsist", "run", str(run.path.resolve()), "--stage", run.model_stages()[-1]]
    else:
        parts = ["qconsist", "run", model.get("path", "MODEL")]
    source = str(manifest.inputs.get("source", "INPUTS"))
    parts += ["--inputs", source if source.startswith("package:") or not Path(source).exists() else str(Path(source).resolve())]
    recorded = run.inference.options if run.has_inference else None
    if recorded:
        options = ExecutionOptions.from_json(recorded)
        parts += replace(options, disabled_optimizers=(*options.disabled_optimizers, *disable)).to_args()
    emulated = (manifest.environment.get("cpu_isa") or {}).get("emulated")
    if emulated:  # the run ran under QEMU: its repeat must run under the same emulated processor
        parts += ["--isa", str(emulated)]
    batch = run.inference.batch_size if run.has_inference else 1
    if batch != 1:
        parts += ["--batch-size", str(batch)]
        if model.get("dynamic_batch"):
            parts.append("--dynamic-batch")
    subset = subset if subset is not None else recorded_subset(manifest.inputs)
    if subset is not None:
        parts += ["--offset", str(subset[0]), "--count", str(subset[1])]
    parts += ["--dump", *(["--raw", ",".join(keys)] if keys is not None else [])]
    return " ".join(shlex.quote(p) for p in parts)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _same_source(a: Run, b: Run) -> bool:
    """Two pipelines of one model under different names (e.g. CPU and CUDA calibration of open_nsfw): the
    model's source files are byte-identical."""
    files_a, files_b = a.manifest.model.get("files"), b.manifest.model.get("files")
    if not isinstance(files_a, dict) or not isinstance(files_b, dict) or not files_a or set(files_a) != set(files_b):
        return False
    return all(
        isinstance(files_a[r], dict) and isinstance(files_b[r], dict) and files_a[r].get("sha256")
        and files_a[r].get("sha256") == files_b[r].get("sha256")
        for r in files_a
    )


def _check_comparable(a: Run, b: Run) -> str | None:
    name_a, name_b = a.manifest.model.get("name"), b.manifest.model.get("name")
    if name_a and name_b and name_a != name_b and a.kind == b.kind == "pipeline" and not _same_source(a, b):
        raise RunStoreError(f"runs of different models: {a.path} is {name_a!r}, {b.path} is {name_b!r}")
    if a.kind != b.kind:
        stages_a, stages_b = a.model_stages(), b.model_stages()
        if not set(stages_a) & set(stages_b):
            raise RunStoreError(
                f"runs share no stage with a model ({', '.join(stages_a)} vs {', '.join(stages_b)}): {a.path} is "
                f"{_a(a.kind)} run and {b.path} {_a(b.kind)} run; run the model from the pipeline's run directory "
                "(qconsist run RUN_DIR) to compare them"
            )
    if a.kind == b.kind == "inference":
        return _check_inputs(a, b)
    return None


def _check_inputs(a: Run, b: Run) -> str | None:
    """Refuse two inference runs on different input sets; a note when their digests are of different kinds
    (one run written before qconsist 0.2): their sample names are compared instead."""
    ia, ib = a.manifest.inputs, b.manifest.inputs
    sets = f"{ia.get('source')} ×{ia.get('count')} vs {ib.get('source')} ×{ib.get('count')}"
    digest_a, digest_b = ia.get("digest"), ib.get("digest")
    same = same_inputs(digest_a, digest_b)
    if same or digest_a == digest_b:
        return None
    if same is False:
        raise RunStoreError(f"runs on different input sets ({sets}: input digests differ); compare runs on the same inputs")
    kinds = f"{digest_kind(digest_a) or 'no'} and {digest_kind(digest_b) or 'no'} input digests"
    try:
        names_a, names_b = read_samples(a).names, read_samples(b).names
    except RunStoreError:
        return f"the runs record {kinds}: their inputs were not compared"
    if names_a != names_b:
        raise RunStoreError(f"runs on different input sets ({sets}: their sample names differ); compare runs on the same inputs")
    return (f"the runs record {kinds} (one was written before qconsist 0.2): their {len(names_a)} sample names agree, "
            "their bytes were not compared")


def _quantized(model) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear") for n in model.graph.node)


def _declared(run: Run) -> dict[str, Any]:
    for holder in (run, run.source()):
        for key in ("config", "pipeline"):
            config = holder.sections.get(key) if holder is not None else None
            if isinstance(config, dict) and "calibration" in config:
                return parse_kinds(config.get("outputs") or {}, f"run {holder.path}: [evaluation] outputs")
    return {}


def output_targets(run: Run) -> list[JudgedOutput]:
    """What each final output of an inference run's model is (``qconsist.compare.kinds``), as the pipeline and
    the gate read it: declared in the pipeline's ``[evaluation] outputs``, else read from the float graph (for a
    quantized model, the last float stage before it in the run it came from)."""
    stages = run.model_stages()
    model = run.model(stages[-1]) if stages else None
    if model is None:
        path = run.ran_model()
        model = read_onnx(path, error=RunStoreError) if path is not None else None
    if model is None:
        raise RunStoreError(f"run {run.path}: the model it ran is gone; its outputs' kinds cannot be read")
    source, stage = run.source(), run.manifest.model.get("stage")
    if _quantized(model) and source is not None:
        earlier = source.model_stages()
        for name in reversed(earlier[:earlier.index(stage)] if stage in earlier else []):
            found = source.model(name)
            if found is not None and not _quantized(found):
                model = found
                break
    return judged_outputs(model, _declared(run))


def _judge(judgements: list[OutputJudgement], names: list[str], a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for judgement in judgements:
        position = names.index(judgement.target.output)
        judgement.add(a[position], b[position])


def _per_sample(outputs_a: OutputArrays, outputs_b: OutputArrays, start: int, stop: int, effect: OutputEffect,
                stats: list[TensorStats], judgements: list[OutputJudgement], names: list[str]) -> None:
    for sample in range(start, stop):
        a, b = outputs_a.sample(sample), outputs_b.sample(sample)
        for stat, x, y in zip(stats, a, b):
            stat.add(sample, x, y)
        effect.add(effect.samples, a, b)
        _judge(judgements, names, a, b)


def _outputs(a: Run, b: Run, tolerance: Tolerance, predicted: tuple[Predictions, Predictions] | None,
             judgements: list[OutputJudgement]) -> tuple[OutputEffect, list[TensorStats]]:
    """Final outputs of both runs a block of samples at a time: their effect, each against the tolerance, each
    judged for what it is (``judgements``: B against A), and the predictions of the class-scores output."""
    effect = OutputEffect(judged=True)
    names = list(a.inference.outputs)
    section_a, section_b = a.inference, b.inference
    stats = [TensorStats(name, *tolerance.for_node(name)) for name in section_a.outputs] if not tolerance.exact else []
    if section_b.samples != section_a.samples:
        raise RunStoreError(f"the runs hold {section_a.samples} and {section_b.samples} samples; "
                            "compare runs on the same input set")
    outputs_a, outputs_b = a.outputs(), b.outputs()
    for start, stop in blocks(outputs_a):
        block_a, block_b = outputs_a.block(start, stop), outputs_b.block(start, stop)
        batches = None
        if block_a is not None and block_b is not None and not stats:
            batches = [merged(x) for x in block_a], [merged(y) for y in block_b]
        if batches is None or any(x is None for x in batches[0] + batches[1]):
            _per_sample(outputs_a, outputs_b, start, stop, effect, stats, judgements, names)
        else:
            effect.add(effect.samples, batches[0], batches[1])
            _judge(judgements, names, batches[0], batches[1])
        if predicted is not None:
            for side, block, outputs in ((predicted[0], block_a, outputs_a), (predicted[1], block_b, outputs_b)):
                side.add(start, block[side.position] if block is not None else
                         np.stack([outputs.sample(i)[side.position] for i in range(start, stop)]))
    return effect, stats


def _predictions(a: Run, b: Run) -> tuple[Predictions, Predictions] | None:
    """What the accuracy comparison gathers, where the runs have labels and a class-scores output."""
    output = class_scores(a, b)
    if output is None or output not in a.inference.outputs or output not in b.inference.outputs:
        return None
    try:
        table_a, table_b = read_samples(a), read_samples(b)
    except RunStoreError:
        return None
    sides = (Predictions(a.inference.outputs.index(output), output, table_a, a.inference.samples),
             Predictions(b.inference.outputs.index(output), output, table_b, b.inference.samples))
    return sides if any(side.has_labels for side in sides) else None


def _dump_notes(dumps: tuple[Any, Any]) -> list[str]:
    notes = []
    for dump in dumps:
        if not dump.faithful:
            distinct = dump.run.dump.production_distinct or 0
            notes.append(
                f"the final outputs of {dump.run_dir}'s dump differ from production, whose own outputs vary from run "
                f"to run ({distinct} distinct in {PRODUCTION_REPEATS} runs): a non-deterministic kernel" if distinct > 1 else
                f"the dump of {dump.run_dir} is NOT faithful: its final outputs differ from production")
    return notes


def _tensors(a: Run, b: Run, result: DiffResult, focus: list[int]) -> None:
    """The dumps' tensor comparison, when both runs have one (``focus``: samples traced one by one)."""
    if a.has_dump and b.has_dump:
        dump_a, dump_b = load_dump(a), load_dump(b)
        result.notes += _dump_notes((dump_a, dump_b))
        same_graph = dump_a.structure == dump_b.structure  # else the original models are compared: verified then
        result.tensors = compare_tensors(dump_a, dump_b, None if same_graph else a.ran_model(),
                                         None if same_graph else b.ran_model(), result.tolerance, focus)
        if result.tensors.raw_missing:
            keys = result.tensors.raw_missing
            result.capture = [capture_command(a, keys), capture_command(b, keys)]
    elif a.has_dump or b.has_dump:
        result.notes.append("only one run has a tensor dump; rerun the other with --dump to compare tensors")
    else:
        result.notes.append("no tensor dumps; rerun both with `qconsist run ... --dump` to find the first diverging node")


def _inference(a: Run, b: Run, result: DiffResult) -> None:
    """Final outputs, accuracy and tensors of two inference runs."""
    predicted = _predictions(a, b)
    judgements = []
    if list(a.inference.outputs) == list(b.inference.outputs):
        try:
            judgements = [OutputJudgement(t) for t in output_targets(b) if t.output in a.inference.outputs]
        except QconsistError as exc:
            result.notes.append(f"the outputs are not judged by kind: {exc.message}")
    result.outputs, result.output_stats = _outputs(a, b, result.tolerance, predicted, judgements)
    result.judged = [j.to_json() for j in judgements]
    flipped = np.flatnonzero(predicted[0].classes != predicted[1].classes) if predicted is not None else np.zeros(0)
    _tensors(a, b, result, flipped[:SAMPLES_KEPT].tolist())
    if predicted is not None:
        names = read_samples(a).names
        why = cause(result.artifacts.first_differing_stage, bool(result.calibration.changed), result.options,
                    (a.inference.batch_size, b.inference.batch_size), result.versions.numerics)
        result.accuracy = compare_predictions(predicted[0].counter.output, *predicted, names, result.tensors, why)


def diff_runs(run_a: Run | Path | str, run_b: Run | Path | str, tolerance: Tolerance = Tolerance()) -> DiffResult:
    """Compare two complete run directories in the order artifacts → calibration → tensors → outputs.

    ``tolerance`` (default exact): tensors and final outputs are judged against ``atol + rtol·|a|`` (per
    node where it says so) instead of bit for bit."""
    a = run_a if isinstance(run_a, Run) else Run.open(run_a)
    b = run_b if isinstance(run_b, Run) else Run.open(run_b)
    inputs_note = _check_comparable(a, b)
    result = DiffResult(
        run_a=str(a.path), run_b=str(b.path), same_run=a.same_as(b),
        artifacts=compare_artifacts(a, b),
        calibration=compare_calibration(a, b),
        tensors=None, outputs=None,
        environment=describe_changes(a.manifest.environment, b.manifest.environment),
        versions=compare_environments(a.manifest.environment, b.manifest.environment),
        tolerance=tolerance,
    )
    if inputs_note:
        result.notes.append(inputs_note)
    if a.has_inference and b.has_inference and a.inference.options and b.inference.options:
        result.options = describe_changes(a.inference.options, b.inference.options)
    if a.kind == b.kind == "inference":
        _inference(a, b, result)
    elif a.kind != b.kind:
        result.notes.append(f"{_a(a.kind)} run and {_a(b.kind)} run: artifacts and calibration compared")
    origins = {n.label for n in result.tensors.origins} if result.tensors is not None else set()
    spans = ({inside: span.label for span in result.tensors.spans for inside in (*span.span, span.label)}
             if result.tensors is not None else {})
    result.engines, notes = compare_engines(a, b, origins, spans)
    result.notes += notes
    if result.same_run:
        result.notes.insert(0, f"A and B are the same run ({a.run_id}): a run compared with itself is identical by "
                               "construction; compare two runs to learn something")
    return result
