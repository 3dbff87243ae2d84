"""The compact fingerprint table: records written a step at a time come back record for record (hypothesis),
a record equal to the previous sample's stores nothing, min and max keep their own type, old tables read the
same, and comparing two tables of 20,000 samples keeps memory flat."""

from __future__ import annotations

import tempfile
import warnings
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qconsist.store.fingerprints import (
    DTYPES, EVENT, RECORD, CompactTable, LegacyTable, TableWriter, dtype_code, entry_width, read_legacy, stat_type,
)

NAMES = ["float32", "float16", "float64", "int8", "uint8", "int32", "int64", "bool", "bfloat16", ""]
SHAPES = [(1, 3), (0,), (2, 2), (1, 4, 4)]


def _records(rng: np.random.Generator, dtypes: list[str], samples: int, repeat: float, nonfinite: float) -> np.ndarray:
    """Consistent records: equal hashes carry equal statistics, empty tensors none, ints whole numbers."""
    rows = np.zeros((samples, len(dtypes)), dtype=RECORD)
    for column, name in enumerate(dtypes):
        code = DTYPES.index(name)
        kind = stat_type(code)
        for sample in range(samples):
            record = rows[sample, column]
            if sample and rng.random() < repeat:
                rows[sample, column] = rows[sample - 1, column]
                continue
            shape = int(rng.integers(0, len(SHAPES)))
            record["hash"], record["shape"], record["dtype"] = rng.integers(0, 2**63), shape, code
            record["present"], record["function"] = 1, 1
            record["min"] = record["max"] = record["mean"] = np.nan
            if kind is not None and SHAPES[shape] != (0,):
                if kind.kind == "f":
                    values = rng.normal(0, 100, 2).astype(np.float16 if name == "float16" else np.float32)
                else:
                    info = np.iinfo(kind)
                    values = rng.integers(max(info.min, -(2**40)), min(info.max, 2**40), 2, endpoint=True)
                record["min"], record["max"] = float(values.min()), float(values.max())
                record["mean"] = float(rng.normal())
            if kind is not None and kind.kind == "f" and rng.random() < nonfinite:
                record["nan"], record["inf"] = rng.integers(0, 5, 2)
    return rows


def _write(folder: Path, dtypes: list[str], rows: np.ndarray, step: int) -> dict:
    writer = TableWriter(folder, rows.shape[0], dtypes)
    writer.shapes.shapes[:] = SHAPES
    for start in range(0, rows.shape[0], step):
        writer.write_block(start, rows[start:start + step])
    return writer.close()


def _read(folder: Path, record: dict, samples: int) -> CompactTable:
    return CompactTable("run r: dump/table", lambda name: folder / name, record["dtypes"], record["hash_function"], samples,
                        SHAPES)


def _same(a: np.void, b: np.void) -> bool:
    return all(a[f] == b[f] or (np.isnan(a[f]) and np.isnan(b[f])) if RECORD[f].kind == "f" else a[f] == b[f]
               for f in RECORD.names)


@settings(max_examples=30, deadline=None)
@given(columns=st.lists(st.sampled_from(NAMES), min_size=1, max_size=6), samples=st.integers(1, 30),
       step=st.integers(1, 7), repeat=st.sampled_from([0.0, 0.5, 0.9]), nonfinite=st.sampled_from([0.0, 0.3]),
       seed=st.integers(0, 2**16))
def test_records_round_trip(columns, samples, step, repeat, nonfinite, seed):
    rows = _records(np.random.default_rng(seed), columns, samples, repeat, nonfinite)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "table"
        record = _write(folder, columns, rows, step)
        table = _read(folder, record, samples)
        assert table.hash_functions() == {"qc-mix64/1"} and table.shape == (samples, len(columns))
        for sample in range(samples):
            for column in range(len(columns)):
                assert _same(table.record(sample, column), rows[sample, column]), (sample, column)
        for start in range(0, samples, 4):
            block = table.block(start, min(start + 4, samples))
            expected = rows[start:start + 4]
            assert np.array_equal(block["hash"], expected["hash"]) and np.array_equal(block["shape"], expected["shape"])
            assert np.array_equal(block["dtype"], expected["dtype"])


def test_a_record_equal_to_the_previous_samples_stores_no_statistics(tmp_path):
    dtypes = ["float32", "int8"]
    rows = _records(np.random.default_rng(1), dtypes, 1, 0.0, 0.0)
    rows = np.repeat(rows, 100, axis=0)  # a weight: the same tensor in every sample
    rows["shape"] = 0
    rows["hash"][50:, 1] += 1  # the int8 column changes once, then stays
    _write(tmp_path / "table", dtypes, rows, 16)
    stats = np.load(tmp_path / "table" / "stats.npy")
    assert stats.size == entry_width(dtype_code("float32")) + 2 * entry_width(dtype_code("int8")) == 16 + 10 + 10
    assert np.load(tmp_path / "table" / "events.npy").size == 2  # the first sample's shapes only
    table = _read(tmp_path / "table", {"dtypes": dtypes, "hash_function": "qc-mix64/1"}, 100)
    assert _same(table.record(99, 0), rows[99, 0]) and _same(table.record(99, 1), rows[99, 1])


