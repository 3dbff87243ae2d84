"""Final outputs of two runs: the output effect (greatest difference, per-sample top-1 agreement) and the
tolerance check the pipeline's stages use. Top-1 is the one of ``qconsist.compare.accuracy`` (``top1``: per sample
for any batch size, or per position along a map's class axis); ``describe_judgement`` is the one text of an
output's judgement (the pipeline's, the gate's, ``diff``'s).

**Samples and batches**: an output's first axis is the batch when it has two or more axes, so a batch of
``B`` counts as ``B`` samples everywhere: top-1 agreement is over samples, never over steps, and never a
flat arg-max over a whole batch.

**Each output judged for what it is** (``compare_outputs(..., judged=...)``, kinds from
``qconsist.compare.kinds``): every output and every part of one gets SQNR, cosine similarity and greatest
difference against the reference (``OutputJudgement``, the one SQNR of ``qconsist.compare.noise``), an output
of integers (class indices, counts) the share of samples it gives identically instead; only a
``class-scores`` output gets a top-1 agreement, and ``OutputComparison.top1_agreement`` is theirs (None when
the model has none). Called without ``judged`` (the float stages' tolerance checks, which judge no top-1),
every output is judged whole with no kind, and ``top1_agreement`` stays the first output's, as recorded before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from qconsist.compare.accuracy import top1
from qconsist.compare.kinds import JudgedOutput, OutputKind
from qconsist.compare.noise import NoiseStats
from qconsist.compare.statistics import IDENTICAL, MEASURED, TensorStats, differing_mask, sqnr_phrase
from qconsist.store.serde import serialized
from qconsist.errors import InputError


def batch_rows(values: np.ndarray) -> int:
    values = np.asarray(values)
    return int(values.shape[0]) if values.ndim >= 2 else 1


def _row_differs(a: np.ndarray, b: np.ndarray, rows: int) -> np.ndarray:
    """Per sample, whether the two versions of one output differ in any byte."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return np.ones(rows, dtype=bool)
    mask = differing_mask(a, b)
    if a.ndim >= 2 and a.shape[0] == rows and rows:
        return mask.reshape(rows, -1).any(axis=1)
    return np.full(rows, bool(mask.any()))


