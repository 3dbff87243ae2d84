"""An input set: an ordered list of samples, each a ``{input_name: array}`` with batch dimension 1.

Sources:

* ``package:photos`` — the photographs shipped in scikit-image and scikit-learn (``qconsist.inputs.photos``)
* ``package:photos:augmented:COUNT[:SEED]`` — COUNT samples made from those photographs by seeded random
  crops and flips (``qconsist.inputs.augment``), each made when read: an evaluation of any size
* a folder of images (``.png .jpg .jpeg .bmp .tif .tiff .gif .webp``), sorted by file name
* a ``.npy`` file: one array stacked on axis 0 (``N × sample shape``) for a single-input model
* a ``.npz`` file: one stacked array per input name (or one array for a single-input model)
* a folder of ``.npy`` files, one sample each, sorted by file name

Samples are produced one at a time, so memory does not grow with the number of samples. The ``digest``
(sha256 over every sample's exact bytes, in order) identifies the input set across runs, whatever the batch
size it is later run with. ``batches(n)`` stacks ``n`` samples on axis 0 (the last step may hold fewer).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from qconsist.errors import ConfigError, InputError, ShapeMismatchError
from qconsist.inputs import augment
from qconsist.inputs.photos import package_photos
from qconsist.inputs.package import is_package_path, resolve_package_path
from qconsist.inputs.preprocess import Preprocess, image_mode, mode_rule

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".webp"}
PACKAGE_PHOTOS = "package:photos"

Sample = dict[str, np.ndarray]


@dataclass
class InputSpec:
    """The model input a sample must fit: name, element type and shape (None / str for free dims)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


@dataclass
class InputSet:
    source: str
    kind: str  # "images" | "arrays"
    names: list[str]  # one per sample
    _load: Callable[[int], Sample]
    preprocess: Preprocess | None = None
    paths: list[Path] | None = None  # image sets: one file per sample (their modes are reported)
    stored: dict[str, str] | None = None  # array sets: the dtype of each input as stored
    cast: dict[str, str] | None = None  # set by ``checked``: inputs whose stored dtype is cast to the model's

    def __len__(self) -> int:
        return len(self.names)

    def sample(self, index: int) -> Sample:
        return self._load(index)

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self.names)):
            yield self._load(i)

    def subset(self, offset: int = 0, count: int | None = None) -> "InputSet":
        if offset < 0 or (count is not None and count <= 0):
            raise InputError(f"invalid input subset offset={offset} count={count}")
        end = len(self.names) if count is None else offset + count
        if end > len(self.names) or offset >= len(self.names):
            raise InputError(
                f"input set {self.source} has {len(self.names)} samples; asked for {offset}..{end - 1}"
            )
        base = self._load
        paths = self.paths[offset:end] if self.paths is not None else None
        return InputSet(self.source, self.kind, self.names[offset:end], lambda i: base(offset + i), self.preprocess,
                        paths, self.stored, self.cast)

    def digest(self) -> str:
        """sha256 over every sample's input names, dtypes, shapes and bytes, in order."""
        h = hashlib.sha256()
        for sample in self:
            for name in sorted(sample):
                arr = np.ascontiguousarray(sample[name])
                h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
                h.update(arr.tobytes())
        return h.hexdigest()

    def describe(self) -> dict:
        # numbered sets (augmented photos) are named by their source: no list that grows with the count
        names = [] if isinstance(self.names, _Numbered) else list(self.names)
        data = {"source": self.source, "kind": self.kind, "count": len(self.names), "names": names}
        if self.preprocess is not None:
            data["preprocess"] = self.preprocess.to_json()
        if self.paths is not None:  # how each non-RGB image was converted (``mode_rule``)
            rules = {name: mode_rule(image_mode(path)) for name, path in zip(self.names, self.paths)}
            data["conversions"] = {name: rule for name, rule in rules.items() if rule is not None}
        if self.stored is not None:
            data["dtype"] = dict(self.stored)
        if self.cast:
            data["cast"] = dict(self.cast)
        return data

    def batches(self, size: int = 1) -> Iterator[tuple[int, Sample]]:
        """Steps of ``size`` samples stacked on axis 0, as ``(index of the first sample, stacked sample)``;
        the last step holds what is left."""
        check_batch_size(size)
        for start in range(0, len(self.names), size):
            samples = [self._load(i) for i in range(start, min(start + size, len(self.names)))]
            if len(samples) == 1:
                yield start, samples[0]
            else:
                yield start, {name: np.concatenate([s[name] for s in samples]) for name in samples[0]}

    def checked(self, specs: Sequence[InputSpec], batch_size: int = 1) -> "InputSet":
        """Wrap the loader so every sample is checked against the model's inputs (names, rank, fixed dims)."""
        base = self._load

        def load(i: int) -> Sample:
            return check_sample(base(i), specs, self.names[i])

        if len(self.names):
            load(0)  # fail early with a clear message
        if batch_size != 1:
            check_batching(specs, batch_size, len(self.names))
        wanted = {spec.name: np.dtype(spec.dtype).name for spec in specs}
        stored = self.stored or {}
        if len(specs) == 1 and len(stored) == 1:
            stored = {specs[0].name: next(iter(stored.values()))}
        cast = {name: f"{stored[name]} -> {dtype}" for name, dtype in wanted.items() if name in stored and stored[name] != dtype}
        return InputSet(self.source, self.kind, self.names, load, self.preprocess, self.paths, self.stored, cast or None)


