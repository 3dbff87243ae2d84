"""Fingerprint rows (statistics reused only for identical columns) and the dump's background recorder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qconsist.inference import dump as dump_module
from qconsist.inference.dump import DumpRecorder
import threading

from qconsist.inference import fingerprint as fingerprint_module
from qconsist.inference.fingerprint import DTYPES, HASH_FUNCTIONS, RECORD, RowWork, ShapeTable, fingerprint, fingerprint_row
from qconsist.store.fingerprints import CompactTable, TableWriter
from mix64_reference import reference_mix64


def _expected(array: np.ndarray) -> dict:
    """Fingerprint fields computed directly with numpy and qc-mix64/1 from its definition."""
    values = array.astype(np.float64).ravel()
    finite = values[np.isfinite(values)]
    return {
        "hash": reference_mix64(np.ascontiguousarray(array).tobytes()),
        "min": finite.min(), "max": finite.max(), "mean": finite.mean(),
        "nan": int(np.isnan(values).sum()), "inf": int(np.isinf(values).sum()), "dtype": array.dtype.name,
    }


def test_rows_reuse_statistics_only_for_identical_columns(tmp_path):
    rng = np.random.default_rng(11)
    weight = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)  # the same in every row, like a dequantized weight
    codes = rng.integers(-128, 128, size=(4, 50), dtype=np.int8)
    rows = []
    for sample in range(3):
        activation = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
        activation[0, 0, 0, sample] = np.nan  # NaN and Inf are counted and left out of min / max / mean
        activation[0, 1, 1, 1] = np.inf
        # column 2: the same bytes as int8, then as uint8 (another dtype), then in another shape
        third = codes if sample == 0 else codes.view(np.uint8) if sample == 1 else codes.view(np.uint8).reshape(2, 100)
        rows.append([weight, activation, third])
    shapes, last, records = ShapeTable(), None, []
    for arrays in rows:
        last = fingerprint_row(arrays, shapes, last)
        records.append(last)
    saved = np.stack(records)
    shapes = shapes.shapes
    for sample, arrays in enumerate(rows):
        for column, array in enumerate(arrays):
            record, expected = saved[sample, column], _expected(array)
            assert int(record["hash"]) == expected["hash"]
            assert HASH_FUNCTIONS[int(record["function"])] == "qc-mix64/1" and record["present"] == 1
            assert DTYPES[int(record["dtype"])] == expected["dtype"]
            assert shapes[int(record["shape"])] == array.shape
            assert (int(record["nan"]), int(record["inf"])) == (expected["nan"], expected["inf"])
            assert record["min"] == expected["min"] and record["max"] == expected["max"]
            assert record["mean"] == pytest.approx(expected["mean"], rel=1e-6, abs=1e-9)
    assert saved[1, 2]["hash"] == saved[0, 2]["hash"]  # same bytes, other dtype: statistics recomputed
    assert saved[1, 2]["min"] >= 0 > saved[0, 2]["min"]
    # a table keeps one element type per tensor (the graph's): a row that says otherwise is refused
    table = TableWriter(tmp_path / "table", 3, [DTYPES[int(c)] for c in saved[0]["dtype"]])
    table.write_records(0, saved[0])
    with pytest.raises(ValueError, match="a tensor's element type differs from its column's"):
        table.write_records(1, saved[1])
    # the rows of a fixed element type go through a table and come back the same, record for record
    steady = TableWriter(tmp_path / "steady", 3, [DTYPES[int(c)] for c in saved[0]["dtype"]])
    again = np.stack([saved[0], saved[0], saved[2]])
    again[2, 2] = saved[0, 2]
    again["hash"][2, 2] += 1  # other bytes in the last row: its statistics are stored again
    for sample in range(3):
        steady.write_records(sample, again[sample])
    record = steady.close()
    read = CompactTable("t", lambda name: tmp_path / "steady" / name, record["dtypes"], record["hash_function"], 3,
                        shapes)
    for sample in range(3):
        assert read.row(sample).tobytes() == again[sample].tobytes()


def _mixed_tensors(rng: np.random.Generator, sample: int) -> list[np.ndarray]:
    """A sample's tensors of every kind a dump meets: floats with NaN / Inf / -0.0, integers, float16, bool, empty,
    a transposed (non-contiguous) view, a constant column (the same in every sample), shapes shared by columns."""
    tensors = []
    for column in range(40):
        kind = column % 8
        if kind == 0:
            array = rng.standard_normal((2, 3, 5)).astype(np.float32)
            array.flat[rng.integers(0, 30, 3)] = [np.nan, np.inf, -0.0]
        elif kind == 1:
            array = rng.integers(-128, 128, (5000,), dtype=np.int8)
        elif kind == 2:
            array = rng.standard_normal((64, 80)).astype(np.float32).T  # non-contiguous: hashed in C order
        elif kind == 3:
            array = np.full((2, 3, 5), 0.5 * column, np.float32)  # constant: statistics reused from the last sample
        elif kind == 4:
            array = rng.standard_normal(7).astype(np.float16)
        elif kind == 5:
            array = rng.integers(0, 2, (3, 3)).astype(bool)
        elif kind == 6:
            array = np.zeros((0, 4), np.float32)
        else:
            array = rng.integers(0, 256, (6000,), dtype=np.uint8) if sample else np.arange(6000, dtype=np.uint16)
        tensors.append(array)
    return tensors


def test_columns_taken_by_several_threads_give_the_serial_records():
    """RowWork: any number of threads taking columns at once make the records one thread makes, and the
    records equal each tensor's fingerprint computed alone (a reused record is what recomputing gives)."""
    rng = np.random.default_rng(5)
    samples = [_mixed_tensors(rng, s) for s in range(3)]
    serial_shapes, shared_shapes = ShapeTable(), ShapeTable()
    serial_last = shared_last = None
    for tensors in samples:
        serial = fingerprint_row(tensors, serial_shapes, serial_last)  # the calling thread alone
        work = RowWork(tensors, shared_shapes, shared_last)
        helpers = [threading.Thread(target=work.work) for _ in range(3)]
        for helper in helpers:
            helper.start()
        shared = work.row()
        for helper in helpers:
            helper.join()
        assert shared.tobytes() == serial.tobytes()
        alone = np.array([fingerprint(np.ascontiguousarray(a), serial_shapes.id(a.shape)) for a in tensors], dtype=RECORD)
        assert shared.tobytes() == alone.tobytes()
        serial_last, shared_last = serial, shared
    assert shared_shapes.shapes == serial_shapes.shapes  # shape ids in column order, whichever thread took a column
    assert serial_last[3]["mean"] == 1.5 and serial_last[2]["hash"] != 0


