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
    # a float32 tensor whose byte count is a multiple of 8 but whose address is not: its words cannot be a view
    floats = np.frombuffer(np.arange(40, dtype=np.float32).tobytes() * 2, dtype=np.float32, count=32, offset=4)
    assert floats.ctypes.data % 8 == 4 and floats.nbytes % 8 == 0
    assert tensor_hash(floats) == reference_mix64(floats.tobytes())
    assert tensor_hash(floats.reshape(4, 8)) == tensor_hash(floats.copy())
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


def _arrays():
    """Small arrays of every type the kernels read: wide and narrow magnitudes, NaN, Inf, signed zeros."""
    rng = np.random.default_rng(11)
    for size in (1, 2, 3, 15, 16, 17, 63, 64, 65, 1000, 4096):
        for dtype in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
            info = np.iinfo(dtype)
            yield rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        for dtype in ("float32", "float64"):
            yield rng.standard_normal(size).astype(dtype)  # narrow: exact sums for float32
            yield (rng.standard_normal(size) * 10.0 ** rng.integers(-30, 30, size)).astype(dtype)  # wide
            soft = np.exp(rng.standard_normal(size) * 8).astype(dtype)
            yield soft / soft.sum()  # a softmax: probabilities from 1 down to tiny
            holes = rng.standard_normal(size).astype(dtype)
            holes[rng.integers(0, size, max(1, size // 7))] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
            yield holes
        yield np.array([0.0, -0.0] * size, np.float32)
        yield np.array([-0.0, 0.0, np.nan] * size, np.float32)


def test_numpy_path_gives_the_kernels_values_or_declines(monkeypatch):
    """Small tensors fingerprinted without numba: the same hash always, the same statistics bit for bit
    whenever the numpy path takes them (and it takes the classifier outputs, narrow float32)."""
    compiled = kernels._kernels()
    taken = reordered = 0
    for array in _arrays():
        words = kernels._layout(array)[1]
        assert kernels._hash_words_numpy(words) == int(compiled["hash_words"](words, 0))
        numpy_result = kernels._small_statistics(array)
        monkeypatch.setattr(kernels, "_numpy_left", [0])
        numba_result = kernels.statistics(array)
        monkeypatch.undo()
        if numpy_result is not None:
            taken += 1
            assert np.array(numpy_result, np.float64).tobytes() == np.array(numba_result, np.float64).tobytes(), array
        elif array.dtype.kind == "f" and np.isfinite(array).all():
            reordered += numba_result[2] != float(array.sum(dtype=np.float64)) / array.size
    assert taken >= 130
    assert reordered > 0  # where it declines, numpy's order of addition would have changed the recorded mean
    assert kernels._small_statistics(np.random.default_rng(0).standard_normal(5).astype(np.float32)) is not None


def test_a_short_run_does_not_import_numba(tmp_path):
    """A 32-sample run of a classifier fingerprints its outputs with numpy: numba is never imported."""
    import subprocess
    import sys

    from onnx_builders import build_classifier_model, save_arrays

    model = build_classifier_model(tmp_path / "m.onnx")
    arrays = save_arrays(tmp_path / "a.npy", 32, seed=1)
    code = ("import sys; from qconsist.cli import main; sys.argv = ['qconsist', 'run', sys.argv[1], '--inputs', "
            "sys.argv[2], '--runs-dir', sys.argv[3]]\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(model), str(arrays), str(tmp_path / "runs")],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "False"
