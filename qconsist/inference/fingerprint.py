"""Fingerprints of tensors: a ``RECORD`` (56 bytes) per tensor per sample, kept in a table (``qconsist.store.fingerprints``).

A fingerprint holds the hash of the tensor's exact bytes (C order), min, max and mean (float64; NaN for
empty tensors; NaN and Inf excluded), the NaN and Inf counts, the element type, an index into the shape
table and the code of the hash function that made it (``HASH_FUNCTIONS``: 0 ``xxh3-64``, the tables written
before qconsist 0.1's kernels; 1 ``qc-mix64/1``, ``kernels.py``, the same function on the CPU and on the
GPU). Two tensors with the same hash, hash function, dtype and shape are taken as bit-identical; hashes of
different functions are never compared (``check_hash_functions``).

``fingerprint_row`` computes one sample's row on the host (``qconsist.inference.device`` computes the same
records on the GPU); ``qconsist.store.fingerprints.TableWriter`` stores the rows compactly, a step at a time, so
memory does not grow with the number of samples.
"""

from __future__ import annotations

import numpy as np

from qconsist.errors import RunStoreError
from qconsist.inference import kernels
from qconsist.store.arrays import ShapeTable
from qconsist.store.fingerprints import DTYPES, HASH_FUNCTION, HASH_FUNCTIONS, RECORD, FingerprintTable, dtype_code

assert HASH_FUNCTIONS[HASH_FUNCTION] == kernels.HASH_NAME


def tensor_hash(array: np.ndarray) -> int:
    """The ``qc-mix64/1`` hash of ``array``'s bytes (C order)."""
    return kernels.mix64(np.asarray(array))


def check_hash_functions(a: FingerprintTable | set[str], b: FingerprintTable | set[str], what_a: str, what_b: str) -> str:
    """The one hash function both tables (or sets of function names) were made with; ``RunStoreError`` when
    they differ."""
    names_a = a if isinstance(a, set) else a.hash_functions()
    names_b = b if isinstance(b, set) else b.hash_functions()
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


def fingerprint_row(arrays: list[np.ndarray], shapes: ShapeTable, last: np.ndarray | None = None) -> np.ndarray:
    """The fingerprints of one sample's tensors (one per column) as ``RECORD[columns]``.

    A column whose bytes hash, element type and shape equal ``last``'s (the previous sample's records: a
    dequantized weight, any tensor computed from constants) reuses its statistics instead of recomputing them:
    equal hashes are what the comparison takes as equal bytes, so the statistics are the same.

    Run for every sample of a dump (hundreds of tensors each), so the bookkeeping around the kernels is kept
    to plain Python values: the previous records read once as lists, element type codes looked up per dtype."""
    count = len(arrays)
    if last is not None and len(last):
        known = min(count, len(last))
        last_hash, last_shape, last_dtype = (last[name][:known].tolist() for name in ("hash", "shape", "dtype"))
    else:
        known, last_hash, last_shape, last_dtype = 0, [], [], []
    records = []
    for column, array in enumerate(arrays):
        array = np.asarray(array)
        digest, shape_id = tensor_hash(array), shapes.id(array.shape)
        if (column < known and last_hash[column] == digest and last_shape[column] == shape_id
                and last_dtype[column] == dtype_code(array.dtype)):
            records.append(last[column].item())  # type: ignore[index]
        else:
            records.append(fingerprint(array, shape_id, digest))
    return np.array(records, dtype=RECORD)


__all__ = ["DTYPES", "HASH_FUNCTION", "HASH_FUNCTIONS", "RECORD", "ShapeTable", "check_hash_functions", "dtype_code",
           "fingerprint", "fingerprint_row", "tensor_hash"]
