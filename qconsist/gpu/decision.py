"""The recommendation: the fastest configuration that stayed bit-stable in every repeat, and its cost.

Inputs are measurements, one ``ConfigOutcome`` per configuration: was every fresh session bit-identical to
the first (in each phase run: quiet GPU, and under contention when asked), and its median latency. The cost
is the recommended median over the fastest median of all configurations; ``max_cost`` (explicit, recorded)
is what the user accepts — the real case accepted under 5 %.
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

    @property
    def accepted(self) -> bool:
        return self.cost is not None and self.cost <= self.max_cost

    @property
    def passed(self) -> bool:
        return self.accepted

    def __bool__(self) -> bool:
        return self.passed


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
    if cost > max_cost:
        notes.append(f"its cost {cost:.2f}x exceeds the accepted {max_cost:.2f}x")
    return Recommendation(
        best.label, best.median_ms, fastest.label, fastest.median_ms, cost, max_cost,
        tuple(o.label for o in stable), tuple(notes),
    )
