"""Fingerprints of tensors: 56 bytes per tensor per sample, streamed to a ``.npy`` table.

A fingerprint holds the xxh3-64 hash of the tensor's exact bytes (C order), min, max and mean (float64;
NaN for empty tensors; NaN and Inf excluded), the NaN and Inf counts, the element type and an index into
the shape table. Two tensors with the same hash, dtype and shape are taken as bit-identical.

``FingerprintTable`` writes a ``(samples × tensors)`` structured array through a memory map, one sample row
at a time, so memory does not grow with the number of samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash

RECORD = np.dtype([
    ("hash", "<u8"), ("min", "<f8"), ("max", "<f8"), ("mean", "<f8"),
    ("nan", "<u8"), ("inf", "<u8"), ("shape", "<u4"), ("dtype", "<u2"), ("present", "<u2"),
])
assert RECORD.itemsize == 56

# Element types by code (0 = not recorded). Stored in the index so readers need no ONNX.
DTYPES: tuple[str, ...] = (
    "", "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
    "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
)
_CODES = {name: code for code, name in enumerate(DTYPES)}


def dtype_code(dtype: np.dtype) -> int:
    return _CODES.get(np.dtype(dtype).name, 0) if np.dtype(dtype).kind != "V" else 0


def tensor_hash(array: np.ndarray) -> int:
    arr = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    return xxhash.xxh3_64_intdigest(arr.data.cast("B") if arr.size else b"")


_WIDTH = 4096  # elements per row of the blocked sums
_ROWS = 256  # rows summed in a 16-bit accumulator: 256 × 255 < 2**16


def _sum(flat: np.ndarray) -> float:
    """Sum of a 1-d array, fast: blocked SIMD-friendly reductions instead of a scalar float64 loop."""
    full = flat.size // _WIDTH * _WIDTH
    blocks, rest = flat[:full].reshape(-1, _WIDTH), flat[full:]
    if flat.dtype.itemsize == 1 and flat.dtype.kind in "iu":
        acc = np.int16 if flat.dtype.kind == "i" else np.uint16
        total = sum(
            int(np.add.reduce(blocks[i : i + _ROWS], axis=0, dtype=acc).sum(dtype=np.int64))
            for i in range(0, blocks.shape[0], _ROWS)
        )
        return float(total + int(rest.sum(dtype=np.int64)))
    if flat.dtype == np.float32:
        return float(blocks.sum(axis=0).sum(dtype=np.float64)) + float(rest.sum(dtype=np.float64))
    return float(flat.sum(dtype=np.float64))


def fingerprint(array: np.ndarray, shape_id: int, digest: int | None = None) -> tuple:
    """The fingerprint of ``array`` as a tuple in ``RECORD`` field order (``digest``: its hash, if known)."""
    array = np.asarray(array)
    digest, code = tensor_hash(array) if digest is None else digest, dtype_code(array.dtype)
    if array.size == 0 or array.dtype.kind not in "fiub":
        return (digest, np.nan, np.nan, np.nan, 0, 0, shape_id, code, 1)
    if array.dtype.kind == "b":
        array = array.view(np.uint8)
    lo, hi = array.min(), array.max()
    nan = inf = 0
    if array.dtype.kind == "f" and not (np.isfinite(lo) and np.isfinite(hi)):
        finite = np.isfinite(array)
        nan = int(np.isnan(array).sum())
        inf = int(array.size - int(finite.sum()) - nan)
        values = array[finite]
        if values.size == 0:
            return (digest, np.nan, np.nan, np.nan, nan, inf, shape_id, code, 1)
        lo, hi, mean = values.min(), values.max(), _sum(values) / values.size
    else:
        mean = _sum(array.reshape(-1)) / array.size
    return (digest, float(lo), float(hi), float(mean), nan, inf, shape_id, code, 1)


class ShapeTable:
    """Shapes seen in a dump, numbered in order of first appearance."""

    def __init__(self, shapes: list[tuple[int, ...]] | None = None) -> None:
        self.shapes: list[tuple[int, ...]] = list(shapes or [])
        self._ids = {shape: i for i, shape in enumerate(self.shapes)}

    def id(self, shape: tuple[int, ...]) -> int:
        found = self._ids.get(shape)
        if found is None:
            found = self._ids[shape] = len(self.shapes)
            self.shapes.append(shape)
        return found

    def to_json(self) -> list[list[int]]:
        return [list(s) for s in self.shapes]


class FingerprintTable:
    """A ``samples × tensors`` table of ``RECORD`` written row by row to a memory-mapped ``.npy`` file."""

    def __init__(self, path: Path, samples: int, tensors: int) -> None:
        self.path = Path(path)
        self._table = np.lib.format.open_memmap(self.path, mode="w+", dtype=RECORD, shape=(samples, tensors))
        self._table[:] = np.zeros((), dtype=RECORD)
        self.shapes = ShapeTable()
        self._last: list[tuple] = []  # the previous row's records

    def write_row(self, sample: int, arrays: list[np.ndarray]) -> np.ndarray:
        """Fingerprint ``arrays`` (one per column) as row ``sample``; returns the row.

        A column whose bytes hash, element type and shape equal the previous row's (a dequantized weight,
        any tensor computed from constants) reuses that row's statistics instead of recomputing them:
        equal hashes are what the comparison takes as equal bytes, so the statistics are the same.
        """
        records = []
        for column, array in enumerate(arrays):
            array = np.asarray(array)
            digest, shape_id = tensor_hash(array), self.shapes.id(array.shape)
            last = self._last[column] if column < len(self._last) else None
            if last is not None and last[0] == digest and last[6] == shape_id and last[7] == dtype_code(array.dtype):
                records.append(last)
            else:
                records.append(fingerprint(array, shape_id, digest))
        self._last = records
        row = np.array(records, dtype=RECORD)
        self._table[sample] = row
        return row

    def close(self) -> None:
        self._table.flush()
        del self._table


def read_table(path: Path) -> np.ndarray:
    """The fingerprint table of a dump, memory-mapped read-only."""
    table = np.load(Path(path), mmap_mode="r", allow_pickle=False)
    if table.dtype != RECORD or table.ndim != 2:
        raise ValueError(f"{path} is not a qconsist fingerprint table")
    return table
