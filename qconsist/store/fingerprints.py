"""Fingerprint tables: what a dump recorded of every tensor in every sample, compact on disk, read in blocks.

A fingerprint (``RECORD``, 56 bytes in memory) holds the hash of a tensor's bytes, min, max and mean (float64;
NaN where there are none), the NaN and Inf counts, a shape id, the element type, whether it is present and the
hash function's code. **On disk** (format ``qconsist.fingerprints/2``, the files of one folder, ``dump/table/``)
a table of ``samples × tensors`` keeps the same information in about a third of the space:

* ``hashes.npy``: ``uint64[samples, tensors]``, every hash (what a comparison reads first, block by block);
* ``stats.npy``: bytes; for each sample, in column order, the statistics of the tensors whose hash differs from
  the previous sample's (the first sample: all): min and max **in the tensor's own element type** (exact;
  bfloat16 and float8 in float32, which holds them exactly; bool as uint8) and the mean in float64. A tensor
  equal to the previous sample's (a dequantized weight, anything computed from constants) stores nothing:
  equal bytes have equal statistics, the record is the previous one's;
* ``starts.npy``: ``uint64[samples + 1]``, where each sample's statistics start in ``stats.npy``;
* ``events.npy``: ``EVENT`` records, sample by sample: every change of a tensor's shape or of its NaN and Inf counts
  (exact), with both (the first sample: every tensor). A record's shape and counts are those of its tensor's last
  event: a constant mask full of -inf is one event, not one per sample.

The element type is one per tensor (the graph's), the hash function one per table; both are in the dump's
``index.json`` with the shape table. Empty tensors and types without statistics have none (NaN when read).
Integers' min and max are exact where the recording kernels' float64 holds them (up to 2**53).

Tables written before (``qconsist.fingerprints/1``): one ``.npy`` of ``RECORD[samples, tensors]`` (and, before
the hash function was recorded, ``_LEGACY``). ``LegacyTable`` and ``CompactTable`` read both with one interface:
``block`` (hash, shape and type ids of a block of samples: what a comparison needs), ``record`` and ``row``.
Memory stays flat: both are memory-mapped and read a block or a record at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from qconsist.errors import RunStoreError
from qconsist.store.arrays import ShapeTable, StreamedArray
from qconsist.store.confine import check_npy

FORMAT = "qconsist.fingerprints/2"
LEGACY_FORMAT = "qconsist.fingerprints/1"

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
IDS = np.dtype([("hash", "<u8"), ("shape", "<u4"), ("dtype", "<u2")])  # what ``block`` returns
EVENT = np.dtype([("sample", "<u4"), ("column", "<u4"), ("shape", "<u4"), ("pad", "<u4"), ("nan", "<u8"), ("inf", "<u8")])

HASH_FUNCTIONS: tuple[str, ...] = ("xxh3-64", "qc-mix64/1")  # codes 0 and 1 (qconsist.inference.kernels)
HASH_FUNCTION = 1  # the code of the function qconsist writes: qc-mix64/1

# Element types by code (0 = not recorded). Stored in the index so readers need no ONNX.
DTYPES: tuple[str, ...] = (
    "", "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
    "int64", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
)
_CODES = {name: code for code, name in enumerate(DTYPES)}
# the type min and max are kept in, per element type (types numpy lacks: float32, which holds them exactly)
_STAT_TYPES = {"bfloat16": "float32", "float8_e4m3fn": "float32", "float8_e5m2": "float32", "bool": "uint8"}
_BLOCK = 2048  # samples per block when a table is read whole


def dtype_code(dtype: np.dtype | str) -> int:
    found = _CODE_OF.get(dtype)  # type: ignore[call-overload]
    if found is None:
        kind = np.dtype(dtype)
        found = _CODE_OF[dtype] = _CODES.get(kind.name, 0) if kind.kind != "V" else 0  # type: ignore[index]
    return found


_CODE_OF: dict[np.dtype | str, int] = {}  # dtype_code's answers (``dtype.name`` costs microseconds: once per dtype)


def stat_type(code: int) -> np.dtype | None:
    """The type a tensor of element type ``code`` keeps its min and max in; ``None``: no statistics."""
    name = DTYPES[code] if 0 < code < len(DTYPES) else ""
    if not name:
        return None
    return np.dtype(_STAT_TYPES.get(name, name))


def entry_width(code: int) -> int:
    kind = stat_type(code)
    return 0 if kind is None else 2 * kind.itemsize + 8


def hash_function_name(code: int) -> str:
    return HASH_FUNCTIONS[code] if 0 <= code < len(HASH_FUNCTIONS) else f"unknown #{code}"


# --- writing -----------------------------------------------------------------------------------------------------


class _Layout:
    """Where each column's statistics lie in a full row of entries, grouped by the type they are kept in."""

    def __init__(self, codes: Sequence[int]) -> None:
        self.codes = np.asarray(codes, dtype=np.uint16)
        self.widths = np.array([entry_width(c) for c in codes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.widths)[:-1]]) if len(codes) else np.zeros(0, np.int64)
        self.row_bytes = int(self.widths.sum())
        groups: dict[str, list[int]] = {}
        for column, code in enumerate(codes):
            kind = stat_type(int(code))
            if kind is not None:
                groups.setdefault(kind.str, []).append(column)
        self.groups = [(np.dtype(kind), np.array(columns, dtype=np.int64)) for kind, columns in groups.items()]

    def full_rows(self, rows: np.ndarray) -> np.ndarray:
        """``uint8[n, row_bytes]``: every column's entry (min, max in its type, mean in float64) of ``rows``."""
        full = np.zeros((rows.shape[0], self.row_bytes), dtype=np.uint8)
        for kind, columns in self.groups:
            size = kind.itemsize
            start = self.offsets[columns]
            for field, shift in (("min", 0), ("max", size)):
                values = rows[field][:, columns]
                if kind.kind != "f":
                    values = _in_range(np.nan_to_num(values, nan=0.0), kind)  # an empty tensor: no statistics (read back as NaN)
                raw = np.ascontiguousarray(values, dtype=kind).view(np.uint8).reshape(rows.shape[0], len(columns), size)
                full[:, (start + shift)[:, None] + np.arange(size)] = raw
            mean = np.ascontiguousarray(rows["mean"][:, columns]).view(np.uint8).reshape(rows.shape[0], len(columns), 8)
            full[:, (start + 2 * size)[:, None] + np.arange(8)] = mean
        return full


