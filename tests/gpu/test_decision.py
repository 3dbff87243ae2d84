"""The recommendation rule: the fastest bit-stable configuration and its cost against the fastest."""

from __future__ import annotations

import pytest

from qconsist.errors import ConfigError
from qconsist.locate.decision import ConfigOutcome, Recommendation, recommend


def test_recommendation_from_real_cpu_measurements(cpu_threads_exploration):
    reports = cpu_threads_exploration["reports"]
    decision = cpu_threads_exploration["decision"]
    medians = {r.label: r.latency.median_ms for r in reports}
    fastest = min(medians, key=medians.get)
    assert all(r.stable for r in reports)
    assert decision.config == fastest and decision.fastest == fastest
    assert decision.cost == pytest.approx(1.0)
    assert decision.stable_configs == tuple(sorted(medians, key=medians.get))
    assert decision.accepted and bool(decision)
    assert Recommendation.from_json(decision.to_json()) == decision


def test_unstable_fastest_config_costs_the_ratio(cpu_threads_exploration):
    # The measured latencies, with the faster config declared unstable: the slower one is recommended.
    reports = sorted(cpu_threads_exploration["reports"], key=lambda r: r.latency.median_ms)
    fast, slow = reports[0].latency.median_ms, reports[1].latency.median_ms
    outcomes = [ConfigOutcome("fast", False, fast, False, False), ConfigOutcome("slow", True, slow, False, False)]
    decision = recommend(outcomes, max_cost=1e6)
    assert decision.config == "slow" and decision.fastest == "fast"
    assert decision.cost == pytest.approx(slow / fast)
    assert decision.stable_configs == ("slow",)
    tight = recommend(outcomes, max_cost=1.0)
    assert (not tight.accepted) == (slow / fast > 1.0)
    if slow / fast > 1.0:
        assert tight.notes[-1] == f"its cost {slow / fast:.2f}x exceeds the accepted 1.00x"


def test_no_stable_config_means_no_recommendation():
    decision = recommend([ConfigOutcome("a", False, 2.0, True, True), ConfigOutcome("b", False, 1.0, False, True)])
    assert decision.config is None and decision.cost is None and not decision
    assert decision.fastest == "b"
    assert "no configuration was bit-stable" in decision.notes[0]


def test_timing_based_pick_is_flagged_and_an_untimed_alternative_named():
    decision = recommend([
        ConfigOutcome("EXHAUSTIVE", True, 1.50, True, False), ConfigOutcome("HEURISTIC", True, 1.60, False, False),
    ])
    assert decision.config == "EXHAUSTIVE"
    assert decision.notes == (
        "EXHAUSTIVE picks algorithms by timing and was not tested under contention (--contention); its pick may move under load",
        "the fastest stable config whose pick uses no timing is HEURISTIC (1.07x the fastest)",
    )


def test_equal_latency_prefers_the_untimed_pick():
    decision = recommend([ConfigOutcome("E", True, 1.5, True, True), ConfigOutcome("H", True, 1.5, False, True)])
    assert decision.config == "H" and decision.notes == ()


def test_invalid_inputs():
    with pytest.raises(ConfigError, match="no configuration was measured"):
        recommend([])
    with pytest.raises(ConfigError, match=r"max cost must be >= 1.0"):
        recommend([ConfigOutcome("a", True, 1.0, False, False)], max_cost=0.5)
    with pytest.raises(ConfigError, match=r"config a: median latency must be > 0 ms"):
        ConfigOutcome("a", True, 0.0, False, False)


def test_locate_and_the_gate_accept_by_one_rule():
    """``acceptance`` decides for locate's recommendation as for the gate's pin check. Without paired timings (a
    report written before side-by-side timing): within max_cost by median, or above it but not measurably slower
    (its 25th percentile at or below the fastest's 75th), the message saying the medians were compared."""
    from qconsist.locate.decision import acceptance

    unpaired = " (medians compared: the configurations were not timed side by side)"
    assert acceptance(1.04, 1.0, 1.05, "F") == (True, f"1.04x the fastest (F), accepted up to 1.05x{unpaired}")
    assert acceptance(1.5, 1.0, 1.05, "F", p25_ms=1.2, fastest_p75_ms=1.1) == (
        False, f"1.50x the fastest (F), above the accepted 1.05x{unpaired}")
    noisy = (True, "1.50x the fastest (F) by median, above the accepted 1.05x, but not measurably slower: its 25th "
                   f"percentile 1.1 ms is within the fastest's quartiles (75th percentile 1.1 ms){unpaired}")
    assert acceptance(1.5, 1.0, 1.05, "F", p25_ms=1.1, fastest_p75_ms=1.1) == noisy
    # the same measurements through locate's recommendation: the stable config is accepted, with the reason
    outcomes = [ConfigOutcome("F", False, 1.0, False, False, 0.9, 1.1), ConfigOutcome("S", True, 1.5, False, False, 1.1, 2.0)]
    decision = recommend(outcomes, max_cost=1.05)
    assert decision.config == "S" and decision.accepted and decision.within_noise and decision.paired is None
    assert decision.notes == (f"its cost 1.50x exceeds the accepted 1.05x; accepted: {noisy[1]}",)
    assert Recommendation.from_json(decision.to_json()) == decision
    apart = recommend([outcomes[0], ConfigOutcome("S", True, 1.5, False, False, 1.2, 2.0)], max_cost=1.05)
    assert not apart.accepted and not apart.within_noise
    assert apart.notes == ("its cost 1.50x exceeds the accepted 1.05x",)


