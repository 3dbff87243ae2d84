"""The numba-compiled loops of ``kernels.py``, in a module of their own so that importing qconsist does not
import numba (about 1 s), and defined at module level so that numba's cache (``cache=True``) keeps their
machine code between processes (closures were compiled again in every process: 5 s on the first hash)."""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

from qconsist.inference.kernels import K1, M1, M2

k1, m1, m2 = uint64(K1), uint64(M1), uint64(M2)
s33 = uint64(33)


@njit(inline="always")
def fmix(x):
    x ^= x >> s33
    x *= m1
    x ^= x >> s33
    x *= m2
    x ^= x >> s33
    return x

@njit(nogil=True, cache=True)
def hash_words(words, first):
    """The sum of the ``qc-mix64/1`` terms of ``words`` (positions from ``first``). The position key is kept as a
    running sum (``(i + 1)·K1`` by adding K1 each word, the same value modulo 2**64) rather than multiplied out:
    one 64-bit multiplication fewer per word, 3.0 -> 4.5 GB/s on one core here (AVX2-width vectors)."""
    total = uint64(0)
    key = uint64(first + 1) * k1
    for i in range(words.size):
        total += fmix(words[i] ^ key)
        key += k1
    return total

@njit(nogil=True, cache=True, fastmath={"reassoc"})
def stats(values, keys, mask, shift, lo, hi, acc):
    """(min key, max key, sum) of ``values``. ``keys`` are the values as integers ordered as the
    values are (floats: their bits with the magnitude bits of negatives flipped by ``mask`` /
    ``shift``; integers: themselves, ``mask`` 0), so that min and max vectorize as integer operations."""
    s = acc
    for j in range(values.size):
        b = keys[j]
        key = b ^ ((b >> shift) & mask)
        lo = key if key < lo else lo
        hi = key if key > hi else hi
        s += values[j]
    return lo, hi, s

@njit(nogil=True, cache=True)
def int_stats(values, lo, hi, acc):
    """(min, max, sum) of integer ``values``."""
    s = acc
    for j in range(values.size):
        v = values[j]
        lo = v if v < lo else lo
        hi = v if v > hi else hi
        s += v
    return lo, hi, s

@njit(nogil=True, cache=True)
def finite_stats(values):
    """Exact (min, max, sum, count, nan, inf) over the finite values of a float array."""
    nan = 0
    inf = 0
    count = 0
    lo = np.inf
    hi = -np.inf
    s = 0.0
    for j in range(values.size):
        v = values[j]
        if v != v:
            nan += 1
        elif v == np.inf or v == -np.inf:
            inf += 1
        else:
            count += 1
            lo = min(lo, v)
            hi = max(hi, v)
            s += v
    return lo, hi, s, count, nan, inf

