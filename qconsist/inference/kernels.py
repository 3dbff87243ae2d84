"""One pass over a tensor's memory: its ``qc-mix64/1`` hash, min, max, sum and NaN / Inf counts (numba).

**qc-mix64/1**, the hash of a tensor's exact bytes (C order), defined so that any number of threads — CPU
cores here, CUDA threads in ``qconsist.inference.device`` — computes the same value in integer arithmetic:

* the bytes are read as little-endian 64-bit words ``w[0] … w[m-1]`` (the last one padded with zero bytes);
* each word is keyed by its position and mixed by a bijection (murmur3's ``fmix64``):
  ``t[i] = fmix64(w[i] ^ ((i + 1) · K1))``;
* the terms are added modulo 2**64 (order-free, so threads may add them in any order), and the sum is
  finalized with the byte count: ``hash = fmix64(S ^ (n · K2))``.

A change of one word changes exactly one term, so it always changes the hash; changes of several words
cancel with probability about 2**-64. Its speed comes from needing no sequential state: 2 multiplications
per 8 bytes, vectorized by LLVM (27 GB/s on one core here, as fast as xxh3).

Statistics: min and max over finite values, their sum (float64 for floats and wide integers, exact int64 for
1- and 2-byte integers), the NaN and Inf counts. Float min and max compare the values' bits as integers
(negatives' magnitude bits flipped), which LLVM vectorizes where a float comparison is not (8× faster). A
float tensor without NaN or Inf is read once for statistics; one holding them a second time, for exact
counts. The hash and the statistics are two loops over the tensor. Fusing them was tried: a blocked loop
(hash 1024–8192 words, then scan their values) vectorized neither loop (8–16× slower, 174–186 ms for 104 MB
of float32); a float32-only loop reading each word and its two values was 21–33 ms against 36–37 ms for the
two loops (2 loaded cores), not adopted yet: it would compute statistics that ``FingerprintTable`` now skips
for tensors equal to the previous sample's (weights). numba's ``prange`` over blocks of one tensor was 50×
slower on the 2 loaded cores here; the cores are used by columns instead: a dump's two threads each take whole
tensors (``fingerprint.RowWork``; these kernels release the GIL).
"""

from __future__ import annotations

import struct

import numpy as np

HASH_NAME = "qc-mix64/1"

K1 = 0x9E3779B97F4A7C15  # position key (the golden ratio)
K2 = 0xC2B2AE3D27D4EB4F  # length key
M1 = 0xFF51AFD7ED558CCD  # murmur3 fmix64
M2 = 0xC4CEB9FE1A85EC53

_compiled: dict[str, object] = {}

# Small tensors (a classifier's outputs) are fingerprinted with numpy where that gives the kernels' exact values
# (``_small_statistics``; the hash is integer arithmetic, the same in any order), for the first ``NUMPY_BUDGET``
# calls of a process (a hash and the statistics per tensor): a run of up to 20,000 samples of a classifier never
# imports numba (1.2 s of a 32-sample run's start-up here); numpy takes 0.08 ms per tensor of 2 values, the
# kernels 0.024 ms once imported, so the import pays for itself from about 20,000 tensors on. The records are
# the same either way (tests/inference/test_kernels.py).
SMALL = 4096  # elements
NUMPY_BUDGET = 40_000
_numpy_left = [NUMPY_BUDGET]


def _numpy_turn(size: int) -> bool:
    """Whether a tensor of ``size`` elements is fingerprinted with numpy (counted against the budget)."""
    if _compiled or size > SMALL or _numpy_left[0] <= 0:
        return False
    _numpy_left[0] -= 1
    return True


def _kernels() -> dict[str, object]:
    if not _compiled:
        from qconsist.inference import _compiled as compiled  # numba: imported on the first fingerprint

        _compiled.update(hash_words=compiled.hash_words, stats=compiled.stats, int_stats=compiled.int_stats,
                         finite_stats=compiled.finite_stats)
    return _compiled


def prepare(dtypes: "list[str] | tuple[str, ...]") -> None:
    """Load the compiled kernels and every specialization a dump of tensors of ``dtypes`` will call, now:
    numba finds the machine code in its cache, but the first call of each signature still imports numba's
    typing modules and loads that code (1.1–2.1 s on the 2 cores here, more where Python writes no bytecode),
    which a dump otherwise paid in its first sample. A dump calls this once before its first step, in its
    worker thread (``recording.HostDump``)."""
    for name in dict.fromkeys(dtypes):
        try:
            kind = np.dtype(name)
        except TypeError:
            continue
        if kind.kind not in "fiub":
            continue
        sample = np.zeros(SMALL + 1, dtype=kind)
        kernels = _kernels()
        words = sample.view(np.uint8)[: sample.nbytes // 8 * 8].view(np.uint64)
        kernels["hash_words"](words, 0)  # type: ignore[operator]
        statistics(sample)
        if kind.kind == "f" and kind in _FAST:  # float16 and the like: numpy computes their statistics
            kernels["finite_stats"](sample)  # type: ignore[operator]  # read when a tensor holds NaN or Inf


def _fmix(x: int) -> int:
    x &= 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * M1) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 33
    x = (x * M2) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 33)


