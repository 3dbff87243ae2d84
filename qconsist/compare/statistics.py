"""How two versions of one tensor differ, element by element: the one definition every comparison uses.

Rules (the same for diff, locate, the fp16 analysis, the pipeline's checks and the gate):

* **equal** means bit-identical. An element differs when its bytes differ: ``+0``/``-0`` differ (by 0.0),
  and so do two NaNs with other payloads; a NaN against a number differs by ``inf``.
* **ULP distance** (floats): the distance of the two values' ordered bit patterns, exact for float16 and
  float32 (``ulp_distance``); NaN and Inf elements are left out of it.
* **integer histogram** of differences ``b − a``: exact values from ``-HISTOGRAM_LIMIT`` to ``+HISTOGRAM_LIMIT``,
  larger ones counted together as ``<-N`` / ``>+N``.
* **tolerance** (optional, ``atol + rtol·|a|`` as ``numpy.isclose``): ``mismatched`` counts the elements
  beyond it; without tolerances every differing element is a mismatch.
* **relative difference** is ``|b − a| / |a|`` (``inf`` where ``a`` is 0 and ``b`` is not).

**Figures that mean something** (``noise_figure``, ``sqnr_phrase``, ``sqnr_cell``: the one wording every printer
uses, the CLI, the HTML report and the gate's text): an SQNR is a measurement only where there is a signal and a
difference. Two versions whose every element is equal are **identical** (never "337.9 dB": that figure is the
float epsilon's, not the tensor's); a reference of zeros has **zero signal** and no SQNR (never "0.00 dB, cosine
1.0"). Neither is ranked by the SQNR a node adds (quant-error's ``--sort added``).

``TensorStats`` accumulates over samples and never keeps the arrays, so memory does not grow with the
sample count; ``message()`` is the one mismatch text ("Mismatched elements: k / n (p%) …").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qconsist.store.serde import serialized

HISTOGRAM_LIMIT = 8

_INT_OF_FLOAT = {2: np.int16, 4: np.int32, 8: np.int64}


def _ordered(values: np.ndarray) -> np.ndarray:
    """Float bit patterns mapped to int64 in value order (``-0`` and ``+0`` coincide)."""
    itype = _INT_OF_FLOAT[values.dtype.itemsize]
    bits = np.ascontiguousarray(values).view(itype).astype(np.int64)
    magnitude = bits & np.int64(np.iinfo(itype).max)
    return np.where(bits < 0, -magnitude, bits)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Greatest distance in units in the last place between two float arrays of one type (0 for other
    types, and for elements where either side is NaN or infinite)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind != "f" or a.dtype != b.dtype or a.shape != b.shape or a.size == 0:
        return 0
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return 0
    a, b = a[finite], b[finite]
    if a.dtype.itemsize in (2, 4):
        return int(np.abs(_ordered(a) - _ordered(b)).max())
    # float64: ordered patterns can be 2**64 apart; Python integers hold the greatest one exactly
    oa, ob = _ordered(a), _ordered(b)
    where = int(np.argmax(np.abs(oa.astype(np.float64) - ob.astype(np.float64))))
    return abs(int(oa[where]) - int(ob[where]))


def _bucket(step: int) -> str:
    if step > HISTOGRAM_LIMIT:
        return f">+{HISTOGRAM_LIMIT}"
    if step < -HISTOGRAM_LIMIT:
        return f"<-{HISTOGRAM_LIMIT}"
    return f"{step:+d}"


def differing_mask(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elements whose bytes differ (same shape and dtype assumed), flattened."""
    itemsize = a.dtype.itemsize
    if itemsize in (1, 2, 4, 8):
        view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
        return np.ascontiguousarray(a).view(view).ravel() != np.ascontiguousarray(b).view(view).ravel()
    rows_a = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, itemsize)
    rows_b = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, itemsize)
    return (rows_a != rows_b).any(axis=1)


def _mismatched(data: dict[str, Any]) -> dict[str, Any]:
    """Statistics recorded before tolerances: every differing element was a mismatch."""
    return {"mismatched": data["differing"], **data}


