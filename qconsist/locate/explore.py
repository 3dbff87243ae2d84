"""``locate``: find the nodes whose outputs vary between fresh sessions or between configurations, measure
each configuration's latency, and recommend the fastest bit-stable configuration.

``locate()`` is the CUDA entry point (the configuration matrix of ``qconsist.locate.config``); it refuses to
run without a usable CUDA GPU (``UnavailableError``). ``explore()`` is the engine underneath, generic over
named execution options, so the same code measures real CPU configurations in the tests.

Steps, for every variant (a named set of execution options):

1. an ``Observer`` (ORT's optimized graph, every tensor exposed) and a reference session, whose tensor
   hashes per sample are kept;
2. repeats: K-1 fresh sessions per variant compared with the reference session (``repeats.py``);
3. comparisons: the reference variant vs each other one, and TF32 on vs off per search mode;
4. a production session per variant (the model as the application loads it): the latencies, timed side by
   side in rounds (``qconsist.locate.latency.side_by_side``), and its final outputs checked bit for bit against
   the observed ones (``FaithfulCheck``: the observation must not change what runs);
5. with ``contention``: the repeats again while ``GpuLoad`` keeps the GPU busy;
6. the recommendation (``decision.py``).

Steps 2 to 5 (and run-to-run, and the engine recording) are ``Phase`` strategies run the same way on a shared
``_Exploration``; ``explore_phases`` chooses them once from the request, so ``explore`` has no branch per step.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Protocol, Sequence

import numpy as np

from qconsist.errors import ConfigError, QconsistError
from qconsist.locate.comparison import PairResult
from qconsist.locate.contention import LoadSummary
from qconsist.locate.config import GpuConfig, Tf32Override, default_matrix, tf32_pairs, timing_based
from qconsist.locate.decision import DEFAULT_MAX_COST, ConfigOutcome, recommend
from qconsist.locate.latency import LatencyOptions, LatencyStats, side_by_side
from qconsist.locate.observe import Observer
from qconsist.locate.report import ConfigReport, LocateReport, Tf32Pair, Tf32Section, sensitive_nodes
from qconsist.locate.repeats import ReferenceRuns, RepeatOutcome, compare_configs, repeat_phase, run_to_run
from qconsist.inference.dump import FaithfulCheck
from qconsist.inference.session import ExecutionOptions, ort_logged, require_provider
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.locate.contention import GpuLoad
from qconsist.locate.alternative import measure_alternative, recommend_reports, wanted
from qconsist.inference.engines import EngineRecord, EngineRequest, record_engines

log = logging.getLogger(__name__)

Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class Variant:
    """One named way to run the model."""

    label: str
    options: ExecutionOptions
    timing_based: bool = False  # its kernel picks depend on timings (cuDNN EXHAUSTIVE)


@dataclass(frozen=True)
class Comparison:
    """A pair of variants to compare, and why: ``algorithm`` (reference vs another) or ``tf32``."""

    reference: str
    other: str
    why: str


@dataclass(frozen=True)
class LocateOptions:
    configs: tuple[GpuConfig, ...] = field(default_factory=lambda: tuple(default_matrix()))
    repeats: int = 4  # sessions per config, the reference one included
    contention: bool = False
    contention_workers: int = 1  # processes loading the GPU during the contention repeats
    latency: LatencyOptions = LatencyOptions()
    max_cost: float = DEFAULT_MAX_COST
    session_runs: int = 3  # runs of each reference session compared with its first (run-to-run); 1: off
    engines: bool = True  # record the cuDNN engine of every convolution per config and run (cuDNN's API log)
    engine_runs: int = 3
    rewrite: bool = True  # measure the determinize rewrite when a rewritable node varies and no fast config is stable

    def __post_init__(self) -> None:
        if isinstance(self.session_runs, bool) or not isinstance(self.session_runs, int) or self.session_runs < 1:
            raise ConfigError(f"`session_runs` must be a whole number >= 1 (1: no run-to-run phase), got {self.session_runs!r}")
        if not self.configs:
            raise ConfigError("locate needs at least one configuration")
        if not isinstance(self.repeats, int) or self.repeats < 2:
            raise ConfigError(f"`repeats` must be an integer >= 2 (fresh sessions per config), got {self.repeats!r}")
        if not isinstance(self.contention_workers, int) or not 1 <= self.contention_workers <= 16:
            raise ConfigError(f"`contention_workers` must be an integer from 1 to 16, got {self.contention_workers!r}")
        if not self.max_cost >= 1.0:
            raise ConfigError(f"`max_cost` must be >= 1.0 (a ratio to the fastest config), got {self.max_cost!r}")

    def to_json(self) -> dict:
        return {
            "configs": [c.label for c in self.configs], "repeats": self.repeats, "contention": self.contention,
            "contention_workers": self.contention_workers,
            "latency": {"warmup": self.latency.warmup, "runs": self.latency.runs}, "max_cost": self.max_cost,
            "session_runs": self.session_runs, "engines": self.engines, "engine_runs": self.engine_runs,
            "rewrite": self.rewrite,
        }


def gpu_variants(configs: Sequence[GpuConfig]) -> tuple[list[Variant], list[Comparison]]:
    """The variants of a CUDA configuration matrix, and the comparisons locate makes between them."""
    variants = [Variant(c.label, c.execution_options(), timing_based(c.algo_search)) for c in configs]
    comparisons: dict[tuple[str, str], Comparison] = {}
    reference = configs[0]
    for other in configs[1:]:
        only_tf32 = other.with_tf32(reference.tf32).label == reference.label
        comparisons[(reference.label, other.label)] = Comparison(reference.label, other.label,
                                                                 "tf32" if only_tf32 else "algorithm")
    for on, off in tf32_pairs(configs):
        comparisons.setdefault((on.label, off.label), Comparison(on.label, off.label, "tf32"))
    return variants, list(comparisons.values())


def _faithful(observer: Observer, reference_session: Any, production: Any, samples: Sequence[Sample]) -> dict:
    """The production session's final outputs against the observed ones, sample by sample (``FaithfulCheck``)."""
    check = FaithfulCheck()
    outputs = list(observer.graph.outputs)
    for s, sample in enumerate(samples):
        produced = production.run(outputs, dict(sample))
        observed = Observer.observe(reference_session, sample).outputs(outputs)
        check.add(s, [np.asarray(p) for p in produced], observed)
    return check.to_json()


