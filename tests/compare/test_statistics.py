"""The comparison kernel's element statistics, against independent numpy computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qconsist.compare import HISTOGRAM_LIMIT, TensorStats, ulp_distance
from qconsist.store.serde import dumps, loads


def test_ulp_distance_of_neighbouring_floats():
    a = np.array([1.0, -1.0, 0.0, 3.5], np.float32)
    b = np.nextafter(np.nextafter(a, np.float32(np.inf)), np.float32(np.inf))
    assert ulp_distance(a, b) == 2
    assert ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32)) == 0
    half = np.array([1.0], np.float16)
    assert ulp_distance(half, np.nextafter(half, np.float16(2))) == 1
    # across zero: -tiny to +tiny is two steps
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    assert ulp_distance(np.array([-tiny]), np.array([tiny])) == 2
    double = np.array([1.0, 2.0], np.float64)
    assert ulp_distance(double, np.nextafter(double, 3.0)) == 1
    assert ulp_distance(np.array([np.nan], np.float32), np.array([1.0], np.float32)) == 0  # left out


def test_integer_histogram_and_counts():
    a = np.array([0, 10, -5, 7, 100, 0], np.int8)
    b = np.array([1, 10, -6, 3, 127, 9], np.int8)
    stats = TensorStats("t")
    assert stats.add(0, a, b)
    assert stats.differing == 5 and stats.elements == 6 and stats.mismatched == 5
    assert stats.histogram == {"+1": 1, "-1": 1, "-4": 1, f">+{HISTOGRAM_LIMIT}": 2}
    assert stats.max_abs == 27.0 and stats.max_abs_at == (0, (4,))
    assert stats.samples == [0]
    assert stats.message("node x") == (
        "node x: Mismatched elements: 5 / 6 (83.3%); greatest absolute difference 27 at index (4,) of sample 0; "
        f"greatest relative difference inf; integer differences -4: 1, -1: 1, +1: 1, >+{HISTOGRAM_LIMIT}: 2"
    )


def test_float_statistics_match_numpy():
    rng = np.random.default_rng(7)
    a = rng.normal(0, 3, (2, 5, 7)).astype(np.float32)
    b = a.copy()
    b[0, 1, 2] += 0.5
    b[1, 4, 6] = np.nextafter(b[1, 4, 6], np.float32(100))
    stats = TensorStats("f")
    stats.add(3, a, b)
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    assert stats.differing == int((a != b).sum()) == 2
    assert stats.max_abs == float(diff.max()) and stats.max_abs_at == (3, (0, 1, 2))
    assert stats.max_rel == pytest.approx(float((diff / np.abs(a.astype(np.float64))).max()))
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ordered = lambda x: np.where(x < 0, -(x & 0x7FFFFFFF), x)  # noqa: E731
    assert stats.max_ulp == int(np.abs(ordered(ia) - ordered(ib)).max())


def test_equal_means_bit_identical():
    stats = TensorStats("z")
    assert stats.add(0, np.array([0.0, np.nan], np.float32), np.array([-0.0, np.nan], np.float32))
    assert stats.differing == 1 and stats.max_abs == 0.0  # -0 vs +0: other bits, same value
    same = TensorStats("s")
    assert not same.add(0, np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    nan = TensorStats("n")
    nan.add(0, np.array([1.0, 2.0]), np.array([np.nan, 2.0]))
    assert nan.max_abs == math.inf and nan.differing == 1


def test_tolerance_counts_only_what_is_beyond_it():
    a = np.array([1.0, 2.0, 100.0, 0.0])
    b = np.array([1.0 + 1e-6, 2.1, 100.05, 0.0])
    stats = TensorStats("t", atol=1e-5, rtol=1e-3)
    stats.add(0, a, b)
    expected = int(np.count_nonzero(~np.isclose(b, a, rtol=1e-3, atol=1e-5)))
    assert stats.differing == 3 and stats.mismatched == expected == 1
    assert not stats.passed
    assert stats.message().startswith("Mismatched elements: 1 / 4 (25.0%); greatest absolute difference 0.1 at index (1,)")


def test_shape_mismatch_and_round_trip():
    stats = TensorStats("s")
    stats.add(0, np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert stats.max_abs == math.inf and stats.mismatched == 6
    again = TensorStats.from_json(loads(dumps(stats)))
    assert again == stats
    assert '"max_abs": null' in dumps(stats) and '"/max_abs": "inf"' in dumps(stats)
