"""An input set: an ordered list of samples, each a ``{input_name: array}`` with batch dimension 1.

Sources:

* ``package:photos`` — the photographs shipped in scikit-image and scikit-learn (``qconsist.inputs.photos``)
* ``package:photos:augmented:COUNT[:SEED]`` — COUNT samples made from those photographs by seeded random
  crops and flips (``qconsist.inputs.augment``), each made when read: an evaluation of any size
* a folder (``qconsist.inputs.folder``): images, flat or one subfolder per class (labelled by it), a flat
  image folder with a labels file, ``.npy`` files, one sample each, or ``.npz`` files, one sample each whose
  members are the model's inputs by name, fed exactly as they are (no batch axis added: rank-0 scales, fixed
  first axes, a state whose batch axis is 1)
* a ``.npy`` file: one array stacked on axis 0 (``N × sample shape``) for a single-input model
* a ``.npz`` file: one stacked array per input name (or one array for a single-input model)

Samples are made one at a time from their index by a picklable loader (``qconsist.inputs.loaders``), so
memory does not grow with the number of samples and input workers in other processes make the same bytes.
``batches(n)`` stacks ``n`` samples on axis 0 (the last step may hold fewer), prepared by ``workers``
(``qconsist.inputs.stream``). ``digest`` (``qconsist.inputs.digest``: xxh3-128 over the samples' digests)
identifies the input set across runs, whatever the batch size or the number of workers; ``labels`` are the
samples' classes where the set has them (``qconsist.inputs.labels``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from qconsist.errors import ConfigError, InputError, ShapeMismatchError
from qconsist.inputs import augment
from qconsist.inputs.axes import input_axes
from qconsist.inputs.digest import file_digest, legacy_digest, set_digest, SHA256, XXH3
from qconsist.inputs.folder import IMAGE_SUFFIXES, FilePaths, scan_folder
from qconsist.inputs.labels import Labels, read_labels
from qconsist.inputs.loaders import (
    Augmented, Checked, ImageFiles, NpyFiles, NpzFiles, Offset, Picked, Stacked, check_sample, load_npy,
)
from qconsist.inputs.photos import package_photos
from qconsist.inputs.package import is_package_path, resolve_package_path
from qconsist.inputs.preprocess import Preprocess, mode_rule
from qconsist.inputs.stream import SampleInfo, Step, resolve_workers, stack, steps
from qconsist.store.confine import load_npz, memory_bytes

PACKAGE_PHOTOS = "package:photos"

Sample = dict[str, np.ndarray]
__all__ = ["IMAGE_SUFFIXES", "InputSet", "InputSpec", "check_sample", "open_input_set"]


@dataclass
class InputSpec:
    """The model input a sample must fit: name, element type and shape (None / str for free dims)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]
    multiple: int | None = None  # a dynamic height and width must be multiples of this (the model's graph says)