class _Exploration:
    """What the phases of ``explore`` share: the reference runs they start from and what they found."""

    def __init__(self, variants: Sequence[Variant], references: ReferenceRuns, samples: Sequence[Sample],
                 repeats: int, progress: Progress) -> None:
        self.variants, self.references, self.samples, self.repeats, self.progress = (
            variants, references, samples, repeats, progress)
        self.outcomes: dict[str, list[RepeatOutcome]] = {v.label: [] for v in variants}
        self.results: list[PairResult] = []
        self.timings: dict[str, tuple[LatencyStats, dict]] = {}
        self.load_summary: LoadSummary | None = None

    def add(self, outcomes: Iterable[RepeatOutcome]) -> None:
        for outcome in outcomes:
            self.outcomes[outcome.config].append(outcome)


class Phase(Protocol):
    """One step of ``explore`` after the reference runs; ``name`` keys the seconds it took in ``phases``."""

    name: str

    def run(self, state: _Exploration) -> None:
        """Measure, and keep what was found in ``state``."""


@dataclass(frozen=True)
class RunToRun:
    """Each reference session runs every sample ``runs - 1`` more times."""

    runs: int
    name: str = "run-to-run"

    def run(self, state: _Exploration) -> None:
        state.add(run_to_run(state.references, state.samples, self.runs, state.progress))


@dataclass(frozen=True)
class Repeats:
    """Fresh sessions per variant compared with its reference session, on a quiet machine."""

    name: str = "repeats"

    def run(self, state: _Exploration) -> None:
        state.add(repeat_phase(state.references, state.samples, state.repeats, "quiet", state.progress))


@dataclass(frozen=True)
class Comparisons:
    """The reference sessions of the pairs of variants asked for, compared on every sample."""

    comparisons: Sequence[Comparison]
    name: str = "comparisons"

    def run(self, state: _Exploration) -> None:
        pairs = [(c.reference, c.other) for c in self.comparisons]
        state.results = compare_configs(state.references, state.samples, pairs, state.progress)


