"""Where each tensor of a step holds its samples: its batch axis, established by running the model.

A step of several samples is recorded sample by sample, as a step of one sample computes it, so that a run at
batch N compares with a run at batch 1. Which part of a tensor belongs to which sample is the graph's property,
and it is asked of the session itself (``probe_splits``): two different samples are run alone and together,
and every tensor is classified by what it became:

* ``axis``: the two samples' tensors lie one after the other along one axis (``axis``), each taking as much of
  it as it took alone (and equal to it, or where an EP computes a step of two with other kernels, the step of
  the two samples in the other order holds the same halves swapped, bit for bit: ``_swaps``) — the batch
  axis, 0 for most, 1 for a recurrent state ``[2, B, 128]``, and the merged axis of a ``Flatten(axis=0)``
  ``[1, B*C*H*W]`` whose samples are contiguous. A sample's part keeps that axis with
  its own extent, as the step of one sample gave it. Where the two samples' tensors lie nearer each other than
  other kernels for a step of two move them (a softmax whose two samples are both near [0.99, 0.01]), further
  samples of the set are probed with the first, a few at most, for those tensors alone (``further_samples``).
* ``shared``: the same tensor whatever the step holds (computed from constants): every sample records it whole.
* ``shape``: an integer tensor that carries the number of samples (``Shape``'s output ``[N, C, H, W]``, a
  computed size ``N * C``): the entries that scale with the step are recorded divided by its size, the value
  a step of one sample computes; the others as they are.
* ``unknown``: none of these (the samples mixed, the batch merged under another axis, a shape that depends on
  the sample, a value that is not a tensor): it cannot be split faithfully and is never sliced as if its first
  axis were the batch. The dump reports it and leaves it out; a final output of this kind refuses the step.

A step of one sample is recorded as it is, whatever the classification. A model whose batch is fixed at the
step's size cannot run the probe's steps: its tensors are split by their first axis where it has the step's size
(``ONE``), as before the probe, and the run's record says so (``kind`` ``first``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from qconsist.errors import UnsupportedModelError

Sample = dict[str, np.ndarray]


@dataclass(frozen=True)
class Split:
    """How one tensor of a step is divided among its samples (module docstring)."""

    kind: str  # "axis" | "shared" | "shape" | "unknown" | "first" (nothing probed: ``ONE``)
    axis: int | None = None  # kind axis: the axis holding the samples one after the other
    size: int = 1  # kind axis: a sample's extent along it, in the probe
    positions: tuple[int, ...] = ()  # kind shape: flat positions of the entries that carry the step's size
    why: str = ""  # kind unknown: what the probe saw

    def rows(self, array: Any, count: int, name: str = "") -> list[np.ndarray]:
        """``array`` (one step of ``count`` samples) as one array per sample."""
        if count == 1:
            return [array]
        if self.kind == "shared":
            return [array] * count
        if self.kind == "first":
            array = np.asarray(array)
            if array.ndim and array.shape[0] == count:
                return [array[r:r + 1] for r in range(count)]
            return [array] * count
        if self.kind == "unknown":
            raise UnsupportedModelError(f"tensor {name!r} cannot be split into the samples of a step ({self.why}); "
                                        "run with `batch_size` 1")
        array = np.asarray(array)
        if self.kind == "shape":
            flat = np.array(array).reshape(-1)
            flat[list(self.positions)] //= count
            return [flat.reshape(array.shape)] * count
        axis = int(self.axis or 0)
        extent = array.shape[axis] if array.ndim > axis else -1
        if extent < 0 or extent % count:
            raise UnsupportedModelError(f"tensor {name!r}: axis {axis} of shape {list(array.shape)} does not hold "
                                        f"{count} samples; run with `batch_size` 1")
        part = extent // count
        lead = (slice(None),) * axis
        return [array[lead + (slice(r * part, (r + 1) * part),)] for r in range(count)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        if self.kind == "axis":
            data.update(axis=self.axis, size=self.size)
        if self.kind == "shape":
            data["positions"] = list(self.positions)
        if self.why:
            data["why"] = self.why
        return data


# a step's tensor where nothing was probed: its first axis where it has the step's size, else the whole tensor for
# each sample — steps of one sample (recorded as they are), and a model whose batch is fixed at the step's size,
# which cannot run a step of another size to be probed (it was qconsist's only rule before the probe)
ONE = Split("first")


def _close(left: np.ndarray, right: np.ndarray) -> bool:
    """The same tensor within the rounding a kernel may change with the step's size."""
    if left.shape != right.shape or left.dtype != right.dtype:
        return False
    if np.array_equal(left, right, equal_nan=left.dtype.kind in "fc"):
        return True
    if left.dtype.kind in "fc":
        scale = float(np.nanmax(np.abs(left))) if left.size else 0.0
        return bool(np.allclose(left, right, rtol=1e-4, atol=1e-5 * max(scale, 1e-30), equal_nan=True))
    if left.dtype.kind in "iu":
        return bool(np.abs(left.astype(np.int64) - right.astype(np.int64)).max(initial=0) <= 1)
    return False


