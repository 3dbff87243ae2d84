"""The proposal's search on made-up measurements (every probe answered from a table, as a quantization would be):
forward selection in the order of the single-node effects, backward elimination, and what it guarantees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qconsist.progress import NULL_PROGRESS
from qconsist.sensitivity.figures import Figures, OutputFigures
from qconsist.sensitivity.probe import Probe
from qconsist.sensitivity.search import improving, propose, spearman
from qconsist.sensitivity.target import Target


def _probe(nodes, sqnr: float) -> Probe:
    figures = Figures(samples=3, outputs=[OutputFigures("map", "map", sqnr, 0.9, 1.0)])
    return Probe(tuple(nodes), f"md5-{'-'.join(sorted(nodes))}", figures)


class Table:
    """SQNR of every list of nodes in float: a base, each node's own gain, and interactions."""

    def __init__(self, gains: dict[str, float], together: dict[frozenset, float] | None = None, base: float = 10.0):
        self.gains, self.together, self.base, self.asked = gains, together or {}, base, []

    def __call__(self, nodes):
        self.asked.append(tuple(nodes))
        key = frozenset(nodes)
        if key in self.together:
            return _probe(nodes, self.together[key])
        return _probe(nodes, self.base + sum(self.gains[n] for n in nodes))


def _run(table: Table, target: str):
    baseline = _probe([], table.base)
    single = {n: table([n]) for n in table.gains}
    table.asked.clear()
    return propose(table, baseline, single, [Target.parse(target)], NULL_PROGRESS)


def test_forward_in_order_of_effect_then_backward_elimination():
    # a alone +8, b +6, c +1, d -2; a and b together only +9 (they fix the same loss); c with a and b reaches 20
    table = Table({"a": 8.0, "b": 6.0, "c": 1.0, "d": -2.0},
                  {frozenset("ab"): 19.0, frozenset("abc"): 21.0, frozenset("ac"): 20.5, frozenset("bc"): 17.0})
    proposal = _run(table, "sqnr>=20")
    assert proposal.reached and proposal.nodes == ["a", "c"]
    assert [(s.action, s.node, s.excluded) for s in proposal.steps] == [
        ("add", "a", ["a"]), ("add", "b", ["a", "b"]), ("add", "c", ["a", "b", "c"]),  # forward: 18, 19, 21 (met)
        ("keep", "c", ["a", "b"]),  # without c: 19, misses
        ("drop", "b", ["a", "c"]),  # without b: 20.5, still met
        ("keep", "a", ["c"]),  # without a: 11, misses
    ]
    assert proposal.predicted.worst_sqnr_db == 20.5
    # 1-minimal: dropping any one node of the proposal misses the target (each was measured)
    for node in proposal.nodes:
        rest = [n for n in proposal.nodes if n != node]
        assert table(rest).figures.worst_sqnr_db < 20
    # the nodes that made it worse alone were never tried
    assert not any("d" in asked for asked in table.asked)


def test_a_node_that_does_not_help_with_the_others_is_skipped():
    table = Table({"a": 8.0, "b": 6.0, "c": 4.0}, {frozenset("ab"): 17.0, frozenset("abc"): 22.0, frozenset("ac"): 22.5})
    proposal = _run(table, "sqnr>=20")
    # a+b measures 17 < 18 (a alone): b is skipped; a+c reaches 22.5
    assert [(s.action, s.node) for s in proposal.steps][:2] == [("add", "a"), ("skip", "b")]
    assert proposal.reached and proposal.nodes == ["a", "c"]


def test_an_unreachable_target_says_so_with_the_best_measured():
    proposal = _run(Table({"a": 2.0, "b": 1.0}), "sqnr>=40")
    assert not proposal.reached and proposal.nodes == ["a", "b"] and proposal.predicted.worst_sqnr_db == 13.0


def test_nothing_to_keep_when_the_baseline_reaches_the_target():
    proposal = _run(Table({"a": 2.0}), "sqnr>=5")
    assert proposal.reached and proposal.nodes == [] and proposal.steps == []


def test_only_improving_nodes_are_candidates_most_improving_first():
    single = {n: _probe([n], 10 + g) for n, g in {"a": 1.0, "b": 3.0, "c": 0.0, "d": -1.0, "e": 3.0}.items()}
    assert improving(single, _probe([], 10).figures, [Target.parse("sqnr>=20")]) == ["b", "e", "a"]


def test_nodes_that_help_only_together_are_found_by_the_second_forward_pass():
    """a ranks first alone, but a with b or c measures worse than a alone: the first pass skips both and misses;
    b and c reach the target only together. The second pass adds every improving node, backward drops a."""
    gains = {"a": 5.0, "b": 4.0, "c": 4.0}
    together = {frozenset("ab"): 12.0, frozenset("abc"): 21.0, frozenset("ac"): 12.0, frozenset("bc"): 20.0}
    proposal = _run(Table(gains, together), "sqnr>=20")
    assert [(s.action, s.node) for s in proposal.steps] == [
        ("add", "a"), ("skip", "b"), ("skip", "c"),  # first pass: 15, then 12 and 12
        ("add", "a"), ("add", "b"), ("add", "c"),  # second pass: 15, 12, 21 (met)
        ("keep", "c"), ("keep", "b"), ("drop", "a")]  # backward: ab 12, ac 12, bc 20
    assert proposal.reached and proposal.nodes == ["b", "c"]
    smallest = min((set(c) for k in range(1, 4) for c in itertools.combinations(gains, k)
                    if Table(gains, together)(list(c)).figures.worst_sqnr_db >= 20), key=len)
    assert len(smallest) == 2  # here the smallest list, found exhaustively


def test_the_smallest_list_is_not_guaranteed():
    """The documented limit: forward stops at the first list that reaches the target and backward removes one node
    at a time. a+b+c reaches 20 and none of the three can go (1-minimal), while a+d — d gains little alone, so it
    comes last — also reaches 20 with two nodes."""
    gains = {"a": 4.0, "b": 3.0, "c": 3.0, "d": 0.5}
    together = {frozenset("ad"): 20.0}
    proposal = _run(Table(gains, together), "sqnr>=20")
    assert proposal.reached and sorted(proposal.nodes) == ["a", "b", "c"]
    for node in proposal.nodes:  # 1-minimal
        assert Table(gains, together)([n for n in proposal.nodes if n != node]).figures.worst_sqnr_db < 20
    assert Table(gains, together)(["a", "d"]).figures.worst_sqnr_db >= 20  # but not the smallest


def test_spearman_against_the_textbook_formula():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=40), rng.normal(size=40)
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    textbook = 1 - 6 * float(((rx - ry) ** 2).sum()) / (40 * (40 ** 2 - 1))  # no ties
    assert spearman(list(x), list(y)) == pytest.approx(textbook, abs=1e-12)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take their average rank: x ranks 1, 2.5, 2.5, 4 against y 1..4: r = 0.9486832980505138
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138, abs=1e-12)
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1, 2], [1, 2]) is None