def check_batch_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"`batch_size` must be an integer >= 1, got {size!r}")
    return size


def check_batching(specs: Sequence[InputSpec], size: int, count: int) -> None:
    """The model takes steps of ``size`` samples (and the last, smaller step): its batch dimension is free."""
    check_batch_size(size)
    for spec in specs:
        first = spec.shape[0] if spec.shape else None
        sizes = {size} | ({count % size} if count % size else set())
        if isinstance(first, int) and first > 0 and sizes != {first}:
            raise ShapeMismatchError(
                f"model input '{spec.name}' has a fixed batch dimension of {first}; `batch_size` {size} needs a "
                "dynamic one: convert with [convert] dynamic_batch = true, or re-stamp the model with `dynamic_batch`"
            )


def check_sample(sample: Sample, specs: Sequence[InputSpec], label: str) -> Sample:
    if len(specs) == 1 and len(sample) == 1 and next(iter(sample)) not in {specs[0].name}:
        sample = {specs[0].name: next(iter(sample.values()))}
    wanted = {s.name for s in specs}
    if set(sample) != wanted:
        raise ShapeMismatchError(
            f"sample {label} has inputs {sorted(sample)}, the model wants {sorted(wanted)}"
        )
    out = {}
    for spec in specs:
        arr = sample[spec.name]
        if arr.ndim != len(spec.shape) or any(
            isinstance(d, int) and d > 0 and d != a for d, a in zip(spec.shape, arr.shape)
        ):
            shown = ["?" if not isinstance(d, int) or d <= 0 else d for d in spec.shape]
            raise ShapeMismatchError(
                f"sample {label}: input '{spec.name}' has shape {list(arr.shape)}, the model wants {shown}"
            )
        if arr.dtype != spec.dtype:
            if np.issubdtype(arr.dtype, np.floating) and np.issubdtype(spec.dtype, np.floating):
                arr = arr.astype(spec.dtype)
            else:
                raise ShapeMismatchError(
                    f"sample {label}: input '{spec.name}' is {arr.dtype}, the model wants {spec.dtype}"
                )
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            nan = int(np.isnan(arr).sum())
            raise InputError(
                f"sample {label}: input '{spec.name}' holds {nan} NaN and {int((~np.isfinite(arr)).sum()) - nan} "
                "infinite value(s); every input must be finite"
            )
        out[spec.name] = arr
    return out