def _in_range(values: np.ndarray, kind: np.dtype) -> np.ndarray:
    """Integer statistics (float64 in a record) in ``kind``: an int64 tensor's extremes read back from float64 as
    2**63 (a Slice's INT64_MAX end, in silero_vad's branches), which a plain cast wraps to the type's minimum; they
    are the type's own bounds."""
    info = np.iinfo(kind)
    with np.errstate(invalid="ignore"):
        cast = values.astype(kind)
    cast[values >= float(info.max)] = info.max
    cast[values <= float(info.min)] = info.min
    return cast


class TableWriter:
    """A ``qconsist.fingerprints/2`` table written sample by sample, in order (see the module docstring)."""

    def __init__(self, folder: Path, samples: int, dtypes: Sequence[str], function: int = HASH_FUNCTION) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.samples, self.function = folder, samples, function
        self.layout = _Layout([_CODES.get(d, 0) for d in dtypes])
        self.columns = len(dtypes)
        self.shapes = ShapeTable()
        self._hashes = np.lib.format.open_memmap(folder / "hashes.npy", mode="w+", dtype="<u8", shape=(samples, self.columns))
        self._starts = np.lib.format.open_memmap(folder / "starts.npy", mode="w+", dtype="<u8", shape=(samples + 1,))
        self._stats = StreamedArray(folder / "stats.npy", np.uint8)
        self._events = StreamedArray(folder / "events.npy", EVENT)
        self._last: np.ndarray | None = None  # the previous sample's records
        self._next = 0

    @property
    def last(self) -> np.ndarray | None:
        """The records of the last sample written (``RECORD[tensors]``)."""
        return self._last

    def write_records(self, sample: int, row: np.ndarray) -> None:
        """Store a row of records computed elsewhere (``fingerprint``, or on the GPU)."""
        self.write_block(sample, np.asarray(row)[np.newaxis])

    def write_block(self, start: int, rows: np.ndarray) -> None:
        """Store the records ``RECORD[n, tensors]`` of samples ``start`` onwards."""
        if start != self._next:
            raise ValueError(f"fingerprint rows must be written in order: sample {start} after {self._next}")
        count = rows.shape[0]
        found = rows["dtype"][(rows["dtype"] != 0)]
        if found.size and not np.array_equal(np.broadcast_to(self.layout.codes, rows.shape)[rows["dtype"] != 0], found):
            raise ValueError("a tensor's element type differs from its column's")
        # the fields read once as plain arrays (a field of a 56-byte record array is a strided view: every
        # comparison on it was several times slower; a step of 32 samples × 416 tensors on the GPU path)
        fields = {name: np.ascontiguousarray(rows[name]) for name in ("hash", "nan", "inf", "shape")}
        before = self._last if self._last is not None else None

        def previous(name: str) -> np.ndarray:
            first = before[name][np.newaxis] if before is not None else fields[name][:1]
            return np.concatenate([first, fields[name][:-1]])

        hashes = fields["hash"]
        self._hashes[start:start + count] = hashes
        changed = hashes != previous("hash")
        if before is None:
            changed[0] = True
        entries = self.layout.full_rows(rows)[np.repeat(changed, self.layout.widths, axis=1)]
        self._starts[start + 1:start + count + 1] = self._starts[start] + np.cumsum((changed * self.layout.widths).sum(axis=1))
        self._stats.append(entries)
        events = ((fields["nan"] != previous("nan")) | (fields["inf"] != previous("inf"))
                  | (fields["shape"] != previous("shape")))
        if before is None:
            events[0] = True
        where, column = np.nonzero(events)
        if where.size:
            records = np.zeros(where.size, dtype=EVENT)
            records["sample"], records["column"] = start + where, column
            records["shape"], records["nan"], records["inf"] = (fields[name][where, column] for name in ("shape", "nan", "inf"))
            self._events.append(records)
        self._last = rows[-1].copy()
        self._next += count

    def close(self) -> dict:
        """Finish the files; the table's record for the dump's ``index.json``."""
        if self._next != self.samples:
            raise ValueError(f"{self._next} samples of fingerprints written, {self.samples} expected")
        for memmap in (self._hashes, self._starts):
            memmap.flush()
        del self._hashes, self._starts
        self._stats.close()
        self._events.close()
        return {"format": FORMAT, "hash_function": hash_function_name(self.function),
                "dtypes": [DTYPES[int(c)] for c in self.layout.codes], "samples": self.samples}

    def abandon(self) -> None:
        self._stats.abandon()
        self._events.abandon()