def classify(one: Any, other: Any, both: Any, swapped: Any = None) -> Split:
    """The split of a tensor that is ``one`` and ``other`` for two samples alone, ``both`` for the two together
    and ``swapped`` for the two together in the other order (module docstring)."""
    if not all(isinstance(x, np.ndarray) for x in (one, other, both)):
        return Split("unknown", why="not a tensor")
    if one.shape != other.shape:
        return Split("unknown", why="its shape depends on the sample")
    if both.ndim != one.ndim or both.dtype != one.dtype:
        return Split("unknown", why="its rank changes with the step")
    if both.shape == one.shape:
        if np.array_equal(one, other) and np.array_equal(one, both):
            return Split("shared")
        if one.dtype.kind in "iu" and np.array_equal(one, other):
            changed = np.flatnonzero(both.reshape(-1) != one.reshape(-1))
            if changed.size and np.array_equal(both.reshape(-1)[changed], 2 * one.reshape(-1)[changed]):
                return Split("shape", positions=tuple(int(p) for p in changed))
        return Split("unknown", why="it mixes the samples of a step")
    for axis in range(one.ndim):
        extent = one.shape[axis]
        if extent == 0 or both.shape[axis] != 2 * extent:
            continue
        if any(both.shape[a] != one.shape[a] for a in range(one.ndim) if a != axis):
            continue
        lead = (slice(None),) * axis
        first, second = both[lead + (slice(0, extent),)], both[lead + (slice(extent, 2 * extent),)]
        if (_close(first, one) and _close(second, other)) or _apart(first, second, one, other):
            return Split("axis", axis, extent)
        if isinstance(swapped, np.ndarray) and swapped.shape == both.shape and _swaps(
                first, second, swapped[lead + (slice(0, extent),)], swapped[lead + (slice(extent, 2 * extent),)], one, other):
            return Split("axis", axis, extent)
    return Split("unknown", why=NO_AXIS)


NO_AXIS = "no axis holds the samples one after the other"  # where another pair of samples may tell (``probe_splits``)
QUANTUM_SHARE = 0.02  # of the tensor's magnitude: a few int8 quanta (1/255 of a [0, 1] score each)


def _apart(first: np.ndarray, second: np.ndarray, one: np.ndarray, other: np.ndarray) -> bool:
    """A float tensor whose step of two holds each sample as the sample computed alone up to a few quanta — what a
    quantized model shows where a step of two runs other kernels than a step of one (the CUDA EP picks its
    convolution algorithms by the step's shape, and a last-bit change before a QuantizeLinear moves its int8 by
    one) — and whose two samples the step's halves tell apart: each half is nearer to its own sample than to the
    other one, so the halves are the samples in order, not mixed or swapped."""
    if one.dtype.kind != "f" or not one.size or not all(np.isfinite(x).all() for x in (first, second, one, other)):
        return False
    scale = max(float(np.abs(one).max()), float(np.abs(other).max()))
    if scale == 0.0:
        return False

    def gap(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())

    own = max(gap(first, one), gap(second, other))
    swapped = max(gap(first, other), gap(second, one))
    return own <= QUANTUM_SHARE * scale and own < swapped / 2


def _swaps(first: np.ndarray, second: np.ndarray, swapped_first: np.ndarray, swapped_second: np.ndarray,
           one: np.ndarray, other: np.ndarray) -> bool:
    """The halves of a step of two are its samples in order where the step's own kernels, whatever they compute
    for a step of two, put each sample's part in its own half: the step of the two samples in the other order
    holds the same two halves swapped, bit for bit (the kernels of a step of two treat every position alike), the
    halves differ, and each half is nearer its own sample's tensor alone than the other's (mean absolute gap less
    than a quarter: the halves are not mixed). It holds where a step of two runs other kernels than a step of one
    by more than ``_close`` and ``_apart`` allow: on the CUDA EP, the int8 tensors of a quantized model a few
    quanta off, its float tensors by more than a few quanta of the output (an H200 left 231 of open_nsfw QDQ's
    416 tensors out of every ``--batch-size 32`` dump)."""
    if first.dtype.kind not in "fciub" or not first.size:
        return False
    nan = first.dtype.kind in "fc"
    if not (np.array_equal(first, swapped_second, equal_nan=nan) and np.array_equal(second, swapped_first, equal_nan=nan)):
        return False
    if np.array_equal(first, second, equal_nan=nan):
        return False

    def gap(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())

    own = gap(first, one) + gap(second, other)
    crossed = gap(first, other) + gap(second, one)
    return own < crossed / 4  # False where a gap is NaN (a NaN or an infinity in the tensors)


