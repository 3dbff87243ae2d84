"""``LocateReport``: what ``qconsist locate`` found, as an object with a verdict and a versioned JSON form.

Sections:

* ``configs``: per configuration its settings, latency, faithfulness of the observation, and its repeat
  outcomes (quiet GPU, and under contention when asked);
* ``comparisons``: the pairs of configurations compared (reference vs each; TF32 on vs off per search mode);
* ``tf32``: ``NVIDIA_TF32_OVERRIDE`` as seen, and per search mode the origin nodes TF32 changes;
* ``recommendation``: the fastest bit-stable configuration and its cost;
* ``calibration`` / ``fp16``: optional sections written by those analyses.

``passed``: a bit-stable configuration exists within the accepted cost, and the optional analyses passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qconsist.errors import RunStoreError
from qconsist.locate.calibration import GpuCalibrationReport
from qconsist.locate.comparison import NodeDifference, PairResult
from qconsist.locate.config import Tf32Override
from qconsist.locate.contention import LoadSummary
from qconsist.locate.fp16 import Fp16Report
from qconsist.locate.decision import Recommendation, cost
from qconsist.inference.engines import EngineRecord
from qconsist.locate.latency import LatencyStats, PairedCost, paired_ratios
from qconsist.locate.repeats import RepeatOutcome
from qconsist.store.serde import serialized

SCHEMA = "qconsist.locate/1"


@serialized(derived=("stable",))
@dataclass(frozen=True)
class ConfigReport:
    label: str
    settings: dict[str, Any]  # ExecutionOptions.to_json()
    latency: LatencyStats | None
    faithful: dict[str, Any]  # FaithfulCheck.to_json(): observed final outputs vs production
    repeats: tuple[RepeatOutcome, ...]

    @property
    def stable(self) -> bool:
        return all(r.stable for r in self.repeats)

    def repeat(self, phase: str) -> RepeatOutcome | None:
        return next((r for r in self.repeats if r.phase == phase), None)


@serialized
@dataclass(frozen=True)
class SensitiveNode:
    """An origin node: where outputs first change, between sessions (repeat) or configurations (algorithm)."""

    label: str
    op_type: str
    why: str  # "repeat" | "algorithm" | "tf32"
    between: tuple[str, ...]  # "A vs B" descriptions of the comparisons where it is an origin
    differing: int  # its differing output elements in its origin samples (the largest comparison)
    elements: int
    greatest_abs: float  # in its origin samples
    int8_downstream: int
    samples: int = 0  # samples in which it is an origin


def sensitive_nodes(results: list[tuple[str, PairResult]]) -> list[SensitiveNode]:
    """Origin nodes over several comparisons, merged by node label; the largest difference is kept."""
    merged: dict[tuple[str, str], tuple[NodeDifference, list[str]]] = {}
    order: list[tuple[str, str]] = []
    for why, result in results:
        for node in result.origins:
            key = (why, node.label)
            description = f"{result.reference} vs {result.other}"
            if key not in merged:
                merged[key] = (node, [description])
                order.append(key)
            else:
                best, seen = merged[key]
                seen.append(description)
                if node.origin_stats[1] > best.origin_stats[1]:
                    merged[key] = (node, seen)
    found = []
    for key in order:
        node, between = merged[key]
        greatest, differing, elements = node.origin_stats
        found.append(SensitiveNode(
            label=node.label, op_type=node.op_type, why=key[0], between=tuple(between), differing=differing,
            elements=elements, greatest_abs=greatest, int8_downstream=node.int8_downstream,
            samples=len(node.origin_samples),
        ))
    return found


@serialized(derived=("cost_vs_original", "stable_configs"))
@dataclass(frozen=True)
class RewriteAlternative:
    """The model with its unstable nodes rewritten, measured under the same configurations."""

    rewritten: tuple[str, ...]  # "node (form)"
    refused: tuple[str, ...]  # "node: reason"
    check_max_abs: float  # determinize's check on seeded inputs
    outputs_max_abs: float  # final outputs on locate's inputs, original vs rewritten (CPU)
    top1_agree: int
    samples: int
    configs: tuple[ConfigReport, ...]
    recommendation: Recommendation | None
    original_fastest: str
    original_fastest_ms: float

    @property
    def cost_vs_original(self) -> float | None:
        """The recommended rewritten config's median over the original model's fastest configuration."""
        rec = self.recommendation
        if rec is None or rec.median_ms is None or not self.original_fastest_ms:
            return None
        return rec.median_ms / self.original_fastest_ms

    @property
    def stable_configs(self) -> tuple[str, ...]:
        return tuple(c.label for c in self.configs if c.stable)


@serialized
@dataclass(frozen=True)
class NoAlternative:
    """Why no rewrite was measured although a rewritable-looking node varied."""

    reason: str


@serialized
@dataclass(frozen=True)
class Tf32Pair:
    """A configuration with TF32 on against its twin with TF32 off: whether TF32 changed anything, and where."""

    tf32_on: str
    tf32_off: str
    identical: bool
    first_node: str | None
    origins: tuple[str, ...]  # the origin nodes TF32 changes
    greatest_output_difference: float


@serialized
@dataclass(frozen=True)
class Tf32Section:
    """``NVIDIA_TF32_OVERRIDE`` as seen, and per search mode the TF32 pair compared."""

    override: Tf32Override
    pairs: tuple[Tf32Pair, ...] = ()


@serialized(
    schema=SCHEMA, derived=("passed",), error=RunStoreError,
    refused="not a locate report (schema {found!r}, expected {schema!r})",
    malformed="locate report is missing or has an invalid field: {exc}",
)
@dataclass
class LocateReport:
    model: dict[str, Any]
    inputs: dict[str, Any]
    device: dict[str, Any]
    reference: str  # the reference configuration's label
    repeats: int
    contention: LoadSummary | None  # when --contention ran
    configs: list[ConfigReport]
    comparisons: list[PairResult]
    tf32: Tf32Section
    recommendation: Recommendation | None  # None when the configuration matrix did not run (fp16 only)
    nodes: list[SensitiveNode] = field(default_factory=list)
    calibration: GpuCalibrationReport | None = None
    fp16: Fp16Report | None = None
    seconds: float = 0.0
    kinds: list[str] = field(default_factory=list)  # why each comparison was made: "algorithm" | "tf32"
    engines: list[EngineRecord] = field(default_factory=list)  # per config: the cuDNN engine of each conv per run
    engine_errors: dict[str, str] = field(default_factory=dict)  # per config: why no engine record
    alternative: RewriteAlternative | NoAlternative | None = None  # the rewrite of the unstable nodes, measured

    @property
    def passed(self) -> bool:
        """A bit-stable config within the accepted cost (when the matrix ran), no NaN/Inf/overflow in float16
        (when asked), every GPU calibration the same model (when asked)."""
        return (
            (self.recommendation is None or self.recommendation.passed)
            and (self.fp16 is None or self.fp16.passed)
            and (self.calibration is None or self.calibration.passed)
        )

    def __bool__(self) -> bool:
        return self.passed

    def config(self, label: str) -> ConfigReport:
        for cfg in self.configs:
            if cfg.label == label:
                return cfg
        raise KeyError(label)

    @property
    def fastest_latency(self) -> LatencyStats | None:
        """The latency of the fastest configuration (the recommendation's ``fastest``); None where unmeasured."""
        rec = self.recommendation
        return next((c.latency for c in self.configs if rec is not None and c.label == rec.fastest), None)

    def paired(self, latency: LatencyStats) -> PairedCost | None:
        """``latency``'s paired ratios to the fastest configuration's, where both were timed side by side."""
        fastest = self.fastest_latency
        return paired_ratios(latency.rounds_ms, fastest.rounds_ms if fastest is not None else None,
                             str(self.recommendation.fastest) if self.recommendation is not None else "")

    def cost(self, label: str) -> float | None:
        """A configuration's cost against the fastest (``qconsist.locate.decision.cost``): the median of its paired
        ratios where the two were timed side by side, else the ratio of the medians; None where unmeasured."""
        rec = self.recommendation
        latency = self.config(label).latency
        if rec is None or latency is None or not rec.fastest_ms:
            return None
        return cost(latency.median_ms, rec.fastest_ms, self.paired(latency))