@serialized(derived=("top1_agreement",), renames={"outputs_identical": "identical"})
@dataclass
class OutputEffect:
    """What a difference does to the final outputs, over samples (rows of the batch axis)."""

    samples: int = 0
    differing_samples: list[int] = field(default_factory=list)
    greatest_abs: float = 0.0
    top1_agree: int = 0
    identical: bool = True
    judged: bool = False  # the outputs are judged by kind elsewhere (``OutputJudgement``): no top-1 of the first output

    @property
    def top1_agreement(self) -> float | None:
        """The first output's per-sample top-1 agreement (locate's probes); None where the outputs are judged by
        kind (``diff``: only a class-scores output has a top-1)."""
        if self.judged:
            return None
        return self.top1_agree / self.samples if self.samples else 1.0

    def add(self, first_sample: int, a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> None:
        """One step: the outputs of both runs (same order). Its samples are ``first_sample`` onwards."""
        if not a:
            return
        rows = batch_rows(a[0])
        differs = np.zeros(rows, dtype=bool)
        for x, y in zip(a, b):
            x, y = np.asarray(x), np.asarray(y)
            row = _row_differs(x, y, rows)
            differs |= row
            if x.shape != y.shape:
                self.greatest_abs = math.inf
            elif row.any() and x.size:
                fx, fy = x.astype(np.float64), y.astype(np.float64)
                with np.errstate(invalid="ignore"):
                    delta = np.abs(fx - fy)
                delta = np.where(np.isnan(fx) & np.isnan(fy), 0.0, np.nan_to_num(delta, nan=math.inf, posinf=math.inf))
                self.greatest_abs = max(self.greatest_abs, float(delta.max()))
        self.differing_samples += [first_sample + int(i) for i in np.flatnonzero(differs)]
        self.identical = self.identical and not differs.any()
        if not self.judged and np.asarray(a[0]).shape == np.asarray(b[0]).shape and np.asarray(a[0]).size:
            self.top1_agree += int(np.count_nonzero(top1(a[0]) == top1(b[0])))
        self.samples += rows

    def add_identical(self, rows: int = 1) -> None:
        """Count samples whose outputs are known to be bit-identical (from their hashes)."""
        self.samples += rows
        self.top1_agree += 0 if self.judged else rows


def describe_judgement(entry: Mapping[str, Any]) -> str:
    """The one text of an output's judgement, from its record (``OutputJudgement.to_json``; the pipeline's,
    the gate's and ``diff``'s): "prob (class-scores): SQNR 41.4 dB, cosine 0.99999, greatest difference 0.0153,
    top-1 agreement 100%"; "prob (class-scores): identical in 9 samples"; a reference of zeros has no SQNR and
    no cosine; a map whose class axis the graph gives, its per-position top-1 agreement."""
    head = f"{entry['label']} ({entry.get('kind') or 'undeclared'}"
    if entry.get("integer"):
        return f"{head}, integers): {entry['identical_samples']}/{entry['samples']} samples identical"
    figure = entry.get("figure", MEASURED)
    if figure == IDENTICAL:
        return f"{head}): identical in {entry['samples']} samples"
    text = f"{head}): {sqnr_phrase(entry.get('sqnr_db'), figure)}"
    if figure == MEASURED:
        text += f", cosine {float(entry['cosine']):.5f}"
    text += f", greatest difference {float(entry['max_abs']):.4g}"
    if entry.get("top1_agreement") is not None:
        text += f", top-1 agreement {entry['top1_agreement']:.0%}"
    if entry.get("position_agreement") is not None:
        text += (f", per-position top-1 agreement {entry['position_agreement']:.1%} of {entry.get('top1_positions')} "
                 "positions")
    if entry.get("nonfinite"):
        text += f", {entry['nonfinite']} element(s) NaN or Inf on one side"
    return text


@dataclass
class OutputJudgement:
    """One output (or part of one) against its reference over every sample: SQNR, cosine and greatest
    difference (``NoiseStats``), and for class scores the samples whose top-1 class agrees."""

    target: JudgedOutput
    noise: NoiseStats = field(default_factory=NoiseStats)
    samples: int = 0
    top1_agree: int = 0
    integer: bool = False  # integer or boolean values (class indices, counts): judged by identity, not by SQNR
    identical: int = 0  # samples whose values are bit-identical
    top1_positions: int = 0  # a map with a class axis: positions compared
    position_agree: int = 0  # ... whose top-1 class agrees

    @property
    def label(self) -> str:
        return self.target.label

    @property
    def sqnr_db(self) -> float:
        return self.noise.sqnr_db

    @property
    def top1_agreement(self) -> float | None:
        """None unless the output is class scores."""
        if self.target.kind is not OutputKind.CLASS_SCORES:
            return None
        return self.top1_agree / self.samples if self.samples else 1.0

    @property
    def position_agreement(self) -> float | None:
        """A map whose class axis the graph establishes: the share of positions whose top-1 class agrees (a
        sequence's per-step classes, a segmentation's per-pixel classes); None for anything else."""
        if self.target.kind is not OutputKind.MAP or self.target.class_axis is None or self.integer:
            return None
        return self.position_agree / self.top1_positions if self.top1_positions else 1.0

    def add(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        a, b = self.target.select(reference), self.target.select(candidate)
        rows = batch_rows(a)
        self.samples += rows
        if a.shape != b.shape:
            self.noise.nonfinite += int(max(a.size, b.size))
            return
        self.identical += rows - int(np.count_nonzero(_row_differs(a, b, rows)))
        if a.dtype.kind in "biu":
            self.integer = True
            return
        self.noise.add(a, b)
        if self.target.kind is OutputKind.CLASS_SCORES and a.size:
            self.top1_agree += int(np.count_nonzero(top1(a) == top1(b)))
        elif self.target.kind is OutputKind.MAP and self.target.class_axis is not None and a.size:
            agree = top1(a, self.target.class_axis) == top1(b, self.target.class_axis)
            self.top1_positions += int(agree.size)
            self.position_agree += int(np.count_nonzero(agree))

    @property
    def figure(self) -> str:
        """``identical``, ``zero-signal`` or ``measured`` (``qconsist.compare.statistics.noise_figure``)."""
        return self.noise.figure

    def describe(self) -> str:
        """"prob (class-scores): SQNR 41.4 dB, cosine 0.99999, greatest difference 0.0153, top-1 agreement 100%"
        (``describe_judgement``)."""
        return describe_judgement(self.to_json())

    def to_json(self) -> dict[str, Any]:
        figures = ({"sqnr_db": None, "cosine": None, "max_abs": None, "mean_abs": None} if self.integer else
                   {"sqnr_db": self.sqnr_db, "cosine": self.noise.cosine, "max_abs": self.noise.max_abs,
                    "mean_abs": self.noise.mean_abs, "figure": self.figure})
        return {**self.target.to_json(), "samples": self.samples, "elements": self.noise.elements, **figures,
                "nonfinite": self.noise.nonfinite, "identical_samples": self.identical, "integer": self.integer,
                "top1_agreement": self.top1_agreement,
                **({"position_agreement": self.position_agreement, "top1_positions": self.top1_positions}
                   if self.position_agreement is not None else {})}


@dataclass(frozen=True)
class OutputComparison:
    """One model's outputs against a reference model's over an input set, within ``atol + rtol·|ref|``
    (``None``: record only, nothing mismatches)."""

    stats: dict[str, TensorStats]  # per output name
    effect: OutputEffect
    atol: float | None
    rtol: float | None
    judgements: tuple[OutputJudgement, ...] = ()  # every output and part, for what it is (``judged``)
    judged: bool = False  # the kinds were given: top-1 is the class-scores outputs' only

    @property
    def samples(self) -> int:
        return self.effect.samples

    @property
    def elements(self) -> int:
        return sum(s.elements for s in self.stats.values())

    @property
    def mismatched(self) -> int:
        return sum(s.mismatched for s in self.stats.values()) if self.atol is not None else 0

    @property
    def worst(self) -> TensorStats | None:
        differing = [s for s in self.stats.values() if s.differing]
        return max(differing, key=lambda s: s.max_abs) if differing else None

    @property
    def max_abs_diff(self) -> float:
        return self.worst.max_abs if self.worst else 0.0

    @property
    def max_rel_diff(self) -> float:
        return max((s.max_rel for s in self.stats.values()), default=0.0)

    @property
    def top1_agreement(self) -> float | None:
        """The class-scores outputs' (the lowest of them); None where none is; without kinds, the first output's."""
        if not self.judged:
            return self.effect.top1_agreement
        found = [j.top1_agreement for j in self.judgements if j.top1_agreement is not None and j.target.axis is None]
        return min(found) if found else None

    def below(self, min_sqnr_db: float | None) -> list[OutputJudgement]:
        """The outputs and parts whose SQNR is below ``min_sqnr_db`` (or not finite on one side), lowest first."""
        if min_sqnr_db is None:
            return []
        low = [j for j in self.judgements if not j.integer and j.figure != IDENTICAL
               and (j.noise.nonfinite or not j.sqnr_db >= min_sqnr_db)]
        return sorted(low, key=lambda j: j.sqnr_db)

    @property
    def passed(self) -> bool:
        """No element beyond the tolerance, and, with or without one, never a non-finite difference (NaN or
        Inf on one side only)."""
        return self.mismatched == 0 and math.isfinite(self.max_abs_diff)

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        worst = self.worst
        if worst is None:
            return f"Mismatched elements: 0 / {self.elements} (0.0%); the outputs are bit-identical"
        merged = TensorStats(worst.name, self.atol, self.rtol, worst.dtype, self.elements,
                             sum(s.differing for s in self.stats.values()), self.mismatched if self.atol is not None
                             else sum(s.differing for s in self.stats.values()), worst.max_abs, worst.max_abs_at,
                             self.max_rel_diff)
        return merged.message(f"output {worst.name}")

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "samples": self.samples, "elements": self.elements, "mismatched": self.mismatched,
            "max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
            "worst_output": worst.name if worst else "",
            "worst_sample": worst.max_abs_at[0] if worst and worst.max_abs_at else 0,
            "worst_index": list(worst.max_abs_at[1]) if worst and worst.max_abs_at else [],
            "atol": self.atol, "rtol": self.rtol, "top1_agreement": self.top1_agreement, "passed": self.passed,
            "outputs": {name: s.to_json() for name, s in self.stats.items()}, "effect": self.effect.to_json(),
            **({"judged": [j.to_json() for j in self.judgements]} if self.judged else {}),
        }


def compare_outputs(
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
    atol: float | None,
    rtol: float | None,
    judged: Sequence[JudgedOutput] | None = None,
) -> OutputComparison:
    """Compare two runs' outputs step by step (a step may hold a batch; its rows are samples). ``judged``: what
    each output (and part) is (``qconsist.compare.kinds.judged_outputs``); see the module docstring."""

    if len(reference) != len(candidate) or not reference:
        raise InputError(f"cannot compare {len(reference)} reference samples with {len(candidate)} candidate samples")
    targets = list(judged) if judged is not None else [JudgedOutput(name, None, "") for name in reference[0]]
    missing = sorted({t.output for t in targets} - set(reference[0]))
    if missing:
        raise InputError(f"the outputs {', '.join(missing)} are not among the model's outputs ({', '.join(reference[0])})")
    judgements = tuple(OutputJudgement(t) for t in targets)
    stats: dict[str, TensorStats] = {}
    effect = OutputEffect()
    for ref, got in zip(reference, candidate):
        first = effect.samples
        names = list(ref)
        for name in names:
            entry = stats.setdefault(name, TensorStats(name, atol, rtol))
            entry.add(first, ref[name], got[name])
        effect.add(first, [ref[n] for n in names], [got[n] for n in names])
        for judgement in judgements:
            judgement.add(ref[judgement.target.output], got[judgement.target.output])
    return OutputComparison(stats, effect, atol, rtol, judgements, judged is not None)
