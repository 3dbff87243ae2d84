"""A model's outputs under another instruction set: a child process under QEMU user mode computes them.

``outputs_under(isa, model, inputs, options)`` hands the samples to the child as one ``.npz`` of arrays (the
same bytes the native session reads), the child (``python -m qconsist.inference.emulated REQUEST.json``)
opens a session with ``options`` (``qconsist.inference.session.outputs_of``) and writes the outputs back.
``native`` computes them in this process. The gate's spread across instruction sets is measured so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.emulation import NATIVE, emulated_command, run_emulated_capture
from qconsist.errors import InputError, QconsistError
from qconsist.inference.session import ExecutionOptions, outputs_of
from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.store.scratch import scratch_dir


def _stacked(inputs: InputSet, path: Path) -> Path:
    samples = [inputs.sample(i) for i in range(len(inputs))]
    if not samples:
        raise InputError(f"input set {inputs.source} is empty")
    np.savez(path, **{name: np.concatenate([s[name] for s in samples]) for name in samples[0]})
    return path


def _compute(request: dict[str, Any]) -> None:
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
        arrays = _stacked(inputs, folder / "inputs.npz")
        request = {"model": str(model), "arrays": str(arrays), "input_name": next(iter(np.load(arrays).files)),
                   "options": options.to_json(), "output": str(folder / "outputs.npz")}
        (folder / "request.json").write_text(json.dumps(request), encoding="utf-8")
        child = run_emulated_capture(emulated_command(isa, [sys.executable, "-m", "qconsist.inference.emulated",
                                                            str(folder / "request.json")]))
        if child.returncode != 0:
            last = (child.stderr.strip().splitlines() or ["no output"])[-1]
            raise QconsistError(f"the model's outputs under emulated {isa} failed (exit {child.returncode}): {last}")
        with np.load(folder / "outputs.npz") as saved:
            found: dict[int, dict[str, np.ndarray]] = {}
            for key in saved.files:
                index, name = key.split(":", 1)
                found.setdefault(int(index), {})[name] = saved[key]
        return [found[i] for i in sorted(found)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        _compute(json.loads(Path(args[0]).read_text(encoding="utf-8")))
    except QconsistError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
