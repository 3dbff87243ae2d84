"""Fingerprints of tensors: 56 bytes per tensor per sample, streamed to a ``.npy`` table.

A fingerprint holds the hash of the tensor's exact bytes (C order), min, max and mean (float64; NaN for
empty tensors; NaN and Inf excluded), the NaN and Inf counts, the element type, an index into the shape
table and the code of the hash function that made it (``HASH_FUNCTIONS``: 0 ``xxh3-64``, the tables written
before qconsist 0.1's kernels; 1 ``qc-mix64/1``, ``kernels.py``, the same function on the CPU and on the
GPU). Two tensors with the same hash, hash function, dtype and shape are taken as bit-identical; hashes of
different functions are never compared (``check_hash_functions``).

``FingerprintTable`` writes a ``(samples × tensors)`` structured array through a memory map, one sample row
at a time, so memory does not grow with the number of samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qconsist.errors import RunStoreError
from qconsist.inference import kernels

RECORD = np.dtype([
    ("hash", "<u8"), ("min", "<f8"), ("max", "<f8"), ("mean", "<f8"),
    ("nan", "<u8"), ("inf", "<u8"), ("shape", "<u4"), ("dtype", "<u2"), ("present", "u1"), ("function", "u1"),
])
assert RECORD.itemsize == 56
# Tables written before the hash function was recorded: ``present`` was 2 bytes (1, 0): read as function 0.
_LEGACY = np.dtype([
    ("hash", "<u8"), ("min", "<f8"), ("max", "<f8"), ("mean", "<f8"),
    ("nan", "<u8"), ("inf", "<u8"), ("shape", "<u4"), ("dtype", "<u2"), ("present", "<u2"),
])

HASH_FUNCTIONS: tuple[str, ...] = ("xxh3-64", kernels.HASH_NAME)
HASH_FUNCTION = 1  # the code of the function qconsist writes: qc-mix64/1

# Element types by code (0 = not recorded). Stored in the index so readers need no ONNX.
DTYPES: tuple[str, ...] = (
    "", "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
    "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
)
_CODES = {name: code for code, name in enumerate(DTYPES)}


def dtype_code(dtype: np.dtype) -> int:
    return _CODES.get(np.dtype(dtype).name, 0) if np.dtype(dtype).kind != "V" else 0


def tensor_hash(array: np.ndarray) -> int:
    """The ``qc-mix64/1`` hash of ``array``'s bytes (C order)."""
    return kernels.mix64(np.asarray(array))


def hash_function_names(table: np.ndarray) -> set[str]:
    """The hash functions whose hashes a fingerprint table holds (present records only)."""
    codes = np.unique(table["function"][table["present"] != 0]) if table.size else ()
    return {HASH_FUNCTIONS[int(c)] if int(c) < len(HASH_FUNCTIONS) else f"unknown #{int(c)}" for c in codes}


def check_hash_functions(a: np.ndarray, b: np.ndarray, what_a: str, what_b: str) -> str:
    """The one hash function both tables were made with; ``RunStoreError`` when they differ."""
    names_a, names_b = hash_function_names(a), hash_function_names(b)
    if len(names_a | names_b) > 1:
        raise RunStoreError(
            f"{what_a} was fingerprinted with {', '.join(sorted(names_a)) or 'nothing'} and {what_b} with "
            f"{', '.join(sorted(names_b)) or 'nothing'}: hashes of different functions cannot be compared; "
            "dump both runs with this qconsist version"
        )
    return next(iter(names_a | names_b), HASH_FUNCTIONS[HASH_FUNCTION])


def fingerprint(array: np.ndarray, shape_id: int, digest: int | None = None) -> tuple:
    """The fingerprint of ``array`` as a tuple in ``RECORD`` field order (``digest``: its hash, if known)."""
    array = np.asarray(array)
    digest, code = tensor_hash(array) if digest is None else digest, dtype_code(array.dtype)
    if array.size == 0 or array.dtype.kind not in "fiub":
        return (digest, np.nan, np.nan, np.nan, 0, 0, shape_id, code, 1, HASH_FUNCTION)
    found = kernels.statistics(array)
    if found is not None:
        return (digest, *found, shape_id, code, 1, HASH_FUNCTION)
    lo, hi = array.min(), array.max()  # float16 and other types the kernels do not read
    nan = inf = 0
    if array.dtype.kind == "f" and not (np.isfinite(lo) and np.isfinite(hi)):
        finite = np.isfinite(array)
        nan = int(np.isnan(array).sum())
        inf = int(array.size - int(finite.sum()) - nan)
        values = array[finite]
        if values.size == 0:
            return (digest, np.nan, np.nan, np.nan, nan, inf, shape_id, code, 1, HASH_FUNCTION)
        lo, hi, mean = values.min(), values.max(), float(values.sum(dtype=np.float64)) / values.size
    else:
        mean = float(array.sum(dtype=np.float64)) / array.size
    return (digest, float(lo), float(hi), float(mean), nan, inf, shape_id, code, 1, HASH_FUNCTION)


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

    def write_records(self, sample: int, row: np.ndarray) -> None:
        """Store a row of records computed elsewhere (on the GPU: ``qconsist.inference.device``)."""
        self._table[sample] = row

    def close(self) -> None:
        self._table.flush()
        del self._table


def read_table(path: Path) -> np.ndarray:
    """The fingerprint table of a dump, memory-mapped read-only."""
    table = np.load(Path(path), mmap_mode="r", allow_pickle=False)
    if table.dtype == _LEGACY and table.ndim == 2:
        return table.view(RECORD)  # present (1, 0) reads as present 1, function 0 (xxh3-64)
    if table.dtype != RECORD or table.ndim != 2:
        raise ValueError(f"{path} is not a qconsist fingerprint table")
    return table
