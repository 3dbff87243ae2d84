"""Calibration across instruction sets: does the quantized model depend on the machine that calibrated it?

Calibration runs the float model through onnxruntime's CPU provider (its float kernels: AVX-512F, FMA3, SSE…)
to measure tensor ranges, and the ranges become scales and zero points. ``calibrate_across`` calibrates and
quantizes the same model on the same samples once per instruction set — natively here, and in a child
process under QEMU user mode per emulated CPU model (``qconsist.emulation.call_on``) — and
compares the quantized files' md5; where they differ, which quantized tensors differ, by how much, and their
nodes (``qconsist.calibration.repeat.compare_quantized``, the repeated calibration's own comparison).

The samples are prepared once, here, and handed to every instruction set as the same arrays (an ``.npz``
file), so the comparison isolates calibration and quantization from the input decoding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qconsist.calibration.repeat import TensorDifference, compare_quantized
from qconsist.cpu import instruction_set
from qconsist.emulation import call_on
from qconsist.errors import InputError
from qconsist.inference.emulated import stacked_arrays
from qconsist.inputs.inputset import InputSet, open_input_set
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.calibration_table import CalibrationTable
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions, quantize_model
from qconsist.store.hashing import hash_artifact
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized

SCHEMA = "qconsist.calib-isa/1"


@serialized
@dataclass(frozen=True)
class IsaCalibrationRun:
    isa: str  # native or the QEMU CPU model
    kernels: str  # the u8·s8 kernel family it implies ("AVX2 without VNNI")
    float_kernels: str  # the float kernels calibration ran ("FMA3 (NCHWc 8)")
    md5: str
    seconds: float  # calibration + quantization, as the child measured it (emulated: slow)


@serialized(schema=SCHEMA, derived=("agree", "verdict"), error=InputError,
            refused="not a calibration-across-instruction-sets result (schema {found!r}, expected {schema})",
            malformed="calibration-across-instruction-sets result is malformed: {exc}")
@dataclass
class IsaCalibration:
    runs: list[IsaCalibrationRun]
    samples: int
    differences: list[TensorDifference] = field(default_factory=list)  # ``run`` is the index in ``runs`` (1-based)
    other_initializers: dict[str, list[str]] = field(default_factory=dict)  # isa -> differing, in no table entry

    @property
    def agree(self) -> bool:
        return len({run.md5 for run in self.runs}) == 1

    @property
    def passed(self) -> bool:
        return self.agree

    def __bool__(self) -> bool:
        return self.agree

    def verdict(self) -> str:
        names = ", ".join(f"{r.isa} ({r.float_kernels})" for r in self.runs)
        if self.agree:
            return (f"the quantized md5 does not depend on the calibrating instruction set: {self.runs[0].md5} on "
                    f"{names}, {self.samples} calibration samples")
        tensors = len({d.tensor for d in self.differences})
        return (f"the quantized md5 depends on the calibrating instruction set: {len({r.md5 for r in self.runs})} "
                f"distinct md5s on {names}; {tensors} quantized tensor(s) differ")


def calibrate_cell(request: dict[str, Any]) -> dict[str, Any]:
    """Calibrate and quantize once in this process (the worker's work; the native instruction set's too)."""
    inputs = open_input_set(Path(request["arrays"]), None, request["input_name"])
    options = QuantizeOptions.from_json(request["quantize"])
    calibration = CalibrationOptions.from_json(request["calibration"])
    result = quantize_model(Path(request["model"]), Path(request["output"]), inputs, options, calibration)
    Path(request["output"]).with_suffix(".table.json").write_text(json.dumps(result.table.to_json()), encoding="utf-8")
    isa = instruction_set()
    return {"kernels": isa.kernels, "float_kernels": isa.float_kernels, "seconds": result.seconds}


def calibrate_across(model: Path, inputs: InputSet, options: QuantizeOptions, calibration: CalibrationOptions,
                     isas: Sequence[str], progress: Progress = NULL_PROGRESS) -> IsaCalibration:
    """Calibrate and quantize ``model`` on ``inputs`` once per instruction set of ``isas`` (resolved names)."""
    import dataclasses

    # compare parameters: keep models with invalid scales, skip the evaluation gates (as repeated calibration does)
    options = dataclasses.replace(options, allow_invalid_scales=True, min_top1_agreement=None, max_abs_diff=None,
                                  min_sqnr_db=None)
    runs: list[IsaCalibrationRun] = []
    quantized = []
    with scratch_dir("qconsist-calib-isa-") as tmp, progress.task(
            f"calibrating on {', '.join(isas)} (emulation is slow)", len(isas)) as task:
        folder = Path(tmp)
        arrays = stacked_arrays(inputs, folder / "calibration.npz", "calibration set")
        input_name = next(iter(np.load(arrays).files))
        for isa in isas:
            request = {"model": str(model), "arrays": str(arrays), "input_name": input_name,
                       "quantize": options.to_json(), "calibration": calibration.to_json(),
                       "output": str(folder / f"{isa}.onnx")}
            done, _ = call_on(isa, calibrate_cell, request, what="calibrating")
            output = Path(request["output"])
            hashes = hash_artifact(output)
            table = CalibrationTable.from_json(json.loads(output.with_suffix(".table.json").read_text(encoding="utf-8")))
            quantized.append((hashes, table))
            runs.append(IsaCalibrationRun(isa, done["kernels"], done["float_kernels"], hashes.md5, float(done["seconds"])))
            task.advance()
    result = IsaCalibration(runs, len(inputs))
    for index in range(1, len(runs)):
        if runs[index].md5 == runs[0].md5:
            continue
        differences, unmapped = compare_quantized(index + 1, quantized[0], quantized[index])
        result.differences.extend(differences)
        if unmapped:
            result.other_initializers[runs[index].isa] = unmapped
    return result