# times per round of two configs timed side by side: F's rounds, and S = F x these ratios (a load burst in rounds
# 2 to 5 slows both alike; S's own median is far above F's, its paired ratios are not)
F_ROUNDS = (1.0, 1.0, 3.0, 3.2, 2.9, 3.1, 1.0, 1.0)


def _times(ratios):
    return tuple(f * r for f, r in zip(F_ROUNDS, ratios))


def test_paired_ratios_of_known_rounds():
    from qconsist.locate.latency import PairedCost, paired_ratios

    ratios = (1.0, 1.02, 1.04, 1.0, 1.06, 1.02, 1.08, 1.04)
    assert paired_ratios(_times(ratios), F_ROUNDS, "F") == PairedCost("F", 8, pytest.approx(1.03), pytest.approx(1.015),
                                                                      pytest.approx(1.045))
    # nothing to pair: a config timed alone, an older report, rounds of another measurement
    assert paired_ratios(None, F_ROUNDS, "F") is None and paired_ratios(F_ROUNDS, None, "F") is None
    assert paired_ratios(F_ROUNDS[:6], F_ROUNDS, "F") is None


def test_paired_ratios_decide_where_configs_were_timed_side_by_side():
    """The cost is the median of the paired ratios; above max_cost, the 25th percentile of the paired ratios
    within it accepts as not measurably slower; the message names the rule and its figures."""
    from qconsist.locate.decision import acceptance, cost
    from qconsist.locate.latency import paired_ratios
    from qconsist.locate.latency import summarise

    fastest = summarise(F_ROUNDS, 0.0, 0.0, 0, rounds=True)
    assert fastest.median_ms == pytest.approx(1.95)  # a burst in half the rounds: any median of either config means little
    close = summarise(_times((1.0, 1.02, 1.04, 1.0, 1.06, 1.02, 1.08, 1.04)), 0.0, 0.0, 0, rounds=True)
    pairs = paired_ratios(close.rounds_ms, fastest.rounds_ms, "F")
    assert cost(close.median_ms, fastest.median_ms, pairs) == pytest.approx(1.03)
    assert acceptance(close.median_ms, fastest.median_ms, 1.05, "F", close.p25_ms, fastest.p75_ms, pairs) == (
        True, "1.03x the fastest (F) by the median of 8 rounds timed side by side, accepted up to 1.05x")
    noisy = summarise(_times((1.0, 1.03, 1.3, 1.02, 1.2, 1.1, 1.25, 1.06)), 0.0, 0.0, 0, rounds=True)
    pairs = paired_ratios(noisy.rounds_ms, fastest.rounds_ms, "F")
    assert (pairs.median, pairs.p25) == (pytest.approx(1.08), pytest.approx(1.0275))
    assert acceptance(noisy.median_ms, fastest.median_ms, 1.05, "F", noisy.p25_ms, fastest.p75_ms, pairs) == (
        True, "1.08x the fastest (F) by the median of 8 rounds timed side by side, above the accepted 1.05x, but not "
              "measurably slower: the 25th percentile of its paired ratios 1.03x is within it")
    slower = summarise(_times((1.2, 1.25, 1.3, 1.22, 1.18, 1.2, 1.24, 1.26)), 0.0, 0.0, 0, rounds=True)
    pairs = paired_ratios(slower.rounds_ms, fastest.rounds_ms, "F")
    assert acceptance(slower.median_ms, fastest.median_ms, 1.05, "F", slower.p25_ms, fastest.p75_ms, pairs) == (
        False, "1.23x the fastest (F) by the median of 8 rounds timed side by side (25th percentile 1.20x), above "
               "the accepted 1.05x")
    # the same slower config, its rounds unknown: the quartiles of the medians overlap and today's rule accepts it
    assert acceptance(slower.median_ms, fastest.median_ms, 1.05, "F", slower.p25_ms, fastest.p75_ms)[0]


def test_the_recommendation_records_the_paired_cost():
    from qconsist.locate.latency import PairedCost

    ratios = (1.0, 1.03, 1.3, 1.02, 1.2, 1.1, 1.25, 1.06)
    outcomes = [ConfigOutcome("F", False, 2.0, False, False, 1.0, 3.05, F_ROUNDS),
                ConfigOutcome("S", True, 2.2, False, False, 1.05, 3.4, _times(ratios))]
    decision = recommend(outcomes, max_cost=1.05)
    assert decision.config == "S" and decision.fastest == "F" and decision.cost == pytest.approx(1.08)
    assert decision.accepted and decision.within_noise
    assert decision.paired == PairedCost("F", 8, pytest.approx(1.08), pytest.approx(1.0275), pytest.approx(1.2125))
    assert decision.notes == (
        "its cost 1.08x exceeds the accepted 1.05x; accepted: 1.08x the fastest (F) by the median of 8 rounds timed "
        "side by side, above the accepted 1.05x, but not measurably slower: the 25th percentile of its paired ratios "
        "1.03x is within it",)
    assert Recommendation.from_json(decision.to_json()) == decision
