"""``ScatterElements(reduction="add")`` as a one-hot matrix product, for small index ranges.

ONNX Runtime's CUDA kernel adds every update into its target with an atomic add, so the order of the
additions, and the float result, change from run to run wherever two updates share a target. The rewrite
moves the scattered axis last and computes, for every position of the other axes,

    contribution[..., j] = Σ_i updates[..., i] · (indices[..., i] == j)     (j < size of data's axis)

as ``MatMul(updates[..., 1, I], one_hot[..., I, J])``, then ``data + contribution``. Every step is
element-wise, a data move, or a cuBLAS GEMM, which NVIDIA documents as bit-wise reproducible from run to
run on one GPU architecture (cuBLAS guide, "Results reproducibility"). Negative indices count from the
end, as ScatterElements does; indices out of range add nothing (ScatterElements would fail).

Limits: the one-hot tensor holds (positions of the other axes) × I × J values, so the form is for small
index ranges (``DeterminizeOptions.max_one_hot_elements``); it needs finite updates (a zero of the
one-hot times an infinite update is NaN, where ScatterElements leaves other targets alone).

Not implemented, with the reason: a sort-and-segment form (TopK over all indices, CumSum of the sorted
updates, differences at segment ends). ONNX has no segmented sum, and segment sums taken as differences of
prefix sums lose precision with the running total (cancellation), far outside a rewrite's tolerance;
ONNX Runtime's CUDA TopK also takes a path it flags non-deterministic beyond 1024 elements. ScatterND with
``reduction="add"`` has no rewrite here either: it is refused by ``determinize``.
"""

from __future__ import annotations

import math

import numpy as np

from qconsist.errors import UnsupportedModelError
from qconsist.stages.rewrites.emit import Emitter

Dim = int | str | None  # a static size, a symbolic one (dim_param), or unknown


def padding_needed(data: tuple[Dim, ...], indices: tuple[Dim, ...], axis: int) -> list[int]:
    """How many positions the updates stop short of the data on each axis but the scattered one; refused
    when that is not known."""
    short = []
    for i, (d, u) in enumerate(zip(data, indices)):
        if i == axis or (d == u and d is not None):
            short.append(0)
        elif isinstance(d, int) and isinstance(u, int) and u <= d:
            short.append(d - u)
        else:
            raise UnsupportedModelError(f"cannot tell whether the updates cover the data on axis {i} "
                                        f"(data {d}, indices {u}); give the model static shapes")
    return short


def emit_scatter_add(out: Emitter, inputs: list[str], output: str, axis: int, data: tuple[Dim, ...],
                     indices: tuple[Dim, ...], index_dtype: np.dtype, value_type: int, max_elements: int,
                     unknown_as: int) -> dict:
    """Append the one-hot form of ``ScatterElements(inputs, axis, reduction="add")`` writing ``output``.
    ``value_type``: the ONNX element type of data and updates; ``unknown_as``: the size assumed for a
    dynamic dimension when the one-hot tensor is sized."""
    rank = len(data)
    axis %= rank
    size = data[axis]
    if not isinstance(size, int):
        raise UnsupportedModelError(f"the data's size along axis {axis} is not known (the one-hot form needs it)")
    short = padding_needed(data, indices, axis)
    elements = math.prod(d if isinstance(d, int) else unknown_as for d in indices) * size
    if elements > max_elements:
        raise UnsupportedModelError(f"its one-hot form needs {elements} values (indices {list(indices)} × {size} targets), "
                                    f"above max_one_hot_elements {max_elements}")
    data_name, index_name, update_name = inputs
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = perm != list(range(rank))
    negative = out.node("Less", [index_name, out.constant("zero", np.array(0, index_dtype))], "negative")
    wrapped = out.node("Add", [index_name, out.constant("size", np.array(size, index_dtype))], "wrapped")
    index = out.node("Where", [negative, wrapped, index_name], "index")
    updates = update_name
    if moved:
        index = out.node("Transpose", [index], "index_last", perm=perm)
        updates = out.node("Transpose", [updates], "updates_last", perm=perm)
    index = out.node("Unsqueeze", [index, out.constant("last_axis", np.array([-1], np.int64))], "index_column")
    hits = out.node("Equal", [index, out.constant("targets", np.arange(size, dtype=index_dtype))], "hits")
    one_hot = out.node("Cast", [hits], "one_hot", to=value_type)
    row = out.node("Unsqueeze", [updates, out.constant("row_axis", np.array([-2], np.int64))], "updates_row")
    summed = out.node("MatMul", [row, one_hot], "sums")
    summed = out.node("Squeeze", [summed, out.constant("squeeze_axis", np.array([-2], np.int64))], "contribution")
    if moved:
        summed = out.node("Transpose", [summed], "contribution_back", perm=[int(i) for i in np.argsort(perm)])
    if any(short):
        pads = np.array([0] * rank + short, np.int64)
        summed = out.node("Pad", [summed, out.constant("pads", pads)], "contribution_padded", mode="constant")
    out.node("Add", [data_name, summed], "add", output=output)
    return {"one_hot_elements": int(elements), "targets": int(size), "axis": axis, "padded": short}
