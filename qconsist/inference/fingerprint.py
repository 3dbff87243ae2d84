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

import threading
from typing import Callable

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
    equal hashes are what the comparison takes as equal bytes, so the statistics are the same."""
    return RowWork(arrays, shapes, last).row()


class RowWork:
    """One sample's fingerprints (``fingerprint_row``), computed column by column by every thread that calls
    ``work``: the dump's worker thread computes the row, and the recording thread, once it has nothing else to do
    but wait for that row, takes columns too (``dump.DumpRecorder.wait``), so that both cores fingerprint.

    Columns are taken from the last to the first: the tensors the session wrote last are the likeliest still in
    the processor's caches (open_nsfw, 83 MB a sample, right after the session's run: 15-17 ms of CPU in that
    order against 24-29 ms from the first column, one thread, this machine loaded).

    Each column's record depends on that column alone (its tensor, the previous sample's record): which thread
    computes it changes nothing. The shape table's ids are assigned here, in column order, before any column
    is taken, so the table is the same whatever thread took which column.

    Run for every sample of a dump (hundreds of tensors each), so the bookkeeping around the kernels is kept
    to plain Python values: the previous records read once as lists, element type codes looked up per dtype.

    ``forms``: columns recorded in another form than given (a tensor ORT holds in NCHWc blocks or in another axis
    order, recorded in the original's), each as the recorded shape and a function that makes the recorded array
    from nothing else; the thread that takes the column calls it, so the copy is spread over the threads and its
    result is hashed while it is in the caches. ``arrays`` then holds the recorded arrays of the columns taken."""

    def __init__(self, arrays: list[np.ndarray], shapes: ShapeTable, last: np.ndarray | None = None,
                 forms: dict[int, tuple[tuple[int, ...], Callable[[], np.ndarray]]] | None = None) -> None:
        self.arrays = [np.asarray(a) for a in arrays]
        count = len(self.arrays)
        self._forms = forms or {}
        self.shape_ids = [shapes.id(self._forms[c][0] if c in self._forms else a.shape) for c, a in enumerate(self.arrays)]
        if last is not None and len(last):
            known = min(count, len(last))
            self._last = last
            self._last_hash, self._last_shape, self._last_dtype = (last[name][:known].tolist() for name in ("hash", "shape", "dtype"))
        else:
            known, self._last, self._last_hash, self._last_shape, self._last_dtype = 0, None, [], [], []
        self._known = known
        self.records: list[tuple | None] = [None] * count
        self._next = count - 1  # the next column no thread has taken: from the last to the first
        self._finished = 0
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        if not count:
            self._done.set()

    def work(self) -> None:
        """Fingerprint columns no other thread has taken, until none is left (any number of threads at once)."""
        count = len(self.records)
        while True:
            with self._lock:
                column = self._next
                if column < 0 or self._failure is not None:
                    return
                self._next = column - 1
            try:
                self.records[column] = self._record(column)
            except BaseException as exc:  # handed to ``row``'s caller: the other threads stop taking columns
                with self._lock:
                    self._failure = self._failure or exc
                    self._next = -1
                    self._done.set()
                return
            with self._lock:
                self._finished += 1
                if self._finished >= count:
                    self._done.set()

    def row(self) -> np.ndarray:
        """Every column's record (taking columns until none is left, then waiting for those other threads hold)."""
        self.work()
        self._done.wait()
        if self._failure is not None:
            raise self._failure
        return np.array(self.records, dtype=RECORD)

    def _record(self, column: int) -> tuple:
        if column in self._forms:
            shape, make = self._forms[column]
            array = make()
            if tuple(array.shape) != tuple(shape):
                raise ValueError(f"column {column}: its recorded form has shape {tuple(array.shape)}, not {tuple(shape)}")
            self.arrays[column] = array
        array = self.arrays[column]
        if not array.flags.c_contiguous:  # a relaid tensor put back in its original's order: copied once, not per pass
            array = np.ascontiguousarray(array)
        digest, shape_id = tensor_hash(array), self.shape_ids[column]
        if (column < self._known and self._last_hash[column] == digest and self._last_shape[column] == shape_id
                and self._last_dtype[column] == dtype_code(array.dtype)):
            return self._last[column].item()  # type: ignore[index]
        return fingerprint(array, shape_id, digest)


__all__ = ["DTYPES", "HASH_FUNCTION", "HASH_FUNCTIONS", "RECORD", "ShapeTable", "check_hash_functions", "dtype_code",
           "RowWork", "fingerprint", "fingerprint_row", "tensor_hash"]
