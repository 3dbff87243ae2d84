"""From per-node effects to a list of nodes to keep in float that reaches the targets.

**The method: forward selection in the order of the single-node effects, then backward elimination**, every
step a real probe (a quantization with that list, measured), never an estimate:

1. forward: the nodes whose probe alone improved on the all-quantized model (``standing``: targets met, then
   the share of each target's gap closed, then the worst output's SQNR) are tried most-improving first; a node
   is added when the model with it and the nodes chosen so far measures better than without it, and skipped
   otherwise (effects do not add up: two nodes can fix the same loss); forward stops as soon as the targets are
   met. Where that misses the targets but every improving node kept in float together reaches them (one probe),
   a second forward pass adds the improving nodes in the same order, skipping none (nodes can also help only
   together, each fixing part of one loss), until they are met;
2. backward: each chosen node, the last added first, is dropped when the targets are still met without it.

What that guarantees: the list reaches the targets on the probe inputs (measured with exactly that list), and
it is *1-minimal*: dropping any one of its nodes misses a target (each drop was measured). It is not
guaranteed to be the smallest such list — that is a search over subsets, exponential in the candidates, since
effects interact — and only the candidates probed are considered (the first pass's top K by default).
Cost: one probe per improving candidate forward (two where the second pass runs), plus one per chosen node backward.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.sensitivity.figures import Figures, standing
from qconsist.sensitivity.probe import Probe
from qconsist.sensitivity.result import Agreement, Proposal, Step
from qconsist.sensitivity.target import Target

METHOD = ("forward selection in the order of the single-node effects (a node is kept when the list with it measures "
          "better; if that misses, every improving node in turn), then backward elimination (a node is dropped when the "
          "targets still hold without it); every step a quantization measured on the probe inputs")
GUARANTEE = ("reaches the targets on the probe inputs with exactly this list (measured), and is 1-minimal: dropping any "
             "one node misses a target (each drop measured); not guaranteed the smallest list (a search over subsets), "
             "and only the probed candidates are considered")


def meets(probe: Probe, targets: Sequence[Target]) -> bool:
    """The probe's quantization reaches the targets (one that quantizes nothing never does: it is no quantization)."""
    return not probe.nothing_quantized and probe.figures.meets_all(targets)


def improving(single: dict[str, Probe], baseline: Figures, targets: Sequence[Target]) -> list[str]:
    """The nodes whose probe alone measures better than ``baseline``, most improving first (then by name)."""
    start = standing(baseline, targets, baseline)
    better = [(standing(p.figures, targets, baseline), node) for node, p in single.items()
              if not p.nothing_quantized and standing(p.figures, targets, baseline) > start]
    return [node for _, node in sorted(better, key=lambda item: (tuple(-v for v in item[0]), item[1]))]


def _forward(probe: Callable[[Sequence[str]], Probe], baseline: Probe, single: dict[str, Probe], order: Sequence[str],
             targets: Sequence[Target], skip: bool, steps: list[Step], task) -> tuple[list[str], Probe]:
    """Nodes added in ``order`` until the targets are met; with ``skip``, a node whose addition does not measure
    better is left out."""
    chosen: list[str] = []
    current = baseline
    for node in order:
        trial = single[node] if not chosen else probe([*chosen, node])
        usable = not trial.nothing_quantized  # a list that leaves nothing quantized is no quantization
        better = usable and standing(trial.figures, targets, baseline.figures) > standing(current.figures, targets, baseline.figures)
        met = usable and trial.figures.meets_all(targets)
        added = better or not skip
        steps.append(Step("add" if added else "skip", node, [*chosen, node], trial.figures, met))
        task.advance()
        if added:
            chosen.append(node)
            current = trial
        if current.figures.meets_all(targets):
            break
    return chosen, current


def propose(probe: Callable[[Sequence[str]], Probe], baseline: Probe, single: dict[str, Probe],
            targets: Sequence[Target], progress: Progress = NULL_PROGRESS) -> Proposal:
    """The list of nodes to keep in float (see the module docstring); ``probe(nodes)`` measures a list."""
    if baseline.figures.meets_all(targets):
        return Proposal([], baseline.figures, True, METHOD, "the all-quantized model already reaches the targets",
                        md5=baseline.md5)
    order = improving(single, baseline.figures, targets)
    steps: list[Step] = []
    with progress.task("searching", 2 * len(order)) as task:
        chosen, current = _forward(probe, baseline, single, order, targets, True, steps, task)
        if not current.figures.meets_all(targets) and len(order) > 1 and meets(probe(order), targets):
            # nodes may help only together (each fixing part of one loss): every improving node, in order, until
            # the targets are met (they are with all of them: that list was measured)
            chosen, current = _forward(probe, baseline, single, order, targets, False, steps, task)
    if not current.figures.meets_all(targets):
        return Proposal(chosen, current.figures, False, METHOD, GUARANTEE, steps, md5=current.md5)
    for node in reversed(list(chosen)):
        if len(chosen) == 1:
            break
        rest = [n for n in chosen if n != node]
        trial = probe(rest)
        met = meets(trial, targets)
        steps.append(Step("drop" if met else "keep", node, rest, trial.figures, met))
        if met:
            chosen, current = rest, trial
    return Proposal(chosen, current.figures, True, METHOD, GUARANTEE, steps, md5=current.md5)


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties given their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks, ties averaged); None for fewer than 3 pairs or a
    constant side."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3:
        return None
    rx, ry = _ranks([a for a, _ in pairs]), _ranks([b for _, b in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def agreement(first_added: dict[str, float | None], first_sqnr: dict[str, float], gains: dict[str, float],
              first_order: Sequence[str], probe_order: Sequence[str], top: int) -> Agreement:
    """How quant-error's ranking relates to the probes' over the probed nodes (see ``Agreement``)."""
    nodes = [n for n in gains if n in first_sqnr]
    added = spearman([first_added[n] for n in nodes], [gains[n] for n in nodes])  # type: ignore[misc]
    # a low SQNR is blame: rank by its negative so that both correlations read "positive = agree"
    sqnr = spearman([-first_sqnr[n] for n in nodes], [gains[n] for n in nodes])
    top = min(top, len(probe_order))
    overlap = len(set(first_order[:top]) & set(probe_order[:top]))
    return Agreement(len(nodes), added, sqnr, top, overlap)