def test_a_column_that_fails_fails_the_row(monkeypatch):
    tensors = [np.arange(10, dtype=np.float32), np.arange(10, dtype=np.int64), np.arange(5, dtype=np.int8)]
    hash_of = fingerprint_module.tensor_hash

    def failing(array):
        if array.dtype == np.int64:
            raise MemoryError("column 1 could not be read")
        return hash_of(array)

    monkeypatch.setattr(fingerprint_module, "tensor_hash", failing)
    work = RowWork(tensors, ShapeTable(), None)
    helper = threading.Thread(target=work.work)
    helper.start()
    with pytest.raises(MemoryError, match="column 1 could not be read"):
        work.row()
    helper.join()


def _recorder(tmp_path: Path, raw_dir: Path, columns: int = 2) -> DumpRecorder:
    table = TableWriter(tmp_path / "dump", 2, ["float32"] * columns)
    return DumpRecorder(table, [1], {0}, lambda i: raw_dir / f"{i:06d}.npz")


@pytest.mark.parametrize("overlap", [True, False])
def test_recorder_checks_outputs_and_keeps_raw_tensors(tmp_path, monkeypatch, overlap):
    monkeypatch.setattr(dump_module, "OVERLAP", overlap)
    (tmp_path / "raw").mkdir()
    recorder = _recorder(tmp_path, tmp_path / "raw")
    hidden = np.arange(6, dtype=np.float32).reshape(2, 3)
    final = np.array([[0.25, 0.75]], dtype=np.float32)
    off_by_one_ulp = np.nextafter(final, np.float32(1))
    recorder.submit(0, [final], [hidden, final.copy()])
    recorder.submit(1, [final], [hidden, off_by_one_ulp])
    recorder.close()
    assert recorder.check.samples == 2 and recorder.check.mismatched == [1] and not recorder.check.faithful
    assert recorder.check.max_abs_diff == float(np.abs(off_by_one_ulp.astype(np.float64) - final).max()) > 0
    assert recorder.raw_saved == 2
    with np.load(tmp_path / "raw" / "000001.npz", allow_pickle=False) as raw:
        assert raw.files == ["t0"] and np.array_equal(raw["t0"], hidden)


@pytest.mark.parametrize("overlap", [True, False])
def test_recorder_errors_are_raised_not_lost(tmp_path, monkeypatch, overlap):
    monkeypatch.setattr(dump_module, "OVERLAP", overlap)
    recorder = _recorder(tmp_path, tmp_path / "missing-folder")
    arrays = [np.zeros(3, np.float32), np.ones(2, np.float32)]
    with pytest.raises(FileNotFoundError, match="missing-folder"):
        recorder.submit(0, [arrays[1]], arrays)
        recorder.close()
    recorder.close()  # closing again after the error is harmless
