"""Element-level statistics of two versions of one tensor, accumulated over samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

_INT_OF_FLOAT = {2: np.int16, 4: np.int32, 8: np.int64}


def _ordered(array: np.ndarray) -> np.ndarray:
    """Float bits mapped to integers in value order, so |a - b| counts ULPs (±0 coincide)."""
    bits = array.view(_INT_OF_FLOAT[array.dtype.itemsize]).astype(np.int64)
    magnitude = bits & np.int64(np.iinfo(_INT_OF_FLOAT[array.dtype.itemsize]).max)
    return np.where(bits < 0, -magnitude, bits)


@dataclass
class ElementStats:
    """Differences between the elements of run A's and run B's tensor (B − A)."""

    differing: int = 0
    total: int = 0
    max_abs: float = 0.0
    max_abs_at: tuple[int, int] | None = None  # (sample, flat index)
    max_rel: float = 0.0
    max_ulp: int | None = None  # floats only
    histogram: dict[str, int] | None = None  # integers only: difference (B − A) → count
    samples: int = 0

    @property
    def percent(self) -> float:
        return 100.0 * self.differing / self.total if self.total else 0.0

    def add(self, sample: int, a: np.ndarray, b: np.ndarray) -> None:
        self.samples += 1
        self.total += int(a.size)
        if a.shape != b.shape or a.dtype != b.dtype:
            self.differing += int(max(a.size, b.size))
            self.max_abs = float("inf")
            return
        fa, fb = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
        with np.errstate(invalid="ignore"):
            diff = np.abs(fb - fa)
        nan_mismatch = np.isnan(fa) != np.isnan(fb)
        differs = (a.ravel() != b.ravel()) & ~(np.isnan(fa) & np.isnan(fb)) | nan_mismatch
        count = int(differs.sum())
        if not count:
            return
        self.differing += count
        diff = np.where(differs, np.nan_to_num(diff, nan=np.inf), 0.0)
        where = int(np.argmax(diff))
        if diff[where] > self.max_abs or self.max_abs_at is None:
            self.max_abs, self.max_abs_at = float(diff[where]), (sample, where)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(differs, diff / np.abs(fa), 0.0)
        self.max_rel = max(self.max_rel, float(np.nanmax(rel)))
        if a.dtype.kind == "f":
            ulp = np.abs(_ordered(b.ravel()) - _ordered(a.ravel()))
            self.max_ulp = max(self.max_ulp or 0, int(ulp[differs].max()))
        elif a.dtype.kind in "iub":
            steps = (b.ravel().astype(np.int64) - a.ravel().astype(np.int64))[differs]
            values, counts = np.unique(steps, return_counts=True)
            histogram = self.histogram or {}
            for value, n in zip(values.tolist(), counts.tolist()):
                key = f"{value:+d}"
                histogram[key] = histogram.get(key, 0) + int(n)
            self.histogram = histogram

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if np.isfinite(x) else str(x)

        return {
            "differing": self.differing, "total": self.total, "percent": self.percent,
            "max_abs": num(self.max_abs), "max_abs_at": list(self.max_abs_at) if self.max_abs_at else None,
            "max_rel": num(self.max_rel), "max_ulp": self.max_ulp, "histogram": self.histogram,
            "samples": self.samples,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ElementStats":
        return cls(
            differing=data["differing"], total=data["total"], max_abs=float(data["max_abs"]),
            max_abs_at=tuple(data["max_abs_at"]) if data["max_abs_at"] else None,  # type: ignore[arg-type]
            max_rel=float(data["max_rel"]), max_ulp=data["max_ulp"], histogram=data["histogram"],
            samples=data["samples"],
        )


@dataclass
class OutputStats:
    """Final outputs of the two runs: greatest difference and top-1 agreement (first output, per sample)."""

    samples: int = 0
    differing_samples: list[int] = field(default_factory=list)
    max_abs: float = 0.0
    top1_agree: int = 0

    def add(self, sample: int, a: list[np.ndarray], b: list[np.ndarray]) -> None:
        self.samples += 1
        same = all(x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b))
        if not same:
            self.differing_samples.append(sample)
            for x, y in zip(a, b):
                if x.shape == y.shape and x.size:
                    self.max_abs = max(self.max_abs, float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
        if a and b and a[0].size and a[0].shape == b[0].shape:
            self.top1_agree += int(np.argmax(a[0].reshape(a[0].shape[0], -1)[0]) == np.argmax(b[0].reshape(b[0].shape[0], -1)[0]))

    @property
    def top1_agreement(self) -> float:
        return self.top1_agree / self.samples if self.samples else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples, "differing_samples": self.differing_samples, "max_abs": self.max_abs,
            "top1_agreement": self.top1_agreement,
        }