@dataclass(frozen=True)
class Latency:
    """Each variant's production session: the latencies, timed side by side (``side_by_side``: all the production
    sessions alive together, their timed runs in rounds, so a change of load weighs on every variant alike), then
    each session's outputs checked against the observed ones. The production sessions are released when the phase
    ends, before the contention phase loads the device."""

    options: LatencyOptions
    name: str = "latency"

    def run(self, state: _Exploration) -> None:
        references = state.references
        makers = [references.observers[v.label].production_session for v in state.variants]
        stats, sessions = side_by_side(makers, state.samples, self.options, state.progress)
        try:
            for v, latency, production in zip(state.variants, stats, sessions):
                state.timings[v.label] = latency, _faithful(references.observers[v.label], references.sessions[v.label],
                                                            production, state.samples)
        finally:
            sessions.clear()


@dataclass(frozen=True)
class Contention:
    """The repeats again while ``load`` keeps the device busy."""

    load: Callable[[], ContextManager[Any]]
    name: str = "contention"

    def run(self, state: _Exploration) -> None:
        with self.load() as worker:
            state.add(repeat_phase(state.references, state.samples, state.repeats, "contention", state.progress))
        state.load_summary = worker.summary


@dataclass(frozen=True)
class EachVariant:
    """``call(variant, observer)`` for each variant, before the observers close (the engine recording)."""

    call: Callable[[Variant, Observer], None]
    name: str = "engines"

    def run(self, state: _Exploration) -> None:
        for v in state.variants:
            self.call(v, state.references.observers[v.label])


def explore_phases(comparisons: Sequence[Comparison], latency: LatencyOptions = LatencyOptions(),
                   load: Callable[[], ContextManager[Any]] | None = None, session_runs: int = 1,
                   on_variant: Callable[[Variant, Observer], None] | None = None) -> list[Phase]:
    """The phases ``explore`` runs, in order: run-to-run (``session_runs`` >= 2), repeats, comparisons, latency,
    contention (with a ``load``), engines (with ``on_variant``)."""
    phases: list[Phase] = [RunToRun(session_runs)] if session_runs >= 2 else []
    phases += [Repeats(), Comparisons(comparisons), Latency(latency)]
    if load is not None:
        phases.append(Contention(load))
    if on_variant is not None:
        phases.append(EachVariant(on_variant))
    return phases


def _check_request(samples: Sequence[Sample], variants: Sequence[Variant], comparisons: Sequence[Comparison]) -> None:
    if not samples:
        raise ConfigError("locate needs at least one input sample")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"variant labels must be unique, got {labels}")
    for c in comparisons:
        if c.reference not in labels or c.other not in labels:
            raise ConfigError(f"comparison {c.reference} vs {c.other} names an unknown variant")


