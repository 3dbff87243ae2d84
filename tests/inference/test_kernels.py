"""The CPU fingerprint kernels: qc-mix64/1 against its definition, statistics against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from mix64_reference import reference_mix64
from qconsist.inference import kernels
from qconsist.inference.fingerprint import fingerprint, tensor_hash


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"])
@pytest.mark.parametrize("count", [0, 1, 3, 7, 8, 9, 1001])
def test_hash_is_qc_mix64_of_the_bytes(dtype, count):
    rng = np.random.default_rng(count)
    array = (rng.standard_normal(count) * 50).astype(dtype)
    assert tensor_hash(array) == reference_mix64(array.tobytes())


def test_hash_of_unaligned_and_strided_views_is_that_of_their_bytes():
    base = np.arange(1000, dtype=np.uint8)
    odd = base[3:3 + 500]  # starts at an odd address: copied to aligned words first
    assert tensor_hash(odd) == reference_mix64(odd.tobytes())
    strided = np.arange(64, dtype=np.float32).reshape(8, 8)[:, ::2]
    assert tensor_hash(strided) == reference_mix64(np.ascontiguousarray(strided).tobytes())


def test_every_single_bit_flip_changes_the_hash():
    array = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    raw = array.view(np.uint8)
    seen = {tensor_hash(array)}
    for byte in range(raw.size):
        for bit in range(8):
            flipped = raw.copy()
            flipped[byte] ^= 1 << bit
            seen.add(tensor_hash(flipped.view(np.float32)))
    assert len(seen) == raw.size * 8 + 1


def test_same_values_in_other_positions_hash_differently():
    array = np.arange(16, dtype=np.int32)
    swapped = array.copy()
    swapped[[2, 9]] = swapped[[9, 2]]
    assert tensor_hash(array) != tensor_hash(swapped) and tensor_hash(array) != tensor_hash(array[::-1].copy())


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_statistics_equal_numpy(dtype):
    rng = np.random.default_rng(4)
    array = (rng.standard_normal((3, 5, 7)) * 40 + (60 if dtype.startswith("u") else 0)).astype(dtype)
    lo, hi, mean, nan, inf = kernels.statistics(array)
    assert (lo, hi, nan, inf) == (float(array.min()), float(array.max()), 0, 0)
    assert mean == pytest.approx(float(array.astype(np.float64).mean()), rel=1e-12)


def test_nan_and_inf_are_counted_and_left_out():
    array = np.array([np.nan, -np.inf, 2.5, -0.0, np.inf, -7.25, np.nan], dtype=np.float32)
    assert kernels.statistics(array) == (-7.25, 2.5, (2.5 - 7.25) / 3, 2, 2)
    assert np.isnan(kernels.statistics(np.full(5, np.nan, np.float32))[:3]).all()
    assert kernels.statistics(np.full(5, np.nan, np.float32))[3:] == (5, 0)


def test_types_the_kernels_do_not_read_fall_back_to_numpy():
    half = np.array([1.5, -2.0, np.nan, 4.0], dtype=np.float16)
    assert kernels.statistics(half) is None
    record = fingerprint(half, 0)
    assert record[:6] == (reference_mix64(half.tobytes()), -2.0, 4.0, pytest.approx(3.5 / 3), 1, 0)
    assert fingerprint(np.array([True, False, True]), 0)[1:4] == (0.0, 1.0, pytest.approx(2 / 3))
