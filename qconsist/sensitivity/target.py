"""What the user wants of the quantized model, typed: ``sqnr>=40``, ``top1>=0.999``, ``accuracy-drop<=0.1``.

A target is one measure of the quantized model's final outputs against the float model's, a bound, and
optionally the output (or part, by its label: ``sqnr[output0[:, 4:22]]>=20``) it applies to:

* ``sqnr>=DB`` — SQNR in dB; without an output, every output and part must reach it (the worst one counts);
* ``cosine>=X`` — cosine similarity, in [-1, 1]; the worst output or part;
* ``max-abs<=X`` — greatest absolute difference, in the output's own units; the worst output (name one
  output where their units differ);
* ``top1>=X`` — top-1 agreement of the class-scores output(s), a fraction in [0, 1];
* ``accuracy-drop<=POINTS`` — the float model's top-1 accuracy minus the quantized model's, in percentage
  points (needs labelled evaluation inputs).

Lower bounds are written ``>=`` and upper bounds ``<=``; anything else is refused in one line that says what
to write. Whether a target applies to the model (its outputs, labels) is checked before any work
(``Target.check``).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from qconsist.compare.kinds import JudgedOutput, OutputKind
from qconsist.errors import ConfigError
from qconsist.store.serde import serialized


class Measure(str, Enum):
    SQNR = "sqnr"
    COSINE = "cosine"
    MAX_ABS = "max-abs"
    TOP1 = "top1"
    ACCURACY_DROP = "accuracy-drop"

    @property
    def lower_bound(self) -> bool:
        """``>=`` targets (more is better); the others are ``<=``."""
        return self in (Measure.SQNR, Measure.COSINE, Measure.TOP1)

    @property
    def unit(self) -> str:
        return {Measure.SQNR: " dB", Measure.ACCURACY_DROP: " points"}.get(self, "")


MEASURES = ", ".join(m.value for m in Measure)
_SYNTAX = re.compile(r"^\s*(?P<measure>[A-Za-z0-9_-]+)\s*(?:\[(?P<output>.+)\])?\s*(?P<op>>=|<=|=>|=<|>|<|==|=)\s*(?P<bound>\S+)\s*$")
_EXAMPLES = 'e.g. "sqnr>=40", "top1>=0.999", "accuracy-drop<=0.1", "sqnr[prob]>=45"'


@serialized(derived=("text",))
@dataclass(frozen=True)
class Target:
    """One bound on one measure (see the module docstring); validated on creation."""

    measure: Measure
    bound: float
    output: str | None = None  # an output's or part's label; None: the worst of them (sqnr, cosine, max-abs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "measure", Measure(self.measure))
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)) or not math.isfinite(self.bound):
            raise ConfigError(f"target {self.text}: the bound must be a finite number")
        object.__setattr__(self, "bound", float(self.bound))
        m, b = self.measure, self.bound
        if m is Measure.TOP1 and not 0 <= b <= 1:
            raise ConfigError(f"target {self.text}: top-1 agreement is a fraction in [0, 1] (write top1>=0.999 for 99.9%)")
        if m is Measure.COSINE and not -1 <= b <= 1:
            raise ConfigError(f"target {self.text}: a cosine similarity lies in [-1, 1]")
        if m in (Measure.MAX_ABS, Measure.ACCURACY_DROP) and b < 0:
            raise ConfigError(f"target {self.text}: {m.value} is never negative; give a bound >= 0")
        if m in (Measure.TOP1, Measure.ACCURACY_DROP) and self.output is not None:
            raise ConfigError(f"target {self.text}: {m.value} applies to the class-scores output; name no output")

    @property
    def text(self) -> str:
        where = f"[{self.output}]" if self.output is not None else ""
        return f"{self.measure.value}{where}{'>=' if self.measure.lower_bound else '<='}{self.bound:g}"

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str) -> "Target":
        """``"sqnr>=40"`` → ``Target(SQNR, 40.0)``; a wrong spelling is a ``ConfigError`` saying what to write."""
        if not isinstance(text, str):
            raise ConfigError(f"a target is a string such as \"sqnr>=40\", got {text!r}")
        found = _SYNTAX.match(text)
        if not found:
            raise ConfigError(f"target {text!r} is not MEASURE>=BOUND or MEASURE<=BOUND ({_EXAMPLES}; measures: {MEASURES})")
        name, op, bound_text = found["measure"].lower(), found["op"], found["bound"]
        try:
            measure = Measure(name)
        except ValueError:
            raise ConfigError(f"target {text!r}: unknown measure {found['measure']!r} (measures: {MEASURES})") from None
        wanted = ">=" if measure.lower_bound else "<="
        if op != wanted or bound_text[:1] in "<>=!":
            kind = "a lower bound" if measure.lower_bound else "an upper bound"
            bound = bound_text.lstrip("<>=! ")  # "sqnr>>40": the operator's extra characters are not the bound's
            try:
                Decimal(bound.removesuffix("%"))
            except (InvalidOperation, ValueError):
                bound = "NUMBER"
            part = f"[{found['output'].strip()}]" if found["output"] else ""
            raise ConfigError(f"target {text!r}: {measure.value} takes {kind}: write {measure.value}{part}{wanted}{bound}")
        try:  # a percentage divided exactly (99.9% is 0.999, not 0.9990000000000001)
            number = Decimal(bound_text.removesuffix("%"))
            bound = float(number / 100 if bound_text.endswith("%") else number)
        except (InvalidOperation, ValueError):
            raise ConfigError(f"target {text!r}: the bound {bound_text!r} is not a number") from None
        if not math.isfinite(bound):
            raise ConfigError(f"target {text!r}: the bound must be a finite number")
        return cls(measure, bound, found["output"].strip() if found["output"] else None)

    def check(self, judged: Sequence[JudgedOutput], labelled: bool) -> None:
        """The target applies to a model whose outputs are ``judged`` (and whose inputs have labels when
        ``labelled``); else a ``ConfigError`` naming what is missing."""
        labels = [j.label for j in judged]
        if self.output is not None and self.output not in labels:
            raise ConfigError(f"target {self.text}: the model has no output or part {self.output!r} "
                              f"(its outputs and parts: {', '.join(labels)})")
        if self.measure in (Measure.TOP1, Measure.ACCURACY_DROP):
            scores = [j for j in judged if j.axis is None and j.kind is OutputKind.CLASS_SCORES]
            if not scores:
                listed = "; ".join(f"{j.output}: {j.kind_name}" for j in judged if j.axis is None)
                raise ConfigError(f"target {self.text} needs a class-scores output, and the model has none declared or "
                                  f"inferred ({listed}); declare one in the pipeline's [evaluation] outputs, or use sqnr>=DB")
        if self.measure is Measure.ACCURACY_DROP and not labelled:
            raise ConfigError(f"target {self.text} needs labelled inputs: give --labels FILE (sample name -> class), "
                              "or use top1>=X (agreement with the float model)")


def parse_targets(texts: Sequence[str]) -> tuple[Target, ...]:
    """Every target given (each parsed as ``Target.parse``); the same target twice is refused."""
    targets = tuple(Target.parse(t) for t in texts)
    seen = [t.text for t in targets]
    twice = sorted({t for t in seen if seen.count(t) > 1})
    if twice:
        raise ConfigError(f"target {twice[0]} is given twice")
    return targets