class _Laps:
    """The seconds each step took, into ``phases``."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.clock = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.clock, 3)
        self.clock = now


@ort_logged()  # one capture for all its sessions and runs
def explore(
    model_path: Path,
    samples: Sequence[Sample],
    variants: Sequence[Variant],
    comparisons: Sequence[Comparison],
    repeats: int,
    latency: LatencyOptions = LatencyOptions(),
    load: Callable[[], ContextManager[Any]] | None = None,
    max_cost: float = DEFAULT_MAX_COST,
    progress: Progress = NULL_PROGRESS,
    phases: dict[str, float] | None = None,
    session_runs: int = 1,
    on_variant: Callable[[Variant, Observer], None] | None = None,
) -> tuple[list[ConfigReport], list[PairResult], list[tuple[str, PairResult]], dict | None, Any]:
    """The engine: observe, repeat, compare, time and recommend. Returns the config reports, the comparison
    results, the tagged results for ``sensitive_nodes``, the load summary and the recommendation; ``phases``
    (when given) receives the seconds each step took. ``session_runs`` >= 2 also runs each reference session
    that many times (phase ``run-to-run``); ``on_variant`` is called with each variant and its observer
    before the observers close (the engine recording reads the optimized graph there)."""
    lap = _Laps({} if phases is None else phases)
    _check_request(samples, variants, comparisons)
    observers = {v.label: Observer(model_path, v.options) for v in variants}
    lap("plan")
    try:
        state = _Exploration(variants, ReferenceRuns.collect(observers, samples, progress), samples, repeats, progress)
        lap("reference")
        for phase in explore_phases(comparisons, latency, load, session_runs, on_variant):
            phase.run(state)
            lap(phase.name)
    finally:
        for observer in observers.values():
            observer.close()
    reports = [ConfigReport(v.label, v.options.to_json(), *state.timings[v.label], tuple(state.outcomes[v.label]))
               for v in variants]
    decision = recommend([
        ConfigOutcome(r.label, r.stable and r.faithful.get("faithful", False), r.latency.median_ms, v.timing_based,
                      load is not None, r.latency.p25_ms, r.latency.p75_ms, r.latency.rounds_ms)
        for r, v in zip(reports, variants)
    ], max_cost)
    tagged = [("run-to-run" if o.phase == "run-to-run" else "repeat", c)
              for r in reports for o in r.repeats for c in o.comparisons]
    tagged += [(c.why, result) for c, result in zip(comparisons, state.results)]
    return reports, state.results, tagged, state.load_summary, decision


def tf32_section(override: Tf32Override, comparisons: Sequence[Comparison], results: Sequence[PairResult]) -> Tf32Section:
    """Per TF32 pair: whether TF32 changed anything and the origin nodes it changes."""
    pairs = []
    for c, r in zip(comparisons, results):
        if c.why != "tf32":
            continue
        pairs.append(Tf32Pair(
            tf32_on=c.reference if "tf32=1" in c.reference else c.other,
            tf32_off=c.other if "tf32=1" in c.reference else c.reference,
            identical=r.identical, first_node=r.first_node, origins=tuple(n.label for n in r.origins),
            greatest_output_difference=r.effect.greatest_abs,
        ))
    return Tf32Section(override, tuple(pairs))


def _engine_recorder(samples: Sequence[Sample], runs: int, records: dict[str, EngineRecord], errors: dict[str, str],
                     progress: Progress) -> Callable[[Variant, Observer], None]:
    def record(variant: Variant, observer: Observer) -> None:
        request = EngineRequest(observer.model_path, variant.options, samples[0], runs)
        order = [n.name for n in observer.graph.nodes]
        labels = {n.name: n.label for n in observer.graph.nodes}
        try:
            records[variant.label] = record_engines(request, observer.plan.optimized_path, variant.label, order, labels)
        except QconsistError as exc:
            errors[variant.label] = str(exc)
            log.warning("%s: no engine record: %s", variant.label, exc)
    return record


@ort_logged()  # one capture for all its sessions and runs
def locate(
    model_path: Path,
    samples: Sequence[Sample],
    options: LocateOptions = LocateOptions(),
    model_info: dict | None = None,
    inputs_info: dict | None = None,
    progress: Progress = NULL_PROGRESS,
) -> LocateReport:
    """Run the configuration matrix on the CUDA EP. ``UnavailableError`` without a usable CUDA GPU."""
    device = require_provider("cuda")
    start = time.perf_counter()
    override = Tf32Override.from_environment()
    variants, comparisons = gpu_variants(options.configs)
    load = None
    if options.contention:
        load = partial(GpuLoad, workers=options.contention_workers)
    phases: dict[str, float] = {}
    engines: dict[str, EngineRecord] = {}
    engine_errors: dict[str, str] = {}
    recorder = _engine_recorder(samples, options.engine_runs, engines, engine_errors, progress) if options.engines else None
    reports, results, tagged, load_summary, decision = explore(
        model_path, samples, variants, comparisons, options.repeats, options.latency, load, options.max_cost, progress,
        phases, session_runs=options.session_runs, on_variant=recorder,
    )
    nodes = sensitive_nodes(tagged)
    alternative = None
    if options.rewrite and wanted(nodes, decision):
        timing = {v.label: v.timing_based for v in variants}

        def explore_rewritten(path: Path):
            rewritten, _, _, _, _ = explore(path, samples, variants, [], options.repeats, options.latency, None,
                                            options.max_cost, progress, session_runs=options.session_runs)
            return rewritten, recommend_reports(rewritten, timing, options.max_cost)

        clock = time.perf_counter()
        alternative = measure_alternative(model_path, samples, decision, explore_rewritten)
        phases["rewrite"] = round(time.perf_counter() - clock, 3)
    return LocateReport(
        model=model_info or {"path": str(model_path)}, inputs=inputs_info or {"count": len(samples)},
        device={**device.to_json(), "options": options.to_json(), "phase_seconds": phases}, reference=variants[0].label,
        repeats=options.repeats, contention=load_summary, configs=reports, comparisons=results,
        tf32=tf32_section(override, comparisons, results), recommendation=decision, nodes=nodes,
        seconds=time.perf_counter() - start, kinds=[c.why for c in comparisons],
        engines=[engines[v.label] for v in variants if v.label in engines], engine_errors=engine_errors,
        alternative=alternative,
    )