def finalize(total: int, nbytes: int) -> int:
    """The hash of ``nbytes`` bytes whose terms add up to ``total`` (mod 2**64)."""
    return _fmix((int(total) ^ (nbytes * K2)) & 0xFFFFFFFFFFFFFFFF)


def _layout(array: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(contiguous 8-byte-aligned array, its full words, the tail word's value, byte count)."""
    arr = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    nbytes = arr.nbytes
    if nbytes % 8 == 0 and arr.ndim:  # most tensors: their words are a view, no byte slicing (per-tensor overhead)
        words = arr.reshape(-1).view(np.uint64)
        if words.flags.aligned:  # numpy's test of the address against 8 bytes (``ctypes.data`` took 3.5 us a tensor)
            return arr, words, 0, nbytes
    if arr.size and arr.ctypes.data % 8:
        arr = arr.copy()  # a slice at an odd offset: the words must be aligned
    raw = arr.reshape(-1).view(np.uint8)
    full = nbytes // 8
    words = raw[: full * 8].view(np.uint64)
    tail = int.from_bytes(raw[full * 8 :].tobytes(), "little") if nbytes % 8 else 0
    return arr, words, tail, nbytes


def _tail_term(tail: int, nbytes: int) -> int:
    if nbytes % 8 == 0:
        return 0
    index = nbytes // 8
    return _fmix(tail ^ (((index + 1) * K1) & 0xFFFFFFFFFFFFFFFF))


def mix64(array: np.ndarray) -> int:
    """The ``qc-mix64/1`` hash of ``array``'s bytes (C order)."""
    arr, words, tail, nbytes = _layout(np.asarray(array))
    if not words.size:
        total = 0
    elif _numpy_turn(words.size):
        total = _hash_words_numpy(words)
    else:
        total = int(_kernels()["hash_words"](words, 0))  # type: ignore[operator]
    return finalize(total + _tail_term(tail, nbytes), nbytes)


def _hash_words_numpy(words: np.ndarray) -> int:
    """``_compiled.hash_words(words, 0)``: the same terms, added modulo 2**64 (numpy's uint64 wraps)."""
    x = words ^ (np.arange(1, words.size + 1, dtype=np.uint64) * np.uint64(K1))
    for multiplier in (M1, M2):
        x ^= x >> np.uint64(33)
        x *= np.uint64(multiplier)
    x ^= x >> np.uint64(33)
    return int(np.add.reduce(x, dtype=np.uint64))


_FAST = {np.dtype(t) for t in ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")}
_EXACT_INT = {np.dtype(t) for t in ("int8", "uint8", "int16", "uint16")}


def statistics(array: np.ndarray) -> tuple[float, float, float, int, int] | None:
    """(min, max, mean, nan, inf) over the finite values, as ``fingerprint.fingerprint`` defines them, or
    ``None`` for element types the kernels do not read (the caller computes those with numpy)."""
    values = np.asarray(array)
    values = (values if values.flags.c_contiguous else np.ascontiguousarray(values)).reshape(-1)
    if values.dtype == np.bool_:
        values = values.view(np.uint8)
    if values.dtype not in _FAST or values.size == 0:
        return None
    if values.size <= SMALL and not _compiled and _numpy_left[0] > 0:
        found = _small_statistics(values)
        if found is not None:
            _numpy_turn(values.size)
            return found
    kernels = _kernels()
    constants = _CONSTANTS.get(values.dtype) or _constants(values.dtype)
    if values.dtype.kind == "f":
        bits, mask, shift, lo_key, hi_key = constants
        lo, hi, s = kernels["stats"](values, values.view(bits), mask, shift, lo_key, hi_key, np.float64(0.0))  # type: ignore[operator]
        if not np.isfinite(s):  # a NaN or an Inf: read again for exact counts
            lo, hi, s, count, nan, inf = kernels["finite_stats"](values)  # type: ignore[operator]
            if count == 0:
                return np.nan, np.nan, np.nan, int(nan), int(inf)
            return float(lo), float(hi), float(s) / count, int(nan), int(inf)
        decode = _DECODE[values.dtype]
        return decode(int(lo)), decode(int(hi)), float(s) / values.size, 0, 0
    lo_start, hi_start, acc = constants
    lo, hi, s = kernels["int_stats"](values, lo_start, hi_start, acc)  # type: ignore[operator]
    mean = (int(s) if values.dtype in _EXACT_INT else float(s)) / values.size
    return float(lo), float(hi), float(mean), 0, 0


_CONSTANTS: dict[np.dtype, tuple] = {}  # per element type: what ``statistics`` passes the kernels (made once)


def _key_decoder(size: int, code: str):
    """The value of an ordered key (``stats``: a float's bits, magnitude bits flipped for negatives) of a float of
    ``size`` bytes: the flip undone, the bits read as the float (Python integers and ``struct``: a few numpy
    scalar conversions per tensor were a tenth of the bookkeeping of a dump's row)."""
    shift, mask = 8 * size - 1, (1 << (8 * size - 1)) - 1
    signed, floating = struct.Struct(f"<{'q' if size == 8 else 'i'}"), struct.Struct(f"<{code}")

    def decode(key: int) -> float:
        return floating.unpack(signed.pack(key ^ ((key >> shift) & mask)))[0]

    return decode


_DECODE = {np.dtype(np.float32): _key_decoder(4, "f"), np.dtype(np.float64): _key_decoder(8, "d")}


def _constants(dtype: np.dtype) -> tuple:
    if dtype.kind == "f":
        bits = np.dtype(f"int{8 * dtype.itemsize}")
        info = np.iinfo(bits)
        found: tuple = (bits, bits.type(info.max), bits.type(8 * dtype.itemsize - 1), bits.type(info.max), bits.type(info.min))
    else:
        info = np.iinfo(dtype)
        found = (dtype.type(info.max), dtype.type(info.min), np.int64(0) if dtype in _EXACT_INT else np.float64(0.0))
    _CONSTANTS[dtype] = found
    return found


def _ordered_extremes(values: np.ndarray) -> tuple[float, float]:
    """min and max as the kernels find them: floats compared by their bits ordered as the values (so -0.0 is
    below 0.0, whatever comes first)."""
    bits = np.dtype(f"int{8 * values.itemsize}")
    raw = values.view(bits)
    keys = raw ^ ((raw >> bits.type(8 * values.itemsize - 1)) & bits.type(np.iinfo(bits).max))
    lo, hi = keys.min(), keys.max()
    back = np.array([lo, hi], dtype=bits)
    back ^= (back >> bits.type(8 * values.itemsize - 1)) & bits.type(np.iinfo(bits).max)
    low, high = back.view(values.dtype)
    return float(low), float(high)


def _small_statistics(values: np.ndarray) -> tuple[float, float, float, int, int] | None:
    """``statistics`` of a small contiguous 1-D array computed with numpy, where that is the kernels' exact
    result, else ``None``. Integers and float arrays holding NaN or Inf: the kernels add in order (no
    reassociation), so a sequential ``accumulate`` in float64 (int64 for 1- and 2-byte integers) repeats them.
    Finite float arrays: the kernels' sum is reassociated (vectorized, in an order that depends on the CPU); it
    is taken only when every partial sum in any order is exact in float64 — the values' magnitudes span at
    most 53 - p - log2(n) binary orders (p = 24 bits of float32; float64 practically never)."""
    n = values.size
    if values.dtype.kind in "iu":
        lo, hi = values.min(), values.max()
        if values.dtype in _EXACT_INT:
            total = int(values.sum(dtype=np.int64))
            return float(lo), float(hi), float(total / n), 0, 0
        total = np.add.accumulate(values.astype(np.float64))[-1]
        return float(lo), float(hi), float(total) / n, 0, 0
    finite = np.isfinite(values)
    if not finite.all():
        nan = int(np.isnan(values).sum())
        inf = n - int(finite.sum()) - nan
        kept = values[finite]
        if kept.size == 0:
            return np.nan, np.nan, np.nan, nan, inf
        zeros = kept[kept == 0]
        if zeros.size and np.signbit(zeros).any() and not np.signbit(zeros).all():
            return None  # which zero the kernel's min/max keeps depends on their order
        total = np.add.accumulate(kept.astype(np.float64))[-1]
        return float(kept.min()), float(kept.max()), float(total) / kept.size, nan, inf
    nonzero = values[values != 0]
    if nonzero.size:
        _, exponents = np.frexp(nonzero)
        mantissa = 24 if values.dtype == np.float32 else 53
        if int(exponents.max()) - int(exponents.min()) + mantissa + int(np.ceil(np.log2(n))) > 53:
            return None
    lo, hi = _ordered_extremes(values)
    return lo, hi, float(values.sum(dtype=np.float64)) / n, 0, 0
