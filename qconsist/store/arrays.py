"""Arrays written as a run goes: one ``.npy`` file per output, appended step by step, read back in blocks.

``StreamedArray`` writes a ``.npy`` file whose header is only known at the end (the number of samples, a
shape that may vary): it reserves ``HEADER_BYTES`` at the start, appends the data as it comes (sequential
writes, nothing held in memory) and writes the real header, padded with spaces as numpy pads its own, when
it is closed. The result is a plain ``.npy`` (version 1.0) that ``numpy.load(..., mmap_mode="r")`` maps.

**Final outputs of an inference run** (format ``qconsist.outputs/2``; ``OutputWriter`` / ``OutputFiles``):
``outputs/o<i>.npy`` for output ``i`` (the order of ``sections.inference.outputs``):

* every sample of the same shape: an array of shape ``(samples, *sample shape)``; sample ``s`` is ``[s]``,
  the sample's array as a step of one sample gives it (the runner divides a step's output along its own batch
  axis, ``qconsist.inference.batch``: a batched output keeps its batch axis with the sample's extent, an output
  without one is the step's whole output, once per sample of the step);
* shapes that vary by sample (a detector's boxes): a flat array of every sample's elements in sample order,
  and ``outputs/o<i>.index.npy``: per sample its element offset and shape (an id into
  ``sections.inference.output_shapes``).

Runs written before (``qconsist.outputs/1``) hold one ``outputs/<sample>.npz`` per sample (keys ``o<i>``):
``SampleArchives`` reads them with the same interface, so a new run and an old one diff alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from qconsist.errors import RunStoreError, UnsupportedModelError
from qconsist.store.confine import check_npy, load_npz

FORMAT = "qconsist.outputs/2"
LEGACY_FORMAT = "qconsist.outputs/1"
HEADER_BYTES = 1024  # reserved for the .npy header written at the end (a multiple of numpy's 64-byte alignment)
_MAGIC = b"\x93NUMPY\x01\x00"
INDEX = np.dtype([("offset", "<u8"), ("shape", "<u4")])


def npy_header(dtype: np.dtype, shape: tuple[int, ...], size: int = HEADER_BYTES) -> bytes:
    """A version 1.0 ``.npy`` header of exactly ``size`` bytes (numpy's own dictionary, padded with spaces)."""
    text = repr({"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)})
    room = size - len(_MAGIC) - 2
    if len(text) + 1 > room:
        raise ValueError(f"a .npy header for shape {shape} does not fit in {size} bytes")
    body = (text + " " * (room - len(text) - 1) + "\n").encode("latin1")
    return _MAGIC + len(body).to_bytes(2, "little") + body


class StreamedArray:
    """A ``.npy`` file appended to in pieces; ``close(shape)`` writes its header (see the module docstring)."""

    def __init__(self, path: Path, dtype: np.dtype | None = None) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype) if dtype is not None else None
        self.bytes = 0
        self._handle = open(self.path, "wb")
        self._handle.write(b"\0" * HEADER_BYTES)

    def append(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if self.dtype is None:
            self.dtype = array.dtype
        elif array.dtype != self.dtype:
            raise ValueError(f"{self.path.name}: {array.dtype} appended to an array of {self.dtype}")
        self._handle.write(array.data if array.size else b"")
        self.bytes += array.nbytes

    def close(self, shape: tuple[int, ...] | None = None) -> None:
        """Write the header: ``shape`` (default: flat) must hold exactly the bytes appended."""
        dtype = self.dtype if self.dtype is not None else np.dtype("u1")
        shape = (self.bytes // dtype.itemsize,) if shape is None else tuple(int(d) for d in shape)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != self.bytes:
            raise ValueError(f"{self.path.name}: shape {shape} does not hold the {self.bytes} bytes written")
        self._handle.seek(0)
        self._handle.write(npy_header(dtype, shape))
        self._handle.close()

    def abandon(self) -> None:
        self._handle.close()


# --- writing a run's final outputs -------------------------------------------------------------------------------


@dataclass
class _Output:
    """One output's file while it is written: its sample shapes as runs ``[first sample, shape]``."""

    file: StreamedArray
    runs: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    def add(self, sample: int, shape: tuple[int, ...]) -> None:
        if not self.runs or self.runs[-1][1] != shape:
            self.runs.append((sample, shape))


def sample_rows(array: np.ndarray, count: int) -> np.ndarray:
    """One step's output as ``(count, *sample shape)``: split along its first axis when that axis is the step's
    (each sample keeps an axis of 1), else the whole output once per sample (a view, nothing copied)."""
    array = np.asarray(array)
    if count > 1 and array.ndim and array.shape[0] == count:
        return array.reshape(count, 1, *array.shape[1:])
    return np.broadcast_to(array, (count, *array.shape))


class OutputWriter:
    """The final outputs of a run, one file per output, written a step at a time in sample order."""

    def __init__(self, folder: Path, names: Sequence[str], samples: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.names, self.samples = folder, list(names), samples
        self._outputs = [_Output(StreamedArray(folder / f"o{i}.npy")) for i in range(len(self.names))]
        self._written = 0

    def write_step(self, produced: Sequence[np.ndarray], count: int,
                   split: Sequence[Sequence[np.ndarray]] | None = None) -> None:
        """One step's outputs as the session gave them, for ``count`` samples, and ``split``: each output
        already divided into its samples' parts (the runner's, by the batch axis the graph gives it); without
        it, an output whose first axis is the step's is split per sample (each keeps an axis of 1) and any
        other is the whole output of each."""
        for k, (name, output, array) in enumerate(zip(self.names, self._outputs, produced)):
            if not isinstance(array, np.ndarray) or array.dtype.hasobject:
                raise UnsupportedModelError(f"output {name!r} is not a tensor of numbers ({type(array).__name__}); "
                                            "qconsist records tensors")
            if split is not None:
                parts = [np.asarray(p) for p in split[k]]
                if any(p.shape != parts[0].shape for p in parts):
                    raise UnsupportedModelError(f"output {name!r}: the samples of a step have parts of different "
                                                "shapes; run with `batch_size` 1")
                rows = np.stack(parts) if count > 1 else array[None]
            else:
                rows = sample_rows(array, count)
            output.add(self._written, tuple(rows.shape[1:]))
            output.file.append(rows)
        self._written += count

    def close(self, shapes: "ShapeTable") -> list[str]:
        """Write the headers (and the index of outputs whose shape varies); the files' run paths."""
        if self._written != self.samples:
            raise ValueError(f"{self._written} samples written, {self.samples} expected")
        files = []
        for index, output in enumerate(self._outputs):
            if len(output.runs) <= 1:
                sample_shape = output.runs[0][1] if output.runs else ()
                shapes.id(sample_shape)
                output.file.close((self.samples, *sample_shape))
            else:
                output.file.close()
                _write_index(self.folder / f"o{index}.index.npy", output.runs, self.samples, shapes)
            files.append(f"{self.folder.name}/o{index}.npy")
        return files

    def abandon(self) -> None:
        for output in self._outputs:
            output.file.abandon()


class ShapeTable:
    """Shapes numbered in order of first appearance (the run's ``output_shapes``)."""

    def __init__(self, shapes: Sequence[Sequence[int]] = ()) -> None:
        self.shapes: list[tuple[int, ...]] = [tuple(s) for s in shapes]
        self._ids = {shape: i for i, shape in enumerate(self.shapes)}

    def id(self, shape: tuple[int, ...]) -> int:
        found = self._ids.get(shape)
        if found is None:
            found = self._ids[shape] = len(self.shapes)
            self.shapes.append(shape)
        return found

    def to_json(self) -> list[list[int]]:
        return [list(s) for s in self.shapes]


def _write_index(path: Path, runs: list[tuple[int, tuple[int, ...]]], samples: int, shapes: ShapeTable) -> None:
    index = np.zeros(samples, dtype=INDEX)
    bounds = [first for first, _ in runs[1:]] + [samples]
    offset = 0
    for (first, shape), stop in zip(runs, bounds):
        size = int(np.prod(shape, dtype=np.int64))
        index["offset"][first:stop] = offset + size * np.arange(stop - first, dtype=np.uint64)
        index["shape"][first:stop] = shapes.id(shape)
        offset += size * (stop - first)
    np.save(path, index)


# --- reading ---------------------------------------------------------------------------------------------------


class OutputArrays:
    """A run's final outputs, sample by sample or a block of samples at a time (both layouts)."""

    names: list[str]
    samples: int

    def sample(self, index: int) -> list[np.ndarray]:
        raise NotImplementedError

    def sample_bytes(self) -> int:
        """The bytes of one sample's outputs (of the first: an estimate where they vary)."""
        return sum(a.nbytes for a in self.sample(0)) if self.samples else 0

    def block(self, start: int, stop: int) -> list[np.ndarray] | None:
        """Every output of samples ``start:stop`` stacked, ``(n, *sample shape)``; ``None`` where the samples'
        shapes differ."""
        arrays = [self.sample(i) for i in range(start, stop)]
        stacked = []
        for k in range(len(self.names)):
            parts = [a[k] for a in arrays]
            if any(p.shape != parts[0].shape or p.dtype != parts[0].dtype for p in parts):
                return None
            stacked.append(np.stack(parts) if parts else np.zeros((0,)))
        return stacked


BLOCK = 4096  # samples per block when outputs are read in blocks, at most
BLOCK_BYTES = 64 << 20  # and at most this many bytes of one run's outputs


def blocks(outputs: OutputArrays, size: int = BLOCK, budget: int = BLOCK_BYTES) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of samples, each of at most ``size`` samples and about ``budget``
    bytes of outputs (a segmentation map of 21 MB a sample is read a few samples at a time)."""
    if not outputs.samples:
        return
    size = max(1, min(size, budget // max(1, outputs.sample_bytes())))
    for start in range(0, outputs.samples, size):
        yield start, min(start + size, outputs.samples)


@dataclass
class _File:
    array: np.ndarray  # memory-mapped
    index: np.ndarray | None = None  # varying shapes: INDEX per sample
    shapes: list[tuple[int, ...]] = field(default_factory=list)


class OutputFiles(OutputArrays):
    """``qconsist.outputs/2``: one memory-mapped array per output."""

    def __init__(self, where: str, names: Sequence[str], samples: int, files: Sequence[Path],
                 indexes: Sequence[Path | None], shapes: Sequence[Sequence[int]]) -> None:
        self.names, self.samples, self._where = list(names), samples, where
        self._files = [self._open(path, index, [tuple(s) for s in shapes]) for path, index in zip(files, indexes)]

    def _open(self, path: Path, index: Path | None, shapes: list[tuple[int, ...]]) -> _File:
        where = f"{self._where}: {path.parent.name}/{path.name}"
        shape = check_npy(path, where)
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        if index is None:
            if not shape or shape[0] != self.samples:
                raise RunStoreError(f"{where} holds {shape[0] if shape else 0} samples, the manifest {self.samples}")
            return _File(array)
        check_npy(index, f"{where[:-4]}.index.npy", dtype=INDEX, ndim=1)
        table = np.load(index, mmap_mode="r", allow_pickle=False)
        if table.shape[0] != self.samples or (table.size and int(table["shape"].max()) >= len(shapes)):
            raise RunStoreError(f"{where[:-4]}.index.npy does not fit the manifest ({table.shape[0]} samples, "
                                f"{len(shapes)} shapes)")
        return _File(array, table, shapes)

    def _one(self, file: _File, index: int) -> np.ndarray:
        if file.index is None:
            return np.asarray(file.array[index])
        entry = file.index[index]
        shape = file.shapes[int(entry["shape"])]
        start = int(entry["offset"])
        stop = start + int(np.prod(shape, dtype=np.int64))
        if stop > file.array.shape[0]:
            raise RunStoreError(f"{self._where}: the output index points past the end of its array")
        return np.asarray(file.array[start:stop]).reshape(shape)

    def sample(self, index: int) -> list[np.ndarray]:
        return [self._one(f, index) for f in self._files]

    def sample_bytes(self) -> int:
        return sum(f.array.nbytes // max(1, self.samples) for f in self._files)

    def block(self, start: int, stop: int) -> list[np.ndarray] | None:
        if any(f.index is not None for f in self._files):
            return super().block(start, stop)
        return [np.asarray(f.array[start:stop]) for f in self._files]


class SampleArchives(OutputArrays):
    """``qconsist.outputs/1`` (runs written before): one ``.npz`` per sample, each verified as it is opened."""

    def __init__(self, where: str, names: Sequence[str], samples: int, archive: Callable[[str], Path]) -> None:
        self.names, self.samples, self._where, self._archive = list(names), samples, where, archive

    def sample(self, index: int) -> list[np.ndarray]:
        relative = f"outputs/{index:06d}.npz"
        path = self._archive(relative)
        arrays = load_npz(path, f"{self._where}: {relative}", [f"o{i}" for i in range(len(self.names))])
        return [arrays[f"o{i}"] for i in range(len(self.names))]


def merged(array: np.ndarray) -> np.ndarray | None:
    """A block ``(n, 1, ...)`` of per-sample arrays that each keep a batch axis of 1, as one batch ``(n, ...)``;
    ``None`` when the samples' arrays have no such axis (then they are compared sample by sample)."""
    if array.ndim >= 3 and array.shape[1] == 1:
        return array.reshape(array.shape[0], *array.shape[2:])
    return None


__all__ = ["BLOCK", "FORMAT", "LEGACY_FORMAT", "OutputArrays", "OutputFiles", "OutputWriter", "SampleArchives",
           "ShapeTable", "StreamedArray", "blocks", "merged", "npy_header", "sample_rows"]