@dataclass
class InputSet:
    source: str
    kind: str  # "images" | "arrays"
    names: Sequence[str]  # one per sample
    _load: Callable[[int], Sample]  # a ``loaders.Loader`` (or any function of the sample's index)
    preprocess: Preprocess | None = None
    paths: Sequence[Path] | None = None  # image sets: one file per sample (their modes are reported)
    stored: dict[str, str] | None = None  # array sets: the dtype of each input as stored
    cast: dict[str, str] | None = None  # set by ``checked``: inputs whose stored dtype is cast to the model's
    labels: Labels | None = None  # the samples' classes, where the set has them
    offset: int = 0  # where the first sample lies in the set ``source`` names
    workers: int | None = None  # input workers of ``batches`` (None: as many as help, ``stream.resolve_workers``)
    file: Path | None = None  # the one file a stacked set is read from
    axes: dict[str, int] | None = None  # set by ``checked``: each input's batch axis, where steps stack samples
    exact: bool = False  # samples fed exactly as they are (a folder of .npz files): NaN and Inf are values
    _infos: list[SampleInfo] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.names)

    def sample(self, index: int) -> Sample:
        return self._load(index)

    def label(self, index: int) -> int | None:
        """The class of sample ``index`` where the set has labels (a step from ``steps`` starts at ``step.start``)."""
        return self.labels.get(self.names[index]) if self.labels is not None else None

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self.names)):
            yield self._load(i)

    def _derived(self, **changes) -> "InputSet":
        return replace(self, _infos=None, **changes)

    def subset(self, offset: int = 0, count: int | None = None) -> "InputSet":
        if offset < 0 or (count is not None and count <= 0):
            raise InputError(f"invalid input subset offset={offset} count={count}")
        end = len(self.names) if count is None else offset + count
        if end > len(self.names) or offset >= len(self.names):
            raise InputError(
                f"input set {self.source} has {len(self.names)} samples; asked for {offset}..{end - 1}"
            )
        paths = self.paths[offset:end] if self.paths is not None else None
        return self._derived(names=self.names[offset:end], _load=Offset(self._load, offset), paths=paths,
                             offset=self.offset + offset)

    def picked(self, positions: Sequence[int]) -> "InputSet":
        """The samples at ``positions``, in that order (``offset`` is then meaningless: 0)."""
        names = [self.names[p] for p in positions]
        paths = [self.paths[p] for p in positions] if self.paths is not None else None
        return self._derived(names=names, _load=Picked(self._load, positions), paths=paths, offset=0)

    def with_workers(self, workers: int | None) -> "InputSet":
        """The same set, prepared by ``workers`` input workers in ``batches``."""
        resolve_workers(workers, len(self.names), True)  # validated now
        return replace(self, workers=workers)

    def steps(self, size: int = 1, borrowed: bool = False) -> Iterator[Step]:
        """Steps of ``size`` samples with what the workers learnt of each sample (``stream.Step``); with
        ``borrowed`` the arrays are views valid until two more steps are requested. A complete pass keeps the
        samples' digests (``sample_infos``)."""
        check_batch_size(size)
        workers = resolve_workers(self.workers, len(self.names), getattr(self._load, "parallel", False))
        return _Kept(self, steps(self._load, len(self.names), size, workers, borrowed, self.axes))  # workers start now

    def batches(self, size: int = 1) -> Iterator[tuple[int, Sample]]:
        """Steps of ``size`` samples stacked on axis 0, as ``(index of the first sample, stacked sample)``;
        the last step holds what is left."""
        for step in self.steps(size):
            yield step.start, step.arrays

    def step(self, start: int, stop: int) -> Sample:
        """Samples ``start .. stop-1`` stacked on axis 0, made here."""
        return stack([self._load(i) for i in range(start, min(stop, len(self.names)))], start, self.axes)

    def sample_infos(self) -> list[SampleInfo]:
        """Each sample's digest (and file digest, image mode), from the last complete pass or a new one."""
        if self._infos is None or len(self._infos) != len(self.names):
            try:
                for _ in self.steps(max(1, min(32, len(self.names)))):
                    pass
            except ShapeMismatchError:  # samples that do not stack (rank-0 inputs, sizes that vary): one at a time
                for _ in self.steps(1):
                    pass
        return list(self._infos or [])

    def digest(self, kind: str = XXH3) -> str:
        """The set's digest (``qconsist.inputs.digest``); ``kind`` sha256 computes the digest of old runs."""
        if kind == SHA256:
            return legacy_digest(self)
        return set_digest(info.digest for info in self.sample_infos())

    def describe(self, infos: Sequence[SampleInfo] | None = None) -> dict:
        """The manifest's record of the set (without its digest and sample table, ``qconsist.inputs.record``):
        ``infos`` (default: ``sample_infos``) say how each non-RGB image was converted."""
        data = {"source": self.source, "kind": self.kind, "count": len(self.names), "offset": self.offset}
        if self.preprocess is not None:
            data["preprocess"] = self.preprocess.to_json()
        if self.paths is not None:  # how each non-RGB image was converted (``mode_rule``)
            infos = self.sample_infos() if infos is None else infos
            rules = {name: mode_rule(info.mode) for name, info in zip(self.names, infos) if info.mode}
            data["conversions"] = {name: rule for name, rule in rules.items() if rule is not None}
        if self.stored is not None:
            data["dtype"] = dict(self.stored)
        if self.cast:
            data["cast"] = dict(self.cast)
        if self.exact:
            data["exact"] = True  # fed as they are: no axis added, NaN and Inf values allowed
        if self.file is not None:
            data["file_digest"] = XXH3 + ":" + file_digest(self.file).hex()
        if self.labels is not None:
            data["labels"] = self.labels.summary(self.names)
        return data

    def checked(self, specs: Sequence[InputSpec], batch_size: int = 1) -> "InputSet":
        """Wrap the loader so every sample is checked against the model's inputs (names, rank, fixed dims)."""
        if self.kind == "images" and self.preprocess is not None:
            check_spatial(specs, self.preprocess)
        load = Checked(self._load, list(specs), self.names, finite=not self.exact)
        if len(self.names):
            load(0)  # fail early with a clear message
        if batch_size != 1:
            check_batching(specs, batch_size, len(self.names))
        wanted = {spec.name: np.dtype(spec.dtype).name for spec in specs}
        stored = self.stored or {}
        if len(specs) == 1 and len(stored) == 1:
            stored = {specs[0].name: next(iter(stored.values()))}
        cast = {name: f"{stored[name]} -> {dtype}" for name, dtype in wanted.items() if name in stored and stored[name] != dtype}
        axes = {name: axis for name, axis in input_axes(specs).items() if axis}
        return self._derived(_load=load, cast=cast or None, axes=axes or None)