def probe_splits(run: Callable[[Sample], Sequence[Any]], first: Sample, second: Sample,
                 stack: Callable[[list[Sample]], Sample], what: str,
                 more: Callable[[], Iterable[Sample]] | None = None,
                 run_columns: Callable[[Sample, list[int]], Sequence[Any]] | None = None) -> list[Split]:
    """The split of every tensor ``run`` returns, from two different samples run alone and as one step, in
    both orders. ``more``: further samples, each probed with ``first`` in turn for the tensors no axis was found
    for yet (``NO_AXIS``) — two samples whose tensor is nearly the same tell nothing where an EP's kernels for a
    step of two move it by as much (on an H200, open_nsfw QDQ's softmax before its last QuantizeLinear: samples 0
    and 1 of a photograph folder 0.0014 apart, the step's kernels moving it as far). Only a batch axis is taken
    from another pair; a tensor none establishes stays unknown. ``run_columns(feed, columns)``: those tensors alone
    (in that order), which the further pairs fetch instead of every tensor (a dump's session exposes hundreds)."""
    try:
        one, other = run(first), run(second)
        both, swapped = run(stack([first, second])), run(stack([second, first]))
        splits = [classify(a, b, ab, ba) for a, b, ab, ba in zip(one, other, both, swapped)]
        tried = 0
        for extra in (more() if more is not None else ()):
            open_ = [c for c, split in enumerate(splits) if split.kind == "unknown" and split.why == NO_AXIS]
            if not open_:
                break
            tried += 1
            fetch = run_columns or _every_column(run)
            other, both, swapped = (fetch(feed, open_) for feed in (extra, stack([first, extra]), stack([extra, first])))
            for k, c in enumerate(open_):
                split = classify(one[c], other[k], both[k], swapped[k])
                if split.kind == "axis":
                    splits[c] = split
        if tried:
            splits = [Split("unknown", why=f"{NO_AXIS} (nor with {tried + 1} other samples)")
                      if split.kind == "unknown" and split.why == NO_AXIS else split for split in splits]
    except UnsupportedModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own errors: the model does not take a step of two
        message = " ".join(str(exc).split())[:200]
        raise UnsupportedModelError(f"{what} cannot run a step of 2 samples ({message}); run with `batch_size` 1") from None
    return splits


def _every_column(run: Callable[[Sample], Sequence[Any]]) -> Callable[[Sample, list[int]], list[Any]]:
    """``probe_splits``' ``run_columns`` where none is given: ``run`` once, the columns taken from its tensors."""
    def columns(feed: Sample, wanted: list[int]) -> list[Any]:
        outputs = run(feed)
        return [outputs[c] for c in wanted]

    return columns


def distinct_second(samples: Callable[[int], Sample], count: int, first: Sample, tries: int = 8) -> Sample:
    """A sample other than ``first`` in bytes (the first of samples 1.. that differs; sample 1 if none does)."""
    fallback = samples(1)
    for index in range(1, min(count, 1 + tries)):
        candidate = fallback if index == 1 else samples(index)
        if any(not np.array_equal(candidate[k], first[k]) for k in first):
            return candidate
    return fallback


FURTHER = 3  # further samples ``probe_splits`` may try for a tensor the first pair left without an axis


def further_samples(samples: Callable[[int], Sample], count: int, first: Sample,
                    tries: int = FURTHER) -> Callable[[], Iterable[Sample]]:
    """``probe_splits``' ``more``: up to ``tries`` samples spread over the set (its middle, its last, its quarters),
    each other than ``first`` in bytes, read only when asked for; the same ones on every call."""
    indices = list(dict.fromkeys(i for i in (count // 2, count - 1, count // 4, 3 * count // 4) if 1 < i < count))

    def more() -> Iterable[Sample]:
        given = 0
        for index in indices:
            if given == tries:
                return
            candidate = samples(index)
            if any(not np.array_equal(candidate[k], first[k]) for k in first):
                given += 1
                yield candidate

    return more
