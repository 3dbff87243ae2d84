"""Quantization noise: how far an observed tensor lies from its float reference, accumulated over samples.

The one definition of the signal-to-quantization-noise ratio qconsist uses, the one ONNX Runtime's
``qdq_loss_debug.compute_signal_to_quantized_noise_ratio`` computes over a list of samples (the samples
concatenated): ``SQNR = 20·log10(‖x‖ / ‖x − y‖)`` dB, each norm at least the float epsilon, with ``x`` the
float reference and ``y`` the quantized model's value. ``NoiseStats`` keeps sums in float64, never the arrays,
so memory does not grow with the sample count. Elements where either side is NaN or infinite are
counted apart (``nonfinite``) and left out of the sums. ``figure`` says whether the SQNR is a measurement
(``qconsist.compare.statistics.noise_figure``): two identical versions, or a reference of zeros, have none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qconsist.compare.statistics import MEASURED, noise_figure

_EPSILON = float(np.finfo("float").eps)


@dataclass
class NoiseStats:
    """Sums over every element of every sample added so far."""

    elements: int = 0
    signal: float = 0.0  # Σ x²
    noise: float = 0.0  # Σ (x − y)²
    cross: float = 0.0  # Σ x·y
    observed: float = 0.0  # Σ y²
    absolute: float = 0.0  # Σ |x − y|
    max_abs: float = 0.0
    nonfinite: int = 0  # elements where x or y is NaN or infinite (left out of the sums)

    def add(self, reference: np.ndarray, observed: np.ndarray) -> None:
        # float32 tensors stay float32 (no copies); numpy's pairwise summation keeps the sums' relative error
        # near 1e-7 whatever the element count, far below what a dB figure shows
        dtype = np.result_type(np.asarray(reference).dtype, np.asarray(observed).dtype, np.float32)
        x = np.asarray(reference, dtype=dtype).ravel()
        y = np.asarray(observed, dtype=dtype).ravel()
        if x.shape != y.shape:
            raise ValueError(f"reference has {x.size} elements, observed {y.size}")
        d = x - y
        finite = np.isfinite(d)
        if not finite.all():
            self.nonfinite += int(d.size - finite.sum())
            x, y, d = x[finite], y[finite], d[finite]
        self.elements += int(x.size)
        self.signal += float(np.sum(x * x))
        self.noise += float(np.sum(d * d))
        self.cross += float(np.sum(x * y))
        self.observed += float(np.sum(y * y))
        if d.size:
            a = np.abs(d)
            self.absolute += float(a.sum())
            self.max_abs = max(self.max_abs, float(a.max()))

    @property
    def sqnr_db(self) -> float:
        """``20·log10(max(‖x‖, ε) / max(‖x − y‖, ε))``, as onnxruntime's qdq_loss_debug computes it."""
        return 20 * math.log10(max(math.sqrt(self.signal), _EPSILON) / max(math.sqrt(self.noise), _EPSILON))

    @property
    def figure(self) -> str:
        """``identical``, ``zero-signal`` or ``measured`` (``noise_figure``)."""
        return noise_figure(self.elements, self.signal, self.noise, self.nonfinite)

    @property
    def measured_sqnr_db(self) -> float | None:
        """The SQNR where it measures something; None for identical versions and a reference of zeros."""
        return self.sqnr_db if self.figure == MEASURED else None

    @property
    def mse(self) -> float:
        return self.noise / self.elements if self.elements else 0.0

    @property
    def mean_abs(self) -> float:
        return self.absolute / self.elements if self.elements else 0.0

    @property
    def cosine(self) -> float:
        """Cosine similarity of the reference and the observed values (1 when both are all zero)."""
        norm = math.sqrt(self.signal) * math.sqrt(self.observed)
        return self.cross / norm if norm else (1.0 if self.signal == self.observed == 0 else 0.0)