def check_spatial(specs: Sequence[InputSpec], preprocess: Preprocess) -> None:
    """Images fit an input whose height and width are dynamic only at a declared size, one the model takes
    (``InputSpec.multiple``): said before any work, in one line, instead of failing inside ONNX Runtime."""
    size, key = (preprocess.crop, "crop") if preprocess.crop is not None else (preprocess.resize, "resize")
    for spec in specs:
        if len(spec.shape) != 4:
            continue
        spatial = spec.shape[2:4] if preprocess.layout.value == "NCHW" else spec.shape[1:3]
        dynamic = sum(not isinstance(d, int) or d <= 0 for d in spatial)
        multiple = spec.multiple
        if dynamic == 2 and size is None:
            raise ShapeMismatchError(f"input {spec.name} has dynamic height and width: declare [preprocess] resize"
                                     + (f" (the model takes multiples of {multiple})" if multiple else ""))
        if dynamic and multiple and size is not None and (size[0] % multiple or size[1] % multiple):
            raise ShapeMismatchError(
                f"input {spec.name} takes heights and widths that are multiples of {multiple}: [preprocess] {key} "
                f"{list(size)} is not; declare multiples of {multiple}")


def check_batch_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"`batch_size` must be an integer >= 1, got {size!r}")
    return size


def check_batching(specs: Sequence[InputSpec], size: int, count: int) -> None:
    """The model takes steps of ``size`` samples (and the last, smaller step): every input has a free batch
    axis (``axes.input_axes``: the one its graph names)."""
    check_batch_size(size)
    if size == 1 or count <= 1:
        return
    axes = input_axes(specs)
    for spec in specs:
        if axes[spec.name] is not None:
            continue
        first = spec.shape[0] if spec.shape else None
        sizes = {size} | ({count % size} if count % size else set())
        fixed = bool(spec.shape) and all(isinstance(d, int) and d > 0 for d in spec.shape)
        if fixed and sizes == {first}:
            continue  # every step is the model's fixed batch (stacked on axis 0)
        if fixed:
            raise ShapeMismatchError(
                f"model input '{spec.name}' has a fixed batch dimension of {first}; `batch_size` {size} needs a "
                "dynamic one: convert with [convert] dynamic_batch = true, or re-stamp the model with `dynamic_batch`"
            )
        shown = "[" + ", ".join("?" if not isinstance(d, int) or d <= 0 else str(d) for d in spec.shape) + "]"
        raise ShapeMismatchError(
            f"model input '{spec.name}' (shape {shown}) has no batch axis its graph names; `batch_size` {size} "
            "stacks samples on it: run with `batch_size` 1"
        )


def _image_set(source: str, paths: Sequence[Path], preprocess: Preprocess | None, input_name: str,
               names: list[str] | None = None, labels: Labels | None = None) -> InputSet:
    if preprocess is None:
        raise InputError(f"input set {source} holds images: the pipeline must declare [preprocess]")
    kept = paths if isinstance(paths, FilePaths) else list(paths)  # a listing's paths stay strings until asked for
    return InputSet(source, "images", names or [p.name for p in kept], ImageFiles(kept, preprocess, input_name),
                    preprocess, paths=kept, labels=labels)


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