@serialized(derived=("fraction", "percent"), renames={"tensor": "name", "total": "elements"}, upgrade=_mismatched)
@dataclass
class TensorStats:
    """Running statistics of the differences between run A's and run B's version of one tensor (B − A).

    ``atol``/``rtol`` None: no tolerance, every differing element is a mismatch."""

    name: str = ""
    atol: float | None = None
    rtol: float | None = None
    dtype: str = ""
    elements: int = 0
    differing: int = 0  # elements whose bytes differ
    mismatched: int = 0  # differing elements beyond the tolerance (all of them without one)
    max_abs: float = 0.0
    max_abs_at: tuple[int, tuple[int, ...]] | None = None  # (sample, index) of the greatest difference
    max_rel: float = 0.0
    max_ulp: int | None = None  # floats only
    histogram: dict[str, int] | None = None  # integers only
    samples: list[int] = field(default_factory=list)  # samples where the tensor differs

    @property
    def percent(self) -> float:
        return 100.0 * self.mismatched / self.elements if self.elements else 0.0

    @property
    def fraction(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    def add(self, sample: int, a: np.ndarray, b: np.ndarray) -> bool:
        """Compare one sample's two versions; returns whether any byte differs."""
        a, b = np.asarray(a), np.asarray(b)
        self.dtype = self.dtype or a.dtype.name
        self.elements += int(max(a.size, b.size))
        if a.shape != b.shape or a.dtype != b.dtype:
            self.differing += int(max(a.size, b.size))
            self.mismatched += int(max(a.size, b.size))
            self.samples.append(sample)
            self._greatest(math.inf, sample, ())
            return True
        differs = differing_mask(a, b)
        count = int(np.count_nonzero(differs))
        if not count:
            return False
        self.differing += count
        self.samples.append(sample)
        fa, fb = a.ravel()[differs].astype(np.float64), b.ravel()[differs].astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(fb - fa)
        both_nan = np.isnan(fa) & np.isnan(fb)
        diff = np.where(both_nan, 0.0, np.nan_to_num(diff, nan=math.inf, posinf=math.inf))
        if self.atol is not None and self.rtol is not None:
            with np.errstate(invalid="ignore"):
                beyond = ~(diff <= self.atol + self.rtol * np.abs(fa))
            self.mismatched += int(np.count_nonzero(beyond & ~both_nan))
        else:
            self.mismatched += count
        where = int(np.argmax(diff))
        flat_index = int(np.flatnonzero(differs)[where])
        self._greatest(float(diff[where]), sample, tuple(int(i) for i in np.unravel_index(flat_index, a.shape)))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(diff == 0, 0.0, diff / np.abs(fa))
        self.max_rel = max(self.max_rel, float(np.nan_to_num(rel, nan=math.inf, posinf=math.inf).max()))
        if a.dtype.kind == "f":
            self.max_ulp = max(self.max_ulp or 0, ulp_distance(a.ravel()[differs], b.ravel()[differs]))
        elif a.dtype.kind in "iub":
            steps = b.ravel()[differs].astype(np.int64) - a.ravel()[differs].astype(np.int64)
            values, counts = np.unique(np.clip(steps, -HISTOGRAM_LIMIT - 1, HISTOGRAM_LIMIT + 1), return_counts=True)
            histogram = self.histogram if self.histogram is not None else {}
            for value, n in zip(values.tolist(), counts.tolist()):
                histogram[_bucket(value)] = histogram.get(_bucket(value), 0) + int(n)
            self.histogram = histogram
        return True

    def _greatest(self, value: float, sample: int, index: tuple[int, ...]) -> None:
        if self.max_abs_at is None or value > self.max_abs:
            self.max_abs, self.max_abs_at = value, (sample, index)

    def message(self, where: str = "") -> str:
        """torch.testing's wording: mismatched share, greatest absolute and relative difference and where."""
        text = f"Mismatched elements: {self.mismatched} / {self.elements} ({self.percent:.1f}%)"
        if not self.differing:
            return text
        at = ""
        if self.max_abs_at is not None:
            sample, index = self.max_abs_at
            at = f" at index {tuple(index)} of sample {sample}" if index else f" in sample {sample}"
        tolerance = f" (atol {self.atol}, rtol {self.rtol})" if self.atol is not None else ""
        text += f"; greatest absolute difference {self.max_abs:.6g}{at}; greatest relative difference {self.max_rel:.6g}{tolerance}"
        if self.max_ulp:
            text += f"; greatest ULP distance {self.max_ulp}"
        if self.histogram:
            text += "; integer differences " + ", ".join(f"{k}: {v}" for k, v in histogram_items(self.histogram))
        return f"{where}: {text}" if where else text


IDENTICAL, ZERO_SIGNAL, MEASURED = "identical", "zero-signal", "measured"


def noise_figure(elements: int, signal: float, noise: float, nonfinite: int = 0) -> str:
    """What an SQNR over these sums is: ``identical`` (no element differs: no noise), ``zero-signal`` (the
    reference is all zero: no signal to measure noise against) or ``measured``."""
    if elements and noise == 0 and not nonfinite:
        return IDENTICAL
    if signal == 0 and not nonfinite:
        return ZERO_SIGNAL
    return MEASURED


def sqnr_phrase(sqnr_db: float | None, figure: str = MEASURED, digits: int = 1) -> str:
    """"SQNR 41.4 dB", "identical" or "zero signal (the reference is all zero)": the one wording of an SQNR."""
    if figure == IDENTICAL:
        return "identical"
    if figure == ZERO_SIGNAL:
        return "zero signal (the reference is all zero)"
    return "SQNR -" if sqnr_db is None else f"SQNR {sqnr_db:.{digits}f} dB"


def sqnr_cell(sqnr_db: float | None, figure: str = MEASURED, digits: int = 2) -> str:
    """An SQNR in a table's dB column: the number, "identical" or "zero signal"."""
    if figure == IDENTICAL:
        return "identical"
    if figure == ZERO_SIGNAL:
        return "zero signal"
    return "-" if sqnr_db is None else f"{sqnr_db:.{digits}f}"


def histogram_items(histogram: dict[str, int]) -> list[tuple[str, int]]:
    """Histogram buckets in value order, the open-ended ones at the ends."""
    def key(item: tuple[str, int]) -> float:
        label = item[0]
        if label.startswith(">"):
            return math.inf
        if label.startswith("<"):
            return -math.inf
        return float(int(label))

    return sorted(histogram.items(), key=key)
