"""Each model input's batch axis, read from the graph: the axis that holds the batch symbol.

The batch symbol is the symbolic dimension (``dim_param``) the inputs share on their first axis — ``N`` in
``x[N, 16]`` — and an input's batch axis is where that same symbol stands in its shape: 1 for a recurrent state
``[2, N, 128]``, none for a rank-0 sample rate or a fixed ``[3, 4]``. Where no input names a symbol on its
first axis, an input whose first axis is free (unnamed) has its batch there, as before. Nothing is inferred
from equal sizes: a fixed dimension is never a batch axis (a model with one is re-stamped first: ``[convert]
dynamic_batch``)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence


def _free(dim: Any) -> bool:
    return not isinstance(dim, int) or dim <= 0


def batch_symbol(shapes: Sequence[Sequence[Any]]) -> str | None:
    """The symbol most inputs carry on their first axis (ties: the first input's), or None."""
    firsts = [s[0] for s in shapes if len(s) and isinstance(s[0], str) and s[0]]
    if not firsts:
        return None
    counts = Counter(firsts)
    best = max(counts.values())
    return next(f for f in firsts if counts[f] == best)


def input_axes(specs: Sequence[Any]) -> dict[str, int | None]:
    """The batch axis of every input (``InputSpec``: ``name``, ``shape``), None where it has none."""
    symbol = batch_symbol([tuple(spec.shape) for spec in specs])
    axes: dict[str, int | None] = {}
    for spec in specs:
        shape = tuple(spec.shape)
        if symbol is not None and symbol in shape:
            axes[spec.name] = shape.index(symbol)
        elif symbol is None and shape and _free(shape[0]):
            axes[spec.name] = 0
        elif shape and shape[0] is None:  # a free first axis ONNX Runtime reports without a name
            axes[spec.name] = 0
        else:
            axes[spec.name] = None
    return axes