def test_min_and_max_are_kept_in_the_tensors_own_type(tmp_path):
    assert [str(stat_type(dtype_code(n))) for n in ("float16", "int8", "uint8", "bool", "float64")] == [
        "float16", "int8", "uint8", "uint8", "float64"]
    assert stat_type(DTYPES.index("bfloat16")) == np.dtype("float32") and stat_type(0) is None
    rows = np.zeros((1, 1), dtype=RECORD)
    rows["dtype"], rows["present"], rows["function"] = dtype_code("float16"), 1, 1
    rows["min"], rows["max"], rows["mean"] = float(np.float16(-65504)), float(np.float16(0.1)), 0.25
    _write(tmp_path / "table", ["float16"], rows, 1)
    stats = np.load(tmp_path / "table" / "stats.npy")
    assert stats[:4].view(np.float16).tolist() == [-65504.0, np.float16(0.1)] and stats.size == 12


def test_int64_extremes_are_kept_not_wrapped(tmp_path):
    """A Slice's end of INT64_MAX (silero_vad's branches): its record's max, float64 2**63, is the type's maximum
    in the table, not -2**63 with numpy's "invalid value encountered in cast"."""
    info = np.iinfo(np.int64)
    rows = np.zeros((1, 2), dtype=RECORD)
    rows["dtype"], rows["present"], rows["function"] = dtype_code("int64"), 1, 1
    rows["min"][0], rows["max"][0], rows["mean"][0] = float(info.min), float(info.max), 0.0
    rows["min"][0, 1], rows["max"][0, 1] = -3.0, 2.0**53
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _write(tmp_path / "table", ["int64", "int64"], rows, 1)
    stats = np.load(tmp_path / "table" / "stats.npy")
    assert stats[:16].view(np.int64).tolist() == [info.min, info.max]
    assert stats[24:40].view(np.int64).tolist() == [-3, 2**53]
    table = _read(tmp_path / "table", {"dtypes": ["int64", "int64"], "hash_function": "qc-mix64/1"}, 1)
    assert _same(table.record(0, 0), rows[0, 0]) and _same(table.record(0, 1), rows[0, 1])


def test_an_old_table_reads_through_the_same_interface(tmp_path):
    rows = _records(np.random.default_rng(3), ["float32", "int8"], 7, 0.3, 0.2)
    np.save(tmp_path / "fingerprints.npy", rows)
    table = read_legacy(tmp_path / "fingerprints.npy")
    assert isinstance(table, LegacyTable) and table.shape == (7, 2) and table.hash_functions() == {"qc-mix64/1"}
    assert all(_same(table.record(s, c), rows[s, c]) for s in range(7) for c in range(2))
    assert np.array_equal(table.block(2, 5)["hash"], rows[2:5]["hash"])
    np.save(tmp_path / "other.npy", np.zeros((2, 2)))
    with pytest.raises(ValueError, match="is not a qconsist fingerprint table"):
        read_legacy(tmp_path / "other.npy")


def test_rows_must_come_in_order(tmp_path):
    writer = TableWriter(tmp_path / "table", 3, ["float32"])
    with pytest.raises(ValueError, match="must be written in order: sample 1 after 0"):
        writer.write_records(1, np.zeros(1, dtype=RECORD))
    writer.abandon()
    assert EVENT.itemsize == 32


def _big(folder: Path, samples: int, columns: int, seed: int) -> CompactTable:
    """A table of ``samples`` × ``columns`` records, a quarter of the columns constant (weights)."""
    rng = np.random.default_rng(seed)
    dtypes = ["float32" if c % 3 else "int8" for c in range(columns)]
    writer = TableWriter(folder, samples, dtypes)
    writer.shapes.id((1, 8))
    for start in range(0, samples, 1000):
        rows = np.zeros((min(1000, samples - start), columns), dtype=RECORD)
        rows["hash"] = rng.integers(0, 2**63, rows.shape)
        rows["hash"][:, : columns // 4] = np.arange(columns // 4)
        rows["dtype"] = [dtype_code(d) for d in dtypes]
        rows["min"], rows["max"], rows["mean"] = -1.0, 1.0, 0.5
        rows["present"], rows["function"] = 1, 1
        writer.write_block(start, rows)
    record = writer.close()
    return CompactTable("t", lambda name: folder / name, record["dtypes"], record["hash_function"], samples, [(1, 8)])


def test_comparing_two_tables_keeps_memory_flat(tmp_path):
    """Two 20,000-sample tables are compared a block at a time: the peak of Python and numpy allocations (about
    70 MB here: a few blocks of 2,048 samples) stays below the tables and does not grow with the samples."""
    from qconsist.compare import origins

    peaks = {}
    for samples in (5_000, 20_000):
        a, b = _big(tmp_path / f"a{samples}", samples, 400, 1), _big(tmp_path / f"b{samples}", samples, 400, 2)
        tracemalloc.start()
        differing = 0
        for (start, block_a), (_, block_b) in zip(a.blocks(), b.blocks()):
            differ = block_a["hash"] != block_b["hash"]
            differing += int(origins(differ, [([], [c]) for c in range(400)]).sum())
        peaks[samples] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert differing == samples * 300  # every non-constant column differs, an origin (no inputs)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "a20000").iterdir())
    assert peaks[20_000] < on_disk / 2, (peaks, on_disk)  # a few blocks of records, never a table
    assert peaks[20_000] < 1.1 * peaks[5_000], peaks  # flat in the number of samples
