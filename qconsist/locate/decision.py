"""The recommendation: the fastest configuration that stayed bit-stable in every repeat, and its cost.

Inputs are measurements, one ``ConfigOutcome`` per configuration: was every fresh session bit-identical to
the first (in each phase run: quiet GPU, and under contention when asked), and its latency. The fastest
configuration is the one of lowest median. The cost of a configuration timed side by side with the fastest
(``qconsist.locate.latency.side_by_side``) is the median of its paired ratios — its time over the fastest's in
the same round — so a load that came and went while they were timed weighs on both alike; without times per
round (reports written before) it is the ratio of the medians. ``max_cost`` (explicit, recorded) is what the
user accepts — the real case accepted under 5 %.

``acceptance`` is the one rule that accepts a bit-stable configuration's latency, for locate's recommendation
and for the gate's check of a pinned configuration alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from qconsist.errors import ConfigError
from qconsist.locate.latency import PairedCost, paired_ratios
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
    rounds_ms: tuple[float, ...] | None = None  # its time in each round, where timed side by side

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
    cost: float | None  # the recommended config's paired cost against the fastest (``cost``)
    max_cost: float
    stable_configs: tuple[str, ...]
    notes: tuple[str, ...]
    within_noise: bool = False  # its cost above max_cost, but not measurably slower (``acceptance``)
    paired: PairedCost | None = None  # the paired ratios the cost is the median of (None: a ratio of medians)

    @property
    def accepted(self) -> bool:
        return self.cost is not None and (self.cost <= self.max_cost or self.within_noise)

    @property
    def passed(self) -> bool:
        return self.accepted

    def __bool__(self) -> bool:
        return self.passed


def paired(outcome: ConfigOutcome, fastest: ConfigOutcome) -> PairedCost | None:
    """``outcome``'s paired ratios against ``fastest``: where both were timed side by side in the same rounds."""
    return paired_ratios(outcome.rounds_ms, fastest.rounds_ms, fastest.label)


def cost(median_ms: float, fastest_ms: float, pairs: PairedCost | None = None) -> float:
    """A configuration's cost against the fastest: the median of its paired ratios where it was timed side by side
    with it, else the ratio of the medians."""
    return pairs.median if pairs is not None else median_ms / fastest_ms


def acceptance(median_ms: float, fastest_ms: float, max_cost: float, fastest: str, p25_ms: float | None = None,
               fastest_p75_ms: float | None = None, pairs: PairedCost | None = None) -> tuple[bool, str]:
    """Whether a bit-stable configuration's latency is accepted, and why.

    Timed side by side with the fastest (``pairs``): its cost, the median of the paired ratios, within
    ``max_cost``; or not measurably slower — the paired ratios' 25th percentile within ``max_cost`` (in a quarter
    of the rounds or more it ran within the accepted cost of the fastest, in the same round, under the same load).

    Without paired timings (a report written before locate timed side by side): its median within ``max_cost`` of
    the fastest's; or not measurably slower — its 25th percentile at or below the fastest's 75th. The message says
    which rule decided, with its figures; demanding the one fastest would make verdicts flip with noise."""
    if pairs is not None:
        ratio = cost(median_ms, fastest_ms, pairs)
        by = f"{ratio:.2f}x the fastest ({fastest}) by the median of {pairs.rounds} rounds timed side by side"
        if ratio <= max_cost:
            return True, f"{by}, accepted up to {max_cost:.2f}x"
        if pairs.p25 <= max_cost:
            return True, (f"{by}, above the accepted {max_cost:.2f}x, but not measurably slower: the 25th percentile "
                          f"of its paired ratios {pairs.p25:.2f}x is within it")
        return False, f"{by} (25th percentile {pairs.p25:.2f}x), above the accepted {max_cost:.2f}x"
    unpaired = " (medians compared: the configurations were not timed side by side)"
    ratio = cost(median_ms, fastest_ms)
    if ratio <= max_cost:
        return True, f"{ratio:.2f}x the fastest ({fastest}), accepted up to {max_cost:.2f}x{unpaired}"
    if p25_ms is not None and fastest_p75_ms is not None and p25_ms <= fastest_p75_ms:
        return True, (f"{ratio:.2f}x the fastest ({fastest}) by median, above the accepted {max_cost:.2f}x, but not "
                      f"measurably slower: its 25th percentile {p25_ms:.3g} ms is within the fastest's quartiles "
                      f"(75th percentile {fastest_p75_ms:.3g} ms){unpaired}")
    return False, f"{ratio:.2f}x the fastest ({fastest}), above the accepted {max_cost:.2f}x{unpaired}"


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
                         f"({cost(alt.median_ms, fastest.median_ms, paired(alt, fastest)):.2f}x the fastest)")
    pairs = paired(best, fastest)
    accepted, why = acceptance(best.median_ms, fastest.median_ms, max_cost, fastest.label, best.p25_ms, fastest.p75_ms,
                               pairs)
    ratio = cost(best.median_ms, fastest.median_ms, pairs)
    if ratio > max_cost:
        notes.append(f"its cost {ratio:.2f}x exceeds the accepted {max_cost:.2f}x" + (f"; accepted: {why}" if accepted else ""))
    return Recommendation(
        best.label, best.median_ms, fastest.label, fastest.median_ms, ratio, max_cost,
        tuple(o.label for o in stable), tuple(notes), within_noise=accepted and ratio > max_cost, paired=pairs,
    )
