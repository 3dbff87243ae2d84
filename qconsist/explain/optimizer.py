"""``qconsist explain RUN_A RUN_B``: which of onnxruntime's graph transformers makes two runs diverge.

Two inference runs with dumps of one model on one input set, in one environment, that differ only in the
graph optimization level (or in the transformers switched off) diverge from some node on. The run with the
more optimizations is re-run with transformers switched off (``disabled_optimizers``) until the first
diverging tensor is bit-identical to the other run's again:

1. ask onnxruntime which transformers changed the graph in the optimized configuration and were not applied
   in the reference one (``transformer_activity``: its verbose log, so the names are this version's);
2. probe with all of them switched off: if the first diverging tensor still differs, no transformer explains
   it (say so and stop);
3. otherwise find a 1-minimal set whose switching off makes it identical (``minimal_set``: delta debugging,
   about 2·log2(candidates) probes for one culprit); the last such probe is the verification;
4. tell which nodes that set rewrote: the optimized graph with the set switched off against the optimized run's
   (``graph_rewrites``), and the node that computes the first diverging tensor with and without it.

A probe is a real faithful dump run (``run_inference`` with ``--dump``: three sessions, optimize, dump and
production) in a scratch folder, compared with the reference run's dump by the diff's own tensor comparison.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnxruntime

from qconsist.diff import capture_command, diff_runs
from qconsist.diff.tensors import TensorComparison, compare_tensors, tensor_keys
from qconsist.cpu import instruction_set
from qconsist.environment import compare_environments, fingerprint
from qconsist.errors import ConfigError, RunStoreError
from qconsist.explain.bisect import minimal_set
from qconsist.explain.replay import replay_inputs
from qconsist.inputs.digest import XXH3, digest_kind
from qconsist.explain.graph_changes import (
    GraphRewrites, ProducingNode, graph_rewrites, load_graph, nearest_rewritten, producing_node,
)
from qconsist.explain.transformers import TransformerActivity, transformer_activity
from qconsist.inference.model import ModelSource
from qconsist.inference.reader import LoadedDump, load_dump
from qconsist.inference.runner import RunRequest, run_inference
from qconsist.inference.session import ExecutionOptions, OptimizationLevel
from qconsist.inputs import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.run import Run
from qconsist.store.serde import serialized
from qconsist.store.scratch import scratch_dir

log = logging.getLogger(__name__)
SCHEMA = "qconsist.explain/1"
SESSIONS_PER_PROBE = 3  # the dump's optimizing session, its dumping session, the production session
_RANK = {level: rank for rank, level in enumerate(OptimizationLevel)}


@serialized(derived=("vanished",))
@dataclass
class Probe:
    """One re-run of the optimized configuration with some transformers switched off, against the reference."""

    disabled: list[str]
    target_diverges: bool  # the first diverging tensor (or, where the probe's graph hides it, any tensor) differs
    observed: str  # "target" or "any tensor"
    diverging: int  # tensors that differ from the reference run
    compared: int
    first: str | None  # the probe's own first diverging node
    seconds: float
    first_key: str | None = None

    @property
    def vanished(self) -> bool:
        return not self.target_diverges


@serialized(
    schema=SCHEMA, derived=("passed",), error=RunStoreError,
    refused="explain result schema {found!r} is not {schema!r}", malformed="explain result is malformed: {exc}",
)
@dataclass
class OptimizerExplanation:
    """Which transformers make the optimized run diverge from the reference run. ``passed`` (and truth):
    the divergence is explained (or there is none)."""

    reference_run: str
    optimized_run: str
    reference_options: dict[str, Any]
    optimized_options: dict[str, Any]
    onnxruntime: str
    target: str | None = None  # first diverging node (label) of the diff
    target_key: str | None = None  # the tensor compared
    diverging: int = 0  # tensors diverging in the diff
    compared: int = 0
    candidates: list[TransformerActivity] = field(default_factory=list)
    responsible: list[str] = field(default_factory=list)  # the minimal set, in onnxruntime's order
    explained: bool = False
    verification: Probe | None = None  # the optimized run with only ``responsible`` switched off
    with_all_disabled: Probe | None = None
    rewrites: GraphRewrites | None = None  # optimized graph without ``responsible`` -> with it
    target_with: ProducingNode | None = None  # the node computing the target in the optimized run
    target_without: ProducingNode | None = None  # ... with ``responsible`` switched off
    rewritten: list[ProducingNode] = field(default_factory=list)  # nodes the set produced, nearest upstream of the target
    replaced: list[ProducingNode] = field(default_factory=list)  # the nodes they stand for (set switched off)
    probes: list[Probe] = field(default_factory=list)
    reproduce: str | None = None  # the qconsist run command of the optimized run with ``responsible`` switched off
    sessions: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    instruction_set: dict[str, Any] = field(default_factory=dict)  # where the sessions ran (qconsist.cpu.InstructionSet)

    @property
    def passed(self) -> bool:
        return self.target is None or self.explained

    def __bool__(self) -> bool:
        return self.passed


def _inference_options(run: Run) -> ExecutionOptions:
    if run.kind != "inference":
        raise RunStoreError(f"run {run.path} is {run.kind!r}, not an inference run; explain compares two `qconsist run --dump` runs")
    if not run.has_dump:
        raise RunStoreError(f"run {run.path} has no tensor dump; rerun it with `qconsist run ... --dump`")
    return ExecutionOptions.from_json(run.inference.options)


def _only_optimization_differs(a: ExecutionOptions, b: ExecutionOptions) -> None:
    same_a = replace(a, graph_optimization_level=OptimizationLevel.ALL, disabled_optimizers=())
    same_b = replace(b, graph_optimization_level=OptimizationLevel.ALL, disabled_optimizers=())
    if same_a != same_b:
        differ = [k for k, v in same_a.to_json().items() if same_b.to_json().get(k) != v]
        raise ConfigError(
            f"the runs also differ in {', '.join(differ)}: explain switches graph transformers on and off, so the runs "
            "must differ only in the optimization level or the transformers switched off; compare them with qconsist diff"
        )
    if a == b:
        raise ConfigError("the runs ran with the same execution options: there is no optimization difference to explain")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model(a: Run, b: Run) -> Path:
    path_a, path_b = a.path, b.path
    sha_a = (a.manifest.model.get("artifact") or {}).get("sha256")
    sha_b = (b.manifest.model.get("artifact") or {}).get("sha256")
    if not sha_a or sha_a != sha_b:
        raise RunStoreError(f"runs {path_a} and {path_b} ran different model files; explain needs one model run two ways")
    model = Path(a.manifest.model.get("path", ""))
    if not model.is_file():
        raise RunStoreError(f"the model of run {path_a} ({model}) is gone; explain re-runs it")
    if _sha256(model) != sha_a:
        raise RunStoreError(f"the model {model} changed since run {path_a} was made; explain re-runs the model the runs ran")
    return model


def _same_environment(a: Run, b: Run) -> None:
    path_a, path_b = a.path, b.path
    between = compare_environments(a.manifest.environment, b.manifest.environment).numerics
    if between:
        raise RunStoreError(
            f"runs {path_a} and {path_b} ran in different environments ({'; '.join(map(str, between))}); explain "
            "bisects one onnxruntime's transformers (for an upgrade: qconsist upgrade-check)"
        )
    here = compare_environments(a.manifest.environment, fingerprint()).numerics
    if here:
        emulated = (a.manifest.environment.get("cpu_isa") or {}).get("emulated")
        where = (f"under the processor they were made on: `isa` {emulated}" if emulated else
                 "where the runs were made" + (" (natively: without `isa`)" if instruction_set().emulated else ""))
        raise RunStoreError(
            f"run {path_a} was made in another environment than this one ({'; '.join(map(str, here))}); explain "
            f"re-runs the model, so run it {where}"
        )


class _Prober:
    """Probes of the optimized configuration with transformers switched off, as real dump runs in a scratch
    folder, each compared with the reference dump."""

    def __init__(self, model: Path, inputs: InputSet, options: ExecutionOptions, reference: LoadedDump,
                 target_key: str, scratch: Path, progress: Progress) -> None:
        self.model, self.inputs, self.options, self.reference = model, inputs, options, reference
        self.target_key, self.scratch, self.progress = target_key, scratch, progress
        self.probes: list[Probe] = []
        self.dumps: dict[tuple[str, ...], LoadedDump] = {}
        self.handle: Any = None  # the progress task, advanced once per probe

    def __call__(self, disabled: tuple[str, ...]) -> Probe:
        key = tuple(sorted(disabled))
        for probe in self.probes:
            if tuple(probe.disabled) == key:
                return probe
        start = time.perf_counter()
        options = replace(self.options, disabled_optimizers=(*self.options.disabled_optimizers, *key))
        result = run_inference(ModelSource(self.model), self.inputs, RunRequest(options=options, dump=True), self.scratch,
                               run_id=f"probe-{len(self.probes):03d}")
        dump = load_dump(Run.open(result.run_dir))
        comparison: TensorComparison = compare_tensors(self.reference, dump, self.model, self.model)
        keys = tensor_keys(dump, comparison.space)
        diverging = {n.key for n in comparison.nodes}
        observed = "target" if self.target_key in keys else "any tensor"
        differs = self.target_key in diverging if observed == "target" else bool(diverging)
        probe = Probe(list(key), differs, observed, len(comparison.nodes), comparison.compared,
                      comparison.first.label if comparison.first is not None else None, time.perf_counter() - start,
                      comparison.first.key if comparison.first is not None else None)
        log.info("probe %d: disabled %s -> target %s", len(self.probes), ", ".join(key) or "none",
                 "diverges" if differs else "identical")
        self.probes.append(probe)
        self.dumps[key] = dump
        if self.handle is not None:
            self.handle.advance()
        return probe


def _reference_first(a: Run, b: Run) -> tuple[Path, Run, ExecutionOptions, Run, ExecutionOptions]:
    """The model two runs ran, checked to differ in their optimization only, and the runs as ``(reference, its
    options, optimized, its options)``: the optimized side runs the higher level, or at one level has fewer
    transformers switched off."""
    options_a, options_b = _inference_options(a), _inference_options(b)
    _only_optimization_differs(options_a, options_b)
    model = _model(a, b)
    _same_environment(a, b)
    rank_a = (_RANK[options_a.graph_optimization_level], -len(options_a.disabled_optimizers))
    rank_b = (_RANK[options_b.graph_optimization_level], -len(options_b.disabled_optimizers))
    if rank_a > rank_b:
        return model, b, options_b, a, options_a
    return model, a, options_a, b, options_b


def _inputs_of(run: Run, model: Path, inputs: InputSet | None) -> tuple[InputSet, Any]:
    """The input set ``run`` ran on (opened again from its manifest, or ``inputs`` checked against its digest)
    and the subset of it the run used."""
    if inputs is None:
        return replay_inputs(run, model)
    if inputs.digest(digest_kind(run.manifest.inputs.get("digest")) or XXH3) != run.manifest.inputs.get("digest"):
        raise RunStoreError(f"the `inputs` given are not the input set of run {run.path} (their digest differs)")
    return inputs, None


def _where_rewritten(result: OptimizerExplanation, without: Any, optimized: Any, target_key: str) -> None:
    """What the responsible transformers rewrote, and the rewritten nodes nearest the target with them and
    without them (``without``: the dump with them switched off, ``optimized``: the optimized run's)."""
    without_graph = load_graph(without.optimized_path, "optimized graph")
    optimized_graph = load_graph(optimized.optimized_path, "optimized graph")
    result.rewrites = graph_rewrites(without_graph, optimized_graph, f"{', '.join(result.responsible)} switched off",
                                     "optimized run")
    result.target_with = producing_node(optimized.tensors, target_key)
    result.target_without = producing_node(without.tensors, target_key)
    if result.target_with is not None:
        result.rewritten = nearest_rewritten(optimized_graph, result.target_with.node, result.rewrites.added,
                                             optimized.tensors)
    if result.target_without is not None:
        result.replaced = nearest_rewritten(without_graph, result.target_without.node, result.rewrites.removed,
                                            without.tensors)


def _probe_transformers(result: OptimizerExplanation, names: list[str], probe: _Prober, optimized_run: Run,
                        optimized_dump: Any, subset: Any) -> None:
    """All the candidates switched off, then the smallest set of them whose switching off makes the target
    identical, verified, with the command that reproduces it and where they rewrote the graph."""
    result.with_all_disabled = probe(tuple(names))
    if result.with_all_disabled.target_diverges:
        result.notes.append(
            f"with all {len(names)} transformers that changed the graph switched off, {result.target} still "
            "diverges: the difference is not a graph transformer's (the optimization level also picks kernels)")
        return
    chosen = set(minimal_set(names, lambda subset: probe(subset).vanished))
    result.responsible = [n for n in names if n in chosen]
    result.verification = probe(tuple(result.responsible))
    result.explained = result.verification.vanished
    result.reproduce = capture_command(optimized_run, None, tuple(result.responsible), subset)
    _where_rewritten(result, probe.dumps[tuple(sorted(result.responsible))], optimized_dump, probe.target_key)


def explain_optimization(
    run_a: Path | str, run_b: Path | str, inputs: InputSet | None = None, progress: Progress = NULL_PROGRESS,
) -> OptimizerExplanation:
    """Name the graph transformers that make two runs diverge (see the module docstring).

    ``inputs``: the input set the runs ran on (default: opened again from the run's manifest; its digest
    must match). Raises ``RunStoreError``/``ConfigError`` (one line) for runs that cannot be explained so.
    """
    started = time.perf_counter()
    model, a, reference, b, optimized = _reference_first(Run.open(run_a), Run.open(run_b))
    result = OptimizerExplanation(str(a.path), str(b.path), reference.to_json(), optimized.to_json(),
                                  onnxruntime.__version__, instruction_set=instruction_set().to_json())
    tensors = diff_runs(a, b).tensors
    if tensors is None or tensors.first is None:
        result.notes.append("the runs' tensors are bit-identical: nothing to explain")
        result.seconds = time.perf_counter() - started
        return result
    target = tensors.first
    result.target, result.target_key = target.label, target.key
    result.diverging, result.compared = len(tensors.nodes), tensors.compared
    inputs, subset = _inputs_of(a, model, inputs)
    applied = transformer_activity(model, optimized)
    baseline = set(transformer_activity(model, reference).names)
    result.sessions += 2
    result.candidates = [t for t in applied.transformers if t.modified and t.name not in baseline]
    names = [t.name for t in result.candidates]
    reference_dump, optimized_dump = load_dump(a), load_dump(b)
    with scratch_dir("qconsist-explain-") as scratch:
        probe = _Prober(model, inputs, optimized, reference_dump, target.key, Path(scratch), progress)
        if not names:
            result.notes.append("onnxruntime applied no graph transformer in the optimized run that the reference run "
                                "did not apply: the difference is not a transformer's")
        else:
            with progress.task("explain: probing transformers", None) as probe.handle:
                _probe_transformers(result, names, probe, b, optimized_dump, subset)
        result.probes = list(probe.probes)
    result.sessions += SESSIONS_PER_PROBE * len(result.probes)
    result.seconds = time.perf_counter() - started
    return result
