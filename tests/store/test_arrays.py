"""One file per output: the streamed ``.npy`` writer and the output store, written a step at a time and read back
sample by sample and in blocks (hypothesis), against the per-sample arrays the session gave."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qconsist.errors import RunStoreError, UnsupportedModelError
from qconsist.store.arrays import (
    OutputFiles, OutputWriter, ShapeTable, StreamedArray, blocks, merged, npy_header, sample_rows,
)
from qconsist.store.confine import check_npy

DTYPES = ["float32", "float16", "int8", "uint8", "int64", "bool", "float64"]


def test_a_streamed_array_is_a_plain_npy_file(tmp_path):
    data = np.arange(24, dtype=np.int16).reshape(4, 2, 3)
    stream = StreamedArray(tmp_path / "a.npy")
    for row in data:
        stream.append(row)
    stream.close(data.shape)
    assert check_npy(tmp_path / "a.npy", "a.npy") == (4, 2, 3)
    assert np.array_equal(np.load(tmp_path / "a.npy"), data)
    assert np.array_equal(np.load(tmp_path / "a.npy", mmap_mode="r")[2], data[2])
    assert len(npy_header(np.dtype("<f4"), (50_000, 1, 1000))) == 1024


def test_a_streamed_array_refuses_a_shape_that_does_not_hold_its_bytes(tmp_path):
    stream = StreamedArray(tmp_path / "a.npy")
    stream.append(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"shape \(2, 3\) does not hold the 20 bytes written"):
        stream.close((2, 3))
    other = StreamedArray(tmp_path / "b.npy", np.float32)
    with pytest.raises(ValueError, match="int8 appended to an array of float32"):
        other.append(np.zeros(2, np.int8))


def _steps(draw_data, dtype: str, batch: int, samples: int, ragged: bool):
    """The steps a session gives: ``(outputs, count)``; a batched output, a shared (unbatched) one."""
    rng = np.random.default_rng(len(draw_data))
    steps, done = [], 0
    while done < samples:
        count = min(batch, samples - done)
        width = 3 + (done % 2 if ragged else 0)
        batched = (rng.normal(size=(count, width)) * 50).astype(dtype)
        shared = np.array([done], dtype=np.int64)
        steps.append(([batched, shared], count))
        done += count
    return steps


def _expected(steps):
    per_sample = []
    for outputs, count in steps:
        rows = [sample_rows(o, count) for o in outputs]
        per_sample += [[np.array(r[i]) for r in rows] for i in range(count)]
    return per_sample


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(DTYPES), batch=st.integers(1, 5), samples=st.integers(1, 23), ragged=st.booleans())
def test_outputs_round_trip_sample_by_sample_and_in_blocks(dtype, batch, samples, ragged):
    with tempfile.TemporaryDirectory() as scratch:
        _round_trip(Path(scratch) / "outputs", dtype, batch, samples, ragged)


def _round_trip(folder: Path, dtype: str, batch: int, samples: int, ragged: bool) -> None:
    steps = _steps(range(samples + batch), dtype, batch, samples, ragged)
    writer = OutputWriter(folder, ["scores", "index"], samples)
    for outputs, count in steps:
        writer.write_step(outputs, count)
    shapes = ShapeTable()
    files = writer.close(shapes)
    assert files == ["outputs/o0.npy", "outputs/o1.npy"]
    expected = _expected(steps)
    varies = len({arrays[0].shape for arrays in expected}) > 1  # the scores' shape changes between steps
    indexes = [folder / "o0.index.npy" if (folder / "o0.index.npy").exists() else None, None]
    assert (indexes[0] is not None) == varies
    read = OutputFiles("run r", ["scores", "index"], samples, [folder / "o0.npy", folder / "o1.npy"], indexes,
                       shapes.to_json())
    for index, arrays in enumerate(expected):
        got = read.sample(index)
        assert [a.shape for a in got] == [a.shape for a in arrays]
        assert [a.tobytes() for a in got] == [a.tobytes() for a in arrays]
    for start, stop in blocks(read, size=4):
        block = read.block(start, stop)
        if varies:
            assert block is None or all(b.shape[0] == stop - start for b in block)
            continue
        for k in range(2):
            assert block[k].tobytes() == np.stack([expected[i][k] for i in range(start, stop)]).tobytes()


def test_a_block_of_samples_with_a_batch_axis_of_one_is_one_batch():
    block = np.arange(12, dtype=np.float32).reshape(4, 1, 3)
    assert merged(block).shape == (4, 3) and merged(np.zeros((4, 1))) is None and merged(np.zeros((4, 2, 3))) is None


def test_outputs_that_are_no_tensors_are_refused(tmp_path):
    writer = OutputWriter(tmp_path / "outputs", ["boxes"], 1)
    with pytest.raises(UnsupportedModelError, match=r"output 'boxes' is not a tensor of numbers"):
        writer.write_step([np.array([{"a": 1}], dtype=object)], 1)
    writer.abandon()


def test_an_output_file_of_other_samples_is_refused(tmp_path):
    np.save(tmp_path / "o0.npy", np.zeros((2, 1, 3), np.float32))
    with pytest.raises(RunStoreError, match=r"run r: [^ ]*/o0.npy holds 2 samples, the manifest 3"):
        OutputFiles("run r", ["x"], 3, [tmp_path / "o0.npy"], [None], [[1, 3]])


def test_blocks_keep_to_a_byte_budget(tmp_path):
    writer = OutputWriter(tmp_path / "outputs", ["map"], 10)
    for _ in range(10):
        writer.write_step([np.zeros((1, 1000), np.float32)], 1)
    shapes = ShapeTable()
    writer.close(shapes)
    read = OutputFiles("run r", ["map"], 10, [tmp_path / "outputs" / "o0.npy"], [None], shapes.to_json())
    assert list(blocks(read, size=4096, budget=12_000)) == [(0, 3), (3, 6), (6, 9), (9, 10)]
