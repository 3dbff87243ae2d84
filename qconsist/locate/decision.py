"""The recommendation: the fastest configuration that stayed bit-stable in every repeat, and its cost.

Inputs are measurements, one ``ConfigOutcome`` per configuration: was every fresh session bit-identical to
the first (in each phase run: quiet GPU, and under contention when asked), and its median latency. The cost
is the recommended median over the fastest median of all configurations; ``max_cost`` (explicit, recorded)
is what the user accepts — the real case accepted under 5 %.

``acceptance`` is the one rule that accepts a bit-stable configuration's latency, for locate's recommendation
and for the gate's check of a pinned configuration alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from qconsist.errors import ConfigError
from qconsist.store.serde import serialized

DEFAULT_MAX_COST = 1.05


@dataclass(frozen=True)
class ConfigOutcome:
    label: str
    stable: bool  # bit-identical across every fresh session, in every phase that ran
    median_ms: float
    timing_based: bool  # the algorithm pick depends on timings (EXHAUSTIVE)
    tested_under_contention: bool
    p25_ms: float | None = None  # the latency's quartiles, where measured
    p75_ms: float | None = None

    def __post_init__(self) -> None:
        if not self.median_ms > 0:
            raise ConfigError(f"config {self.label}: median latency must be > 0 ms, got {self.median_ms!r}")


@serialized(derived=("accepted",))
@dataclass(frozen=True)
class Recommendation:
    """``config`` is None when no configuration was bit-stable."""

    config: str | None
    median_ms: float | None
    fastest: str
    fastest_ms: float
    cost: float | None  # recommended median / fastest median
    max_cost: float
    stable_configs: tuple[str, ...]
    notes: tuple[str, ...]
    within_noise: bool = False  # above max_cost by median, but not measurably slower (``acceptance``)

    @property
    def accepted(self) -> bool:
        return self.cost is not None and (self.cost <= self.max_cost or self.within_noise)

    @property
    def passed(self) -> bool:
        return self.accepted

    def __bool__(self) -> bool:
        return self.passed


def acceptance(median_ms: float, fastest_ms: float, max_cost: float, fastest: str, p25_ms: float | None = None,
               fastest_p75_ms: float | None = None) -> tuple[bool, str]:
    """Whether a bit-stable configuration's latency is accepted, and why: its median within ``max_cost`` of the
    fastest configuration's, or not measurably slower — its 25th percentile at or below the fastest's 75th, where
    the two medians differ by less than the timing noise of the measurement (a small model timed while other work
    ran beside it) and their ratio says nothing; demanding the one fastest would make verdicts flip with noise."""
    cost = median_ms / fastest_ms
    if cost <= max_cost:
        return True, f"{cost:.2f}x the fastest ({fastest}), accepted up to {max_cost:.2f}x"
    if p25_ms is not None and fastest_p75_ms is not None and p25_ms <= fastest_p75_ms:
        return True, (f"{cost:.2f}x the fastest ({fastest}) by median, above the accepted {max_cost:.2f}x, but not "
                      f"measurably slower: its 25th percentile {p25_ms:.3g} ms is within the fastest's quartiles "
                      f"(75th percentile {fastest_p75_ms:.3g} ms)")
    return False, f"{cost:.2f}x the fastest ({fastest}), above the accepted {max_cost:.2f}x"


def recommend(outcomes: list[ConfigOutcome], max_cost: float = DEFAULT_MAX_COST) -> Recommendation:
    """Pick the fastest bit-stable config; ties in latency go to the one whose pick does not use timings."""
    if not outcomes:
        raise ConfigError("no configuration was measured; nothing to recommend")
    if not max_cost >= 1.0:
        raise ConfigError(f"max cost must be >= 1.0 (a ratio to the fastest config), got {max_cost!r}")
    fastest = min(outcomes, key=lambda o: o.median_ms)
    stable = sorted((o for o in outcomes if o.stable), key=lambda o: (o.median_ms, o.timing_based))
    notes: list[str] = []
    if not stable:
        notes.append("no configuration was bit-stable across fresh sessions; pin none, investigate the repeat origins")
        return Recommendation(None, None, fastest.label, fastest.median_ms, None, max_cost, (), tuple(notes))
    best = stable[0]
    cost = best.median_ms / fastest.median_ms
    if best.timing_based:
        if best.tested_under_contention:
            notes.append(
                f"{best.label} picks algorithms by timing; it stayed stable here under contention, but a pick can "
                "still move on another GPU, driver or load"
            )
        else:
            notes.append(
                f"{best.label} picks algorithms by timing and was not tested under contention (--contention); "
                "its pick may move under load"
            )
        untimed = [o for o in stable if not o.timing_based]
        if untimed:
            alt = untimed[0]
            notes.append(f"the fastest stable config whose pick uses no timing is {alt.label} "
                         f"({alt.median_ms / fastest.median_ms:.2f}x the fastest)")
    accepted, why = acceptance(best.median_ms, fastest.median_ms, max_cost, fastest.label, best.p25_ms, fastest.p75_ms)
    if cost > max_cost:
        notes.append(f"its cost {cost:.2f}x exceeds the accepted {max_cost:.2f}x" + (f"; accepted: {why}" if accepted else ""))
    return Recommendation(
        best.label, best.median_ms, fastest.label, fastest.median_ms, cost, max_cost,
        tuple(o.label for o in stable), tuple(notes), within_noise=accepted and cost > max_cost,
    )
