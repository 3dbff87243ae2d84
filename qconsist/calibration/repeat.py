"""Repeated calibration: calibrate and quantize N times, and say whether the quantized models agree.

Agreement is judged on the quantized files' md5 (what users' scripts compare). When runs disagree, each
later run is compared with the first tensor by tensor: every initializer whose digest differs is mapped
through the calibration tables to the quantized tensor it belongs to (its range, scale, zero point, by how
much each moved) and to the nodes that consume it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qconsist.calibration.producers import ProducerCheck, check_producers
from qconsist.stages.calibration_table import CalibrationTable, TableEntry
from qconsist.errors import InputError
from qconsist.inputs.inputset import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions, QuantizeResult, quantize_model
from qconsist.store.hashing import ArtifactHashes, hash_artifact
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

SCHEMA = "qconsist.calib-repeat/1"


@serialized
@dataclass(frozen=True)
class RepeatRun:
    index: int
    md5: str
    sha256: str
    content: str
    inputs_digest: str
    seconds: float


@serialized
@dataclass(frozen=True)
class TensorDifference:
    """A quantized tensor whose parameters differ between the first run and run ``run``."""

    run: int
    tensor: str
    kind: str
    nodes: tuple[str, ...]
    initializers: tuple[str, ...]  # the initializers whose digests differ
    scale_max_abs_diff: float
    scale_max_rel_diff: float
    zero_point_max_abs_diff: int
    channels: int  # values of the scale that differ
    min: tuple[float | None, float | None] = (None, None)  # (first run, this run)
    max: tuple[float | None, float | None] = (None, None)

    def line(self) -> str:
        parts = [f"scale differs by up to {self.scale_max_abs_diff:.3g} ({self.scale_max_rel_diff:.2%})"]
        if self.zero_point_max_abs_diff:
            parts.append(f"zero point by {self.zero_point_max_abs_diff}")
        if self.min[0] is not None and self.min != (None, None) and (self.min[0] != self.min[1] or self.max[0] != self.max[1]):
            parts.append(f"range [{self.min[0]:.6g}, {self.max[0]:.6g}] -> [{self.min[1]:.6g}, {self.max[1]:.6g}]")
        return f"run {self.run}: {self.kind} '{self.tensor}' (nodes {', '.join(self.nodes) or '-'}): " + ", ".join(parts)


@serialized(
    schema=SCHEMA, derived=("agree", "passed", "verdict"), error=InputError,
    refused="not a repeated-calibration result (schema {found!r}, expected {schema})",
    malformed="repeated-calibration result is malformed: {exc}",
)
@dataclass
class RepeatResult:
    runs: list[RepeatRun]
    differences: list[TensorDifference] = field(default_factory=list)
    other_initializers: dict[int, list[str]] = field(default_factory=dict)  # differing, not in any table entry
    params: dict[str, Any] = field(default_factory=dict)
    producers: ProducerCheck | None = None  # calibration on a GPU EP: do the calibrated tensors' producers vary?

    @property
    def md5s(self) -> list[str]:
        return [r.md5 for r in self.runs]

    @property
    def agree(self) -> bool:
        return len(set(self.md5s)) == 1

    @property
    def by_chance(self) -> bool:
        """The md5s agree, but a calibrated tensor's producer varies from run to run: the agreement is luck."""
        return self.agree and self.producers is not None and not self.producers.stable

    @property
    def passed(self) -> bool:
        return self.agree and not self.by_chance

    def __bool__(self) -> bool:
        return self.passed

    def verdict(self) -> str:
        n = len(self.runs)
        if self.by_chance:
            return f"{n} calibrations agree, but {self.producers.sentence()}"  # type: ignore[union-attr]
        if self.agree:
            return f"{n} calibrations agree: md5 {self.runs[0].md5}"
        distinct = len(set(self.md5s))
        if len({r.content for r in self.runs}) == 1:
            return f"{n} calibrations disagree in bytes only: {distinct} distinct md5s, one model content (metadata or encoding differ)"
        tensors = len({d.tensor for d in self.differences})
        return f"{n} calibrations disagree: {distinct} distinct md5s, {tensors} quantized tensor(s) differ"


def _entry_difference(run: int, first: TableEntry, other: TableEntry, initializers: list[str]) -> TensorDifference:
    a = np.asarray(first.scale, dtype=np.float64)
    b = np.asarray(other.scale, dtype=np.float64)
    if a.shape != b.shape:
        abs_diff, rel_diff, channels = float("inf"), float("inf"), max(a.size, b.size)
    else:
        diff = np.abs(a - b)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(diff == 0, 0.0, diff / np.abs(a))
        abs_diff, rel_diff, channels = float(np.nanmax(diff)), float(np.nanmax(rel)), int(np.count_nonzero(diff))
    za, zb = np.asarray(first.zero_point, dtype=np.int64), np.asarray(other.zero_point, dtype=np.int64)
    zero_diff = int(np.abs(za - zb).max()) if za.shape == zb.shape else -1
    return TensorDifference(
        run=run, tensor=first.tensor, kind=first.kind, nodes=tuple(sorted(set(first.nodes) | set(other.nodes))),
        initializers=tuple(sorted(initializers)), scale_max_abs_diff=abs_diff, scale_max_rel_diff=rel_diff,
        zero_point_max_abs_diff=zero_diff, channels=channels,
        min=(first.range_min, other.range_min), max=(first.range_max, other.range_max),
    )