# --- reading -----------------------------------------------------------------------------------------------------


class FingerprintTable:
    """A dump's fingerprints, read a block of samples or a record at a time (both formats)."""

    samples: int
    columns: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.samples, self.columns

    def hash_functions(self) -> set[str]:
        raise NotImplementedError

    def block(self, start: int, stop: int) -> np.ndarray:
        """``IDS[n, tensors]``: hash, shape id and element type of samples ``start:stop``."""
        raise NotImplementedError

    def record(self, sample: int, column: int) -> np.void:
        raise NotImplementedError

    def row(self, sample: int) -> np.ndarray:
        return np.array([self.record(sample, c) for c in range(self.columns)], dtype=RECORD)

    def max_shape(self) -> int:
        """The greatest shape id the table names (-1 when empty)."""
        raise NotImplementedError

    def blocks(self, size: int = _BLOCK):
        for start in range(0, self.samples, size):
            yield start, self.block(start, min(start + size, self.samples))


class LegacyTable(FingerprintTable):
    """``qconsist.fingerprints/1``: one memory-mapped ``RECORD[samples, tensors]``."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        self.samples, self.columns = (int(d) for d in table.shape)

    def hash_functions(self) -> set[str]:
        codes: set[int] = set()
        for start in range(0, self.samples, _BLOCK):
            part = self.table[start:start + _BLOCK]
            codes |= {int(c) for c in np.unique(part["function"][part["present"] != 0])}
        return {hash_function_name(c) for c in codes}

    def block(self, start: int, stop: int) -> np.ndarray:
        part = self.table[start:stop]
        ids = np.empty(part.shape, dtype=IDS)
        for name in IDS.names:
            ids[name] = part[name]
        return ids

    def record(self, sample: int, column: int) -> np.void:
        return np.asarray(self.table[sample, column]).astype(RECORD)[()]

    def row(self, sample: int) -> np.ndarray:
        return np.asarray(self.table[sample]).astype(RECORD)

    def max_shape(self) -> int:
        found = -1
        for start in range(0, self.samples, _BLOCK):
            part = self.table[start:start + _BLOCK]["shape"]
            if part.size:
                found = max(found, int(part.max()))
        return found


def read_legacy(path: Path) -> LegacyTable:
    """A ``qconsist.fingerprints/1`` table, memory-mapped read-only (``ValueError`` if it is none)."""
    table = np.load(Path(path), mmap_mode="r", allow_pickle=False)
    if table.dtype == _LEGACY and table.ndim == 2:
        return LegacyTable(table.view(RECORD))  # present (1, 0) reads as present 1, function 0 (xxh3-64)
    if table.dtype != RECORD or table.ndim != 2:
        raise ValueError(f"{path} is not a qconsist fingerprint table")
    return LegacyTable(table)


class CompactTable(FingerprintTable):
    """``qconsist.fingerprints/2`` (see the module docstring)."""

    def __init__(self, where: str, files: Callable[[str], Path], dtypes: Sequence[str], function: str,
                 samples: int, shapes: Sequence[Sequence[int]]) -> None:
        self.where = where
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        codes = [_CODES.get(d) for d in dtypes]
        if any(c is None for c in codes):
            raise RunStoreError(f"{where}: unknown element type {next(d for d in dtypes if d not in _CODES)!r}")
        if function not in HASH_FUNCTIONS:
            raise RunStoreError(f"{where}: unknown hash function {function!r}")
        self.layout = _Layout([int(c) for c in codes])  # type: ignore[arg-type]
        self.function = function
        self.samples, self.columns = samples, len(codes)
        self.hashes = self._load(files, "hashes.npy", np.dtype("<u8"), (samples, self.columns))
        self.starts = self._load(files, "starts.npy", np.dtype("<u8"), (samples + 1,))
        self.stats = self._load(files, "stats.npy", np.dtype("u1"), None)
        events = self._load(files, "events.npy", EVENT, None)
        self.events = np.array(events)  # a few records per tensor: read whole
        if self.events.size and (int(self.events["column"].max()) >= self.columns
                                 or int(self.events["sample"].max()) >= samples
                                 or np.any(np.diff(self.events["sample"].astype(np.int64)) < 0)):
            raise RunStoreError(f"{where}: events.npy does not fit the table (damaged)")
        if samples and (int(self.starts[-1]) != self.stats.shape[0] or np.any(np.diff(self.starts.astype(np.int64)) < 0)):
            raise RunStoreError(f"{where}: starts.npy and stats.npy disagree (damaged)")
        order = np.lexsort((self.events["sample"], self.events["column"]))
        self._by_column = self.events[order]
        self._column_bounds = np.searchsorted(self._by_column["column"], np.arange(self.columns + 1))
        first = self._column_bounds[:-1] < self._column_bounds[1:]
        if samples and (not first.all() or np.any(self._by_column["sample"][self._column_bounds[:-1][first]] != 0)):
            raise RunStoreError(f"{where}: events.npy lacks the first sample's shapes (damaged)")

    def _load(self, files: Callable[[str], Path], name: str, dtype: np.dtype, shape: tuple[int, ...] | None) -> np.ndarray:
        path = files(name)
        found = check_npy(path, f"{self.where}/{name}", dtype=dtype)
        if shape is not None and found != shape:
            raise RunStoreError(f"{self.where}/{name} holds {found}, the table {shape}; refused")
        if shape is None and len(found) != 1:
            raise RunStoreError(f"{self.where}/{name}: {len(found)} dimensions, expected 1; refused")
        return np.load(path, mmap_mode="r", allow_pickle=False)

    def hash_functions(self) -> set[str]:
        return {self.function} if self.samples and self.columns else set()

    def block(self, start: int, stop: int) -> np.ndarray:
        ids = np.empty((stop - start, self.columns), dtype=IDS)
        ids["hash"] = self.hashes[start:stop]
        ids["dtype"] = self.layout.codes
        ids["shape"] = self._shapes(start, stop)
        return ids

    def _shapes(self, start: int, stop: int) -> np.ndarray:
        """Shape ids of samples ``start:stop``: each tensor's last shape event, carried forward."""
        count = stop - start
        out = np.full((count + 1, self.columns), -1, dtype=np.int64)
        out[0] = [self._shape_before(start, c) for c in range(self.columns)]
        lo, hi = np.searchsorted(self.events["sample"], [start, stop])
        events = self.events[lo:hi]
        out[events["sample"].astype(np.int64) - start + 1, events["column"]] = events["shape"]
        rows = np.where(out >= 0, np.arange(count + 1)[:, None], 0)
        np.maximum.accumulate(rows, axis=0, out=rows)
        return np.take_along_axis(out, rows, axis=0)[1:].astype(np.uint32)

    def _event(self, sample: int, column: int) -> np.void:
        """The last event of ``column`` at or before ``sample``."""
        lo, hi = self._column_bounds[column], self._column_bounds[column + 1]
        at = lo + int(np.searchsorted(self._by_column["sample"][lo:hi], sample, side="right")) - 1
        return self._by_column[at]

    def _shape_before(self, sample: int, column: int) -> int:
        return -1 if sample == 0 else int(self._event(sample - 1, column)["shape"])

    def _changed(self, sample: int) -> np.ndarray:
        if sample == 0:
            return np.ones(self.columns, dtype=bool)
        return np.asarray(self.hashes[sample]) != np.asarray(self.hashes[sample - 1])

    def _last_change(self, sample: int, column: int) -> int:
        """The last sample at or before ``sample`` whose statistics of ``column`` were stored."""
        stop, size = sample + 1, 1
        while stop > 1:
            first = max(1, stop - size)
            part = np.asarray(self.hashes[first - 1:stop, column])
            changed = np.flatnonzero(part[1:] != part[:-1])
            if changed.size:
                return first + int(changed[-1])
            stop, size = first, size * 8
        return 0

    def record(self, sample: int, column: int) -> np.void:
        if not (0 <= sample < self.samples and 0 <= column < self.columns):
            raise IndexError((sample, column))
        record = np.zeros((), dtype=RECORD)
        record["hash"], record["dtype"] = self.hashes[sample, column], self.layout.codes[column]
        record["present"], record["function"] = 1, HASH_FUNCTIONS.index(self.function)
        event = self._event(sample, column)
        record["shape"], record["nan"], record["inf"] = event["shape"], event["nan"], event["inf"]
        record["min"] = record["max"] = record["mean"] = np.nan
        kind = stat_type(int(self.layout.codes[column]))
        if kind is None or int(record["shape"]) >= len(self.sizes) or self.sizes[int(record["shape"])] == 0:
            return record[()]  # a type without statistics, or an empty tensor
        stored = self._last_change(sample, column)
        changed = self._changed(stored)
        offset = int(self.starts[stored]) + int((self.layout.widths[:column] * changed[:column]).sum())
        entry = np.asarray(self.stats[offset:offset + int(self.layout.widths[column])])
        if entry.size != self.layout.widths[column]:
            raise RunStoreError(f"{self.where}: stats.npy ends before the record of sample {sample} (damaged)")
        lo, hi = entry[:2 * kind.itemsize].view(kind)
        record["min"], record["max"], record["mean"] = float(lo), float(hi), float(entry[2 * kind.itemsize:].view("<f8")[0])
        return record[()]

    def max_shape(self) -> int:
        return int(self.events["shape"].max()) if self.events.size else -1


__all__ = [
    "DTYPES", "EVENT", "FORMAT", "HASH_FUNCTION", "HASH_FUNCTIONS", "IDS", "LEGACY_FORMAT", "RECORD",
    "CompactTable", "FingerprintTable", "LegacyTable", "TableWriter", "dtype_code", "entry_width",
    "hash_function_name", "read_legacy", "stat_type",
]