def _image_set(source: str, paths: list[Path], preprocess: Preprocess | None, input_name: str) -> InputSet:
    if preprocess is None:
        raise InputError(f"input set {source} holds images: the pipeline must declare [preprocess]")
    names = [p.name for p in paths]

    def load(i: int) -> Sample:
        return {input_name: preprocess.apply(paths[i])}

    return InputSet(source, "images", names, load, preprocess, paths=list(paths))


class _Numbered(Sequence[str]):
    """Sample names 000000, 000001, … made when asked: a set of any size holds no list of names."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [f"{i:06d}" for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(index)
        return f"{index % self.count:06d}"


def _npy_load(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"array file {path} does not exist") from None
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"cannot read array file {path}: {exc}") from None


def _stacked_set(source: str, arrays: dict[str, np.ndarray]) -> InputSet:
    counts = {name: a.shape[0] if a.ndim else 0 for name, a in arrays.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"{source}: arrays differ in sample count {counts}")
    count = next(iter(counts.values()))
    names = [f"{i:06d}" for i in range(count)]

    def load(i: int) -> Sample:
        return {name: np.ascontiguousarray(a[i : i + 1]) for name, a in arrays.items()}

    return InputSet(source, "arrays", names, load, stored={name: a.dtype.name for name, a in arrays.items()})


def open_input_set(
    source: str | Path,
    preprocess: Preprocess | None = None,
    input_name: str = "input",
) -> InputSet:
    """Open an input set from a path, ``package:photos`` or a ``package:<module>/<path>`` file or folder.
    Raises ``InputError`` for anything unusable."""
    text = str(source)
    if text.startswith(augment.PREFIX):
        count, seed = augment.parse_source(text)
        bases = augment.base_photos(package_photos(), preprocess)
        make = augment.AugmentedPhotos(bases, preprocess.crop, seed, preprocess.layout.value == "NCHW")  # type: ignore[union-attr,arg-type]
        return InputSet(text, "images", _Numbered(count), lambda i: {input_name: make(i)}, preprocess)
    if text == PACKAGE_PHOTOS:
        return _image_set(text, package_photos(), preprocess, input_name)
    if text.startswith("package:") and not is_package_path(text):
        raise InputError(f"unknown bundled input set {text!r}; the one bundled set is {PACKAGE_PHOTOS!r} "
                         "(a file of an installed package: package:<module>/<file>)")
    path = resolve_package_path(text) if text.startswith("package:") else Path(text)  # package:<module>/<file>
    if not path.exists():
        raise InputError(f"input set {path} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
        arrays = [p for p in files if p.suffix.lower() == ".npy"]
        if images and arrays:
            raise InputError(f"input folder {path} mixes images and .npy files; keep one kind")
        if images:
            return _image_set(str(path), images, preprocess, input_name)
        if arrays:
            def load(i: int) -> Sample:
                arr = _npy_load(arrays[i])
                return {input_name: np.ascontiguousarray(arr if arr.ndim and arr.shape[0] == 1 else arr[None])}

            return InputSet(str(path), "arrays", [p.name for p in arrays], load)
        raise InputError(f"input folder {path} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}) and no .npy files")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = _npy_load(path)
        if arr.ndim == 0:
            raise InputError(f"{path}: a 0-d array is not a stack of samples")
        return _stacked_set(str(path), {input_name: arr})
    if suffix == ".npz":
        try:
            archive = np.load(path, allow_pickle=False)
            arrays = {key: archive[key] for key in archive.files}
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"cannot read array file {path}: {exc}") from None
        if not arrays:
            raise InputError(f"{path} holds no arrays")
        return _stacked_set(str(path), arrays)
    if suffix in IMAGE_SUFFIXES:
        return _image_set(str(path), [path], preprocess, input_name)
    raise InputError(f"unsupported input {path}: give a folder of images, a .npy/.npz file, or {PACKAGE_PHOTOS}")