def compare_quantized(
    run: int,
    first: tuple[ArtifactHashes, CalibrationTable],
    other: tuple[ArtifactHashes, CalibrationTable],
) -> tuple[list[TensorDifference], list[str]]:
    """Which quantized tensors (and which other initializers) differ between two quantized models."""
    first_digests = first[0].initializers
    other_digests = other[0].initializers
    changed = sorted(
        name for name in set(first_digests) | set(other_digests) if first_digests.get(name) != other_digests.get(name)
    )
    first_index, other_index = first[1].by_initializer(), other[1].by_initializer()
    by_tensor: dict[str, list[str]] = {}
    unmapped = []
    for name in changed:
        entries = first_index.get(name) or other_index.get(name)
        if not entries:
            unmapped.append(name)
        for entry in entries or ():
            by_tensor.setdefault(entry.tensor, []).append(name)
    differences = []
    for tensor, names in sorted(by_tensor.items()):
        a, b = first[1].entries.get(tensor), other[1].entries.get(tensor)
        if a is None or b is None:
            unmapped.extend(names)
            continue
        differences.append(_entry_difference(run, a, b, names))
    return differences, unmapped


def calibrate_each(
    model: Path,
    input_sets: Sequence[InputSet],
    options: QuantizeOptions,
    calibration: CalibrationOptions,
    workdir: Path | None = None,
    first: QuantizeResult | None = None,
    progress: Progress = NULL_PROGRESS,
) -> RepeatResult:
    """Calibrate and quantize ``model`` once per input set (``first``: an already made run 1 to reuse)."""
    return _calibrations(model, input_sets, options, calibration, workdir, first, progress)[0]


def _calibrations(
    model: Path,
    input_sets: Sequence[InputSet],
    options: QuantizeOptions,
    calibration: CalibrationOptions,
    workdir: Path | None = None,
    first: QuantizeResult | None = None,
    progress: Progress = NULL_PROGRESS,
) -> tuple[RepeatResult, list[CalibrationTable]]:
    """``calibrate_each``, and the calibration table of every run."""
    # repeats compare parameters, so they keep models with invalid scales and skip the evaluation gates
    quant_options = dataclasses.replace(options, allow_invalid_scales=True, min_top1_agreement=None, max_abs_diff=None,
                                        min_sqnr_db=None)
    with scratch_dir("qconsist-repeat-") as tmp:
        folder = Path(workdir) if workdir is not None else Path(tmp)
        results: list[tuple[ArtifactHashes, CalibrationTable]] = []
        runs: list[RepeatRun] = []
        for index, inputs in enumerate(input_sets, start=1):
            if index == 1 and first is not None:
                result = first
            else:
                result = quantize_model(model, folder / f"run{index}.onnx", inputs, quant_options, calibration, progress=progress)
            hashes = hash_artifact(result.path)
            runs.append(RepeatRun(index, hashes.md5, hashes.sha256, hashes.content, inputs.digest(), result.seconds))
            results.append((hashes, result.table))
            log.info("calibration run %d: md5 %s", index, hashes.md5)
        repeat = RepeatResult(runs=runs, params={
            "count": len(input_sets), "quantize": options.to_json(), "calibration": calibration.to_json(),
            "model": str(model),
        })
        for index in range(2, len(results) + 1):
            if runs[index - 1].md5 == runs[0].md5:
                continue
            diffs, unmapped = compare_quantized(index, results[0], results[index - 1])
            repeat.differences.extend(diffs)
            if unmapped:
                repeat.other_initializers[index] = unmapped
    return repeat, [table for _, table in results]


def repeat_calibration(
    model: Path,
    inputs: InputSet,
    n: int,
    options: QuantizeOptions = QuantizeOptions(),
    calibration: CalibrationOptions = CalibrationOptions(),
    first: QuantizeResult | None = None,
    progress: Progress = NULL_PROGRESS,
    producers: bool | None = None,
) -> RepeatResult:
    """Calibrate and quantize ``model`` ``n`` times on the same ``inputs``; compare the results. ``producers``:
    also run the calibrated tensors' producers again (``producers.check_producers``); ``None``, the default:
    when calibration runs on a GPU execution provider, where kernels that vary from run to run are known."""
    if n < 2:
        raise InputError(f"repeated calibration needs at least 2 runs, got {n}")
    if len(inputs) == 0:
        raise InputError(f"calibration set {inputs.source} is empty")
    result, tables = _calibrations(model, [inputs] * n, options, calibration, first=first, progress=progress)
    if producers if producers is not None else calibration.provider != "cpu":
        result.producers = check_producers(model, inputs, calibration, tables[0])
    return result

