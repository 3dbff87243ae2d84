"""Repeat non-determinism and algorithm sensitivity, measured with observing sessions.

* ``ReferenceRuns``: one observing session per configuration (the reference session of that config) and
  the hashes of every tensor it produced for every sample — a few bytes per tensor, nothing else kept.
* ``repeat_phase``: for each configuration, K-1 more fresh sessions; each sample's tensors are hashed and
  compared with the reference session's hashes; when something differs, the reference session is run
  again on that sample so the difference can be measured (``PairComparison``) — then both are dropped.
* ``run_to_run``: the reference session of each configuration runs every sample again, ``runs - 1`` more
  times: a tensor that changes between two runs of *one* session comes from a kernel that is not
  deterministic at all (atomics), a stronger finding than a difference between fresh sessions (which a
  per-session algorithm pick also explains).
* ``compare_configs``: the reference sessions of all configurations run on each sample in turn and the
  pairs asked for are compared on the fly (reference config vs each other, TF32 on vs off).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from qconsist.errors import ConfigError
from qconsist.locate.comparison import PairComparison, PairResult
from qconsist.locate.observe import Observation, Observer
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

Sample = dict[str, np.ndarray]


@dataclass
class ReferenceRuns:
    """Per config: its observer, its reference session, and per sample the hashes that session produced."""

    observers: dict[str, Observer]
    sessions: dict[str, Any]
    hashes: dict[str, list[dict[str, int]]]

    @classmethod
    def collect(cls, observers: Mapping[str, Observer], samples: Sequence[Sample],
                progress: Progress = NULL_PROGRESS) -> "ReferenceRuns":
        sessions, hashes = {}, {}
        with progress.task("reference sessions", len(observers) * len(samples)) as handle:
            for label, observer in observers.items():
                session = observer.fresh_session()
                sessions[label] = session
                rows = []
                for sample in samples:
                    rows.append(Observer.observe(session, sample).hashes)
                    handle.advance()
                hashes[label] = rows
        return cls(dict(observers), sessions, hashes)


@serialized(derived=("stable", "origins"))
@dataclass(frozen=True)
class RepeatOutcome:
    """K fresh sessions of one config in one phase (``quiet`` or ``contention``), or K runs of its reference
    session (``run-to-run``)."""

    config: str
    phase: str
    sessions: int  # the reference session included (run-to-run: the runs of the one session, the first included)
    differing_sessions: tuple[int, ...]  # indices (0 = the reference) of the sessions / runs that differed from it
    comparisons: tuple[PairResult, ...]  # one per differing session

    @property
    def stable(self) -> bool:
        return not self.differing_sessions

    @property
    def origins(self) -> list[str]:
        seen: dict[str, None] = {}
        for result in self.comparisons:
            for node in result.origins:
                seen.setdefault(node.label)
        return list(seen)


def _same(hashes: Mapping[str, int], observation: Observation) -> bool:
    return all(observation.hashes.get(name) == value for name, value in hashes.items())


def repeat_config(label: str, references: ReferenceRuns, samples: Sequence[Sample], repeats: int,
                  phase: str, handle: Any) -> RepeatOutcome:
    """``repeats`` sessions of one config in all: the reference one and ``repeats - 1`` fresh ones."""
    observer = references.observers[label]
    differing: list[int] = []
    results: list[PairResult] = []
    for index in range(1, repeats):
        session = observer.fresh_session()
        comparison: PairComparison | None = None
        for s, sample in enumerate(samples):
            observation = Observer.observe(session, sample)
            reference_hashes = references.hashes[label][s]
            if _same(reference_hashes, observation):
                if comparison is not None:
                    comparison.add_identical(s)
                handle.advance()
                continue
            if comparison is None:
                comparison = PairComparison(observer.graph, f"{label} session 0", f"{label} session {index}")
                for earlier in range(s):  # the samples before were identical
                    comparison.add_identical(earlier)
            again = Observer.observe(references.sessions[label], sample)
            comparison.add(s, again.arrays, observation.arrays, (again.hashes, observation.hashes))
            handle.advance()
        del session
        if comparison is not None:
            differing.append(index)
            results.append(comparison.finish())
            log.info("%s: session %d differs from session 0 (%s)", label, index, phase)
    return RepeatOutcome(label, phase, repeats, tuple(differing), tuple(results))


def repeat_phase(references: ReferenceRuns, samples: Sequence[Sample], repeats: int, phase: str,
                 progress: Progress = NULL_PROGRESS) -> list[RepeatOutcome]:
    """Every config's fresh sessions compared with its reference session."""
    if repeats < 2:
        raise ConfigError(f"repeats must be >= 2 (a reference session and at least one fresh one), got {repeats}")
    labels = list(references.observers)
    with progress.task(f"repeats ({phase})", len(labels) * (repeats - 1) * len(samples)) as handle:
        return [repeat_config(label, references, samples, repeats, phase, handle) for label in labels]


def run_to_run(references: ReferenceRuns, samples: Sequence[Sample], runs: int,
               progress: Progress = NULL_PROGRESS) -> list[RepeatOutcome]:
    """Per config: its reference session run ``runs`` times in all on every sample (phase ``run-to-run``;
    ``sessions`` counts the runs, ``differing_sessions`` the 1-based runs that differed from the first)."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ConfigError(f"`session_runs` must be a whole number >= 2 (runs of one session compared), got {runs!r}")
    outcomes = []
    labels = list(references.observers)
    with progress.task("runs within one session", len(labels) * (runs - 1) * len(samples)) as handle:
        for label in labels:
            session = references.sessions[label]
            graph = references.observers[label].graph
            differing: list[int] = []
            results: list[PairResult] = []
            for index in range(1, runs):
                comparison: PairComparison | None = None
                for s, sample in enumerate(samples):
                    observation = Observer.observe(session, sample)
                    handle.advance()
                    if _same(references.hashes[label][s], observation):
                        if comparison is not None:
                            comparison.add_identical(s)
                        continue
                    if comparison is None:
                        comparison = PairComparison(graph, f"{label} run {index + 1}", f"{label} the run after it")
                        for earlier in range(s):
                            comparison.add_identical(earlier)
                    # the first run's tensors are not kept: the difference is measured between this run and
                    # the next one of the same session, which differs again when the kernel is not deterministic
                    again = Observer.observe(session, sample)
                    comparison.add(s, observation.arrays, again.arrays, (observation.hashes, again.hashes))
                if comparison is not None:
                    differing.append(index)
                    results.append(comparison.finish())
                    log.info("%s: run %d of one session differs from its first run", label, index + 1)
            outcomes.append(RepeatOutcome(label, "run-to-run", runs, tuple(differing), tuple(results)))
    return outcomes


def compare_configs(references: ReferenceRuns, samples: Sequence[Sample], pairs: Sequence[tuple[str, str]],
                    progress: Progress = NULL_PROGRESS) -> list[PairResult]:
    """Each pair (a, b) of configs compared on every sample, reference sessions against each other."""
    if not pairs:
        return []
    labels = list(dict.fromkeys(label for pair in pairs for label in pair))
    graph = references.observers[pairs[0][0]].graph
    comparisons = [PairComparison(graph, a, b) for a, b in pairs]
    with progress.task("comparing configurations", len(samples)) as handle:
        for s, sample in enumerate(samples):
            seen = {label: Observer.observe(references.sessions[label], sample) for label in labels}
            for (a, b), comparison in zip(pairs, comparisons):
                comparison.add(s, seen[a].arrays, seen[b].arrays, (seen[a].hashes, seen[b].hashes))
            del seen
            handle.advance()
    return [c.finish() for c in comparisons]
