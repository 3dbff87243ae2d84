"""How each sample of an input set is made from its index: small picklable objects, so that an input worker
in another process (``qconsist.inputs.stream``) makes exactly the bytes this process would.

``prepare(index)`` returns the sample (``{input name: array}``, batch dimension 1) and, for images, the PIL
mode the file had before conversion (``preprocess.mode_rule``); ``file(index)`` names the file the sample
is read from, whose bytes the run records a digest of. ``parallel`` says whether preparing a sample is
worth a worker process (decoding images: yes; slicing arrays: no, a thread of this process reads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qconsist.errors import InputError, QconsistError, ShapeMismatchError
from qconsist.inputs.folder import FilePaths
from qconsist.store.confine import load_npz

Sample = dict[str, np.ndarray]


class Loader:
    """Sample ``index`` of a set (see the module docstring)."""

    parallel = False

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        raise NotImplementedError

    def file(self, index: int) -> Path | None:
        return None

    def __call__(self, index: int) -> Sample:
        return self.prepare(index)[0]


class ImageFiles(Loader):
    """Images decoded and prepared as ``preprocess`` declares."""

    parallel = True

    def __init__(self, paths: Sequence[Path], preprocess: Any, input_name: str) -> None:  # preprocess: Preprocess
        # a listing's paths (``folder.FilePaths``) as they are: strings until one is asked for
        self.paths = paths if isinstance(paths, FilePaths) else list(paths)
        self.preprocess, self.input_name = preprocess, input_name

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        array, mode = self.preprocess.prepare(self.paths[index])
        return {self.input_name: array}, mode

    def file(self, index: int) -> Path | None:
        return self.paths[index]


class Augmented(Loader):
    """``package:photos:augmented``: sample ``index`` cropped and flipped from the base photos by its seed."""

    parallel = True

    def __init__(self, make: Any, input_name: str) -> None:  # make: augment.AugmentedPhotos
        self.make, self.input_name = make, input_name

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        return {self.input_name: self.make(index)}, None


class NpyFiles(Loader):
    """A folder of ``.npy`` files, one sample each (a leading axis of 1 is added where missing)."""

    def __init__(self, paths: Sequence[Path], input_name: str) -> None:
        self.paths, self.input_name = list(paths), input_name

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        array = load_npy(self.paths[index])
        return {self.input_name: np.ascontiguousarray(array if array.ndim and array.shape[0] == 1 else array[None])}, None

    def file(self, index: int) -> Path | None:
        return self.paths[index]


class NpzFiles(Loader):
    """A folder of ``.npz`` files, one sample each: its members are the model's inputs by name, fed exactly as
    they are (nothing added or removed: a rank-0 scale stays rank 0, a state ``[2, 1, 128]`` keeps its axes; NaN
    and infinities are values like any other, as ONNX's own ``IsNaN`` tests feed them)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        path = self.paths[index]
        try:
            arrays = load_npz(path, f"input file {path}")
        except QconsistError as exc:
            raise InputError(exc.message) from None
        if not arrays:
            raise InputError(f"input file {path} holds no arrays")
        return {name: np.array(a, order="C", copy=True) for name, a in arrays.items()}, None  # rank 0 stays rank 0

    def file(self, index: int) -> Path | None:
        return self.paths[index]


class Stacked(Loader):
    """Arrays stacked on axis 0 (a ``.npy`` memory map, or a ``.npz`` read into memory), one per input name."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        return {name: np.ascontiguousarray(a[index: index + 1]) for name, a in self.arrays.items()}, None


class Offset(Loader):
    """Samples ``offset``, ``offset + 1``, … of another loader (a subset)."""

    def __init__(self, base: Any, offset: int) -> None:
        self.base, self.offset = base, offset
        self.parallel = getattr(base, "parallel", False)

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        return prepare(self.base, self.offset + index)

    def file(self, index: int) -> Path | None:
        return file_of(self.base, self.offset + index)


class Picked(Loader):
    """The samples of another loader at ``positions``, in that order."""

    def __init__(self, base: Any, positions: Sequence[int]) -> None:
        self.base, self.positions = base, list(positions)
        self.parallel = getattr(base, "parallel", False)

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        return prepare(self.base, self.positions[index])

    def file(self, index: int) -> Path | None:
        return file_of(self.base, self.positions[index])


class Checked(Loader):
    """Another loader's samples checked against the model's inputs (``check_sample``): names, rank, fixed
    dimensions, element type (floats cast), finite values."""

    def __init__(self, base: Any, specs: Sequence[Any], names: Sequence[str], finite: bool = True) -> None:  # specs: InputSpec
        self.base, self.specs, self.names, self.finite = base, list(specs), names, finite
        self.parallel = getattr(base, "parallel", False)

    def prepare(self, index: int) -> tuple[Sample, str | None]:
        sample, mode = prepare(self.base, index)
        return check_sample(sample, self.specs, self.names[index], self.finite), mode

    def file(self, index: int) -> Path | None:
        return file_of(self.base, index)


def _layout_hint(found: list[int], wanted: list) -> str:
    """Where an image batch's channels sit at the other end from the model's (NCHW given, [?, H, W, 3] wanted, or
    the reverse), the [preprocess] layout that would match, said as a possibility: shapes alone prove nothing."""
    if len(found) != 4 or len(wanted) != 4:
        return ""
    if found[1] in (1, 3) and wanted[3] == found[1] and wanted[1:3] in ([found[2], found[3]], ["?", "?"]):
        return '; if the model takes channels last, declare [preprocess] layout = "NHWC"'
    if found[3] in (1, 3) and wanted[1] == found[3] and wanted[2:4] in ([found[1], found[2]], ["?", "?"]):
        return '; if the model takes channels first, declare [preprocess] layout = "NCHW"'
    return ""

def prepare(loader: Any, index: int) -> tuple[Sample, str | None]:
    """Sample ``index`` of any loader (a ``Loader``, or a plain function of the index)."""
    return loader.prepare(index) if isinstance(loader, Loader) else (loader(index), None)


def file_of(loader: Any, index: int) -> Path | None:
    return loader.file(index) if isinstance(loader, Loader) else None


def load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"array file {path} does not exist") from None
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"cannot read array file {path}: {exc}") from None


def check_sample(sample: Sample, specs: Sequence[Any], label: str, finite: bool = True) -> Sample:
    """``sample`` fitted to the model's inputs ``specs`` (``InputSpec``), or a one-line error naming it; with
    ``finite`` (every form but the exact one) a NaN or infinite value is such an error."""
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
                + _layout_hint(list(arr.shape), shown)
            )
        if arr.dtype != spec.dtype:
            if np.issubdtype(arr.dtype, np.floating) and np.issubdtype(spec.dtype, np.floating):
                arr = arr.astype(spec.dtype)
            else:
                raise ShapeMismatchError(
                    f"sample {label}: input '{spec.name}' is {arr.dtype}, the model wants {spec.dtype}"
                )
        if finite and arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            nan = int(np.isnan(arr).sum())
            raise InputError(
                f"sample {label}: input '{spec.name}' holds {nan} NaN and {int((~np.isfinite(arr)).sum()) - nan} "
                "infinite value(s); every input must be finite"
            )
        out[spec.name] = arr
    return out
