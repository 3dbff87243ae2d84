"""A model's outputs under another instruction set: a child process under QEMU user mode computes them.

``outputs_under(isa, model, inputs, options)`` hands the samples to the child as one ``.npz`` of arrays (the
same bytes the native session reads), the child (``qconsist.emulation.call_on``, under QEMU) opens a
session with ``options`` (``qconsist.inference.session.outputs_of``) and writes the outputs back as another
``.npz``. ``native`` computes them in this process. The gate's spread across instruction sets is measured so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qconsist.emulation import NATIVE, call_on
from qconsist.errors import InputError
from qconsist.inference.session import ExecutionOptions, outputs_of
from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.store.scratch import scratch_dir


def stacked_arrays(inputs: InputSet, path: Path, what: str = "input set") -> Path:
    """The samples of ``inputs`` as one ``.npz`` of arrays stacked on the batch axis: what a child under another
    instruction set reads, the same bytes the native side reads."""
    samples = [inputs.sample(i) for i in range(len(inputs))]
    if not samples:
        raise InputError(f"{what} {inputs.source} is empty")
    np.savez(path, **{name: np.concatenate([s[name] for s in samples]) for name in samples[0]})
    return path


def compute_outputs(request: dict[str, Any]) -> None:
    """The child's work: the outputs of ``request``'s model on its arrays, saved to its ``output``."""
    options = ExecutionOptions.from_json(request["options"])
    inputs = open_input_set(Path(request["arrays"]), None, request["input_name"])
    outputs = outputs_of(Path(request["model"]), inputs, options)
    names = list(outputs[0]) if outputs else []
    np.savez(request["output"], **{f"{index}:{name}": sample[name] for index, sample in enumerate(outputs) for name in names})


def outputs_under(isa: str, model: Path, inputs: InputSet, options: ExecutionOptions) -> list[dict[str, np.ndarray]]:
    """``model``'s outputs on ``inputs`` under ``isa`` (``native`` or a resolved QEMU CPU model)."""
    if isa == NATIVE:
        return outputs_of(model, inputs, options)
    with scratch_dir("qconsist-emulated-") as tmp:
        folder = Path(tmp)
        arrays = stacked_arrays(inputs, folder / "inputs.npz")
        request = {"model": str(model), "arrays": str(arrays), "input_name": next(iter(np.load(arrays).files)),
                   "options": options.to_json(), "output": str(folder / "outputs.npz")}
        call_on(isa, compute_outputs, request, what="the model's outputs")
        with np.load(folder / "outputs.npz") as saved:
            found: dict[int, dict[str, np.ndarray]] = {}
            for key in saved.files:
                index, name = key.split(":", 1)
                found.setdefault(int(index), {})[name] = saved[key]
        return [found[i] for i in sorted(found)]