def _stacked_set(source: str, arrays: dict[str, np.ndarray], path: Path) -> InputSet:
    counts = {name: a.shape[0] if a.ndim else 0 for name, a in arrays.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"{source}: arrays differ in sample count {counts}")
    count = next(iter(counts.values()))
    return InputSet(source, "arrays", _Numbered(count), Stacked(arrays),
                    stored={name: a.dtype.name for name, a in arrays.items()}, file=path)


def open_input_set(
    source: str | Path,
    preprocess: Preprocess | None = None,
    input_name: str = "input",
    labels: Path | None = None,
) -> InputSet:
    """Open an input set from a path, ``package:photos`` or a ``package:<module>/<path>`` file or folder;
    ``labels``: a labels file for its samples (``qconsist.inputs.labels``), where the set itself has none.
    Raises ``InputError`` for anything unusable."""
    opened = _open(source, preprocess, input_name, labels)
    if labels is not None and opened.labels is None:
        if opened.kind != "images":
            raise ConfigError(f"input set {opened.source} holds arrays; labels are read for images")
        opened.labels = read_labels(Path(labels))
    return opened


def _open(source: str | Path, preprocess: Preprocess | None, input_name: str, labels: Path | None) -> InputSet:
    text = str(source)
    if text.startswith(augment.PREFIX):
        count, seed = augment.parse_source(text)
        bases = augment.PhotoBases(package_photos(), preprocess)
        make = augment.AugmentedPhotos(bases, preprocess.crop, seed, preprocess.layout.value == "NCHW")  # type: ignore[union-attr,arg-type]
        return InputSet(text, "images", _Numbered(count), Augmented(make, input_name), preprocess)
    if text == PACKAGE_PHOTOS:
        return _image_set(text, package_photos(), preprocess, input_name)
    if text.startswith("package:") and not is_package_path(text):
        raise InputError(f"unknown bundled input set {text!r}; the one bundled set is {PACKAGE_PHOTOS!r} "
                         "(a file of an installed package: package:<module>/<file>)")
    path = resolve_package_path(text) if text.startswith("package:") else Path(text)  # package:<module>/<file>
    if not path.exists():
        raise InputError(f"input set {path} does not exist")
    if path.is_dir():
        found = scan_folder(path, Path(labels) if labels is not None else None)
        if found.kind == "images":
            return _image_set(str(path), found.files, preprocess, input_name, found.names, found.labels)
        if found.kind == "steps":
            return InputSet(str(path), "arrays", found.names, NpzFiles(found.files), exact=True)
        return InputSet(str(path), "arrays", found.names, NpyFiles(found.files, input_name))
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = load_npy(path)
        if arr.ndim == 0:
            raise InputError(f"{path}: a 0-d array is not a stack of samples")
        return _stacked_set(str(path), {input_name: arr}, path)
    if suffix == ".npz":
        # checked as a run directory's .npz is, before anything but the members' headers is decompressed; read
        # into memory, so at most this machine's memory
        arrays = load_npz(path, f"input set {path}", error=InputError, budget=memory_bytes())
        if not arrays:
            raise InputError(f"{path} holds no arrays")
        return _stacked_set(str(path), arrays, path)
    if suffix in IMAGE_SUFFIXES:
        return _image_set(str(path), [path], preprocess, input_name)
    raise InputError(f"unsupported input {path}: give a folder of images, a .npy/.npz file, or {PACKAGE_PHOTOS}")


class _Kept:
    """The steps of ``source`` (``stream.steps``), the samples' infos kept for ``InputSet.sample_infos`` once the pass
    is complete; ``close`` stops ``source``'s workers at once (and unregisters its ring, where it was page-locked)."""

    def __init__(self, owner: InputSet, source: Iterator[Step]) -> None:
        self.owner, self.source = owner, source
        self.infos: list[SampleInfo] = []
        self.finished = False

    def __iter__(self) -> "_Kept":
        return self

    def __next__(self) -> Step:
        if self.finished:
            raise StopIteration
        try:
            step = next(self.source)
        except StopIteration:
            self.finished = True
            self.owner._infos = self.infos
            raise
        except BaseException:
            self.finished = True
            raise
        self.infos += step.infos
        return step

    def close(self) -> None:
        self.finished = True
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
