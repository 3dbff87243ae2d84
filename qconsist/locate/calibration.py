"""Calibration on the GPU, repeated: N calibrations per cuDNN search mode, hashed and compared, and
compared with a calibration on the CPU.

Calibration measures every activation's range by running the float model; on the CUDA EP the convolutions
that produce those ranges run with the algorithms cuDNN picked, so the ranges, the scales and the quantized
model can depend on the search mode, and on the run if the pick moves. Each repeat set reuses the
pipeline's own machinery (``qconsist.calibration.repeat.calibrate_each``: quantize, md5, per-tensor
differences); the GPU sets are then compared with the CPU calibration tensor by tensor
(``compare_quantized``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence


from qconsist.calibration.repeat import RepeatResult, calibrate_each, compare_quantized
from qconsist.onnxfile import read_onnx
from qconsist.stages.calibration_table import build_table
from qconsist.errors import ConfigError, InputError
from qconsist.locate.config import GpuConfig
from qconsist.inference.session import ExecutionOptions, ort_logged, require_provider
from qconsist.inputs.inputset import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions
from qconsist.store.hashing import hash_artifact
from qconsist.store.scratch import scratch_dir
from qconsist.store.serde import serialized

log = logging.getLogger(__name__)

SCHEMA = "qconsist.locate-calibration/1"


@serialized(derived=("repeat.agree", "repeat.md5s", "repeat.verdict"))
@dataclass(frozen=True)
class ModeResult:
    """N calibrations on the CUDA EP in one configuration, and how the first compares with the CPU's."""

    config: str
    repeat: RepeatResult
    matches_cpu: bool
    cpu_differences: tuple[dict, ...]  # TensorDifference.to_json of the first GPU run vs the CPU run


@serialized(
    schema=SCHEMA, derived=("passed", "verdict"), error=InputError,
    refused="not a GPU calibration report (schema {found!r}, expected {schema})",
    malformed="GPU calibration report is malformed: {exc}",
)
@dataclass
class GpuCalibrationReport:
    runs: int
    cpu_md5: str
    modes: list[ModeResult] = field(default_factory=list)
    params: dict = field(default_factory=dict)

    @property
    def gpu_md5s(self) -> set[str]:
        return {md5 for mode in self.modes for md5 in mode.repeat.md5s}

    @property
    def passed(self) -> bool:
        """Repeats agree: within each configuration every calibration gave the same model. Configurations
        may differ from each other and from the CPU (another algorithm); that is reported, not a failure."""
        return all(mode.repeat.agree for mode in self.modes)

    def __bool__(self) -> bool:
        return self.passed

    def verdict(self) -> str:
        total = sum(len(m.repeat.runs) for m in self.modes)
        unstable = [m.config for m in self.modes if not m.repeat.agree]
        repeats = f"repeats disagree in {', '.join(unstable)}" if unstable else "repeats agree in every configuration"
        gpu = (f"{total} GPU calibrations over {len(self.modes)} configuration(s): {repeats}; "
               f"{len(self.gpu_md5s)} distinct md5(s)")
        cpu = "same as the CPU calibration" if self.cpu_md5 in self.gpu_md5s and len(self.gpu_md5s) == 1 else (
            "the CPU calibration differs from every GPU one" if self.cpu_md5 not in self.gpu_md5s
            else "the CPU calibration matches some GPU ones")
        return f"{gpu}; {cpu}"


@ort_logged()  # one capture for all its sessions and runs
def gpu_calibration(
    model: Path,
    inputs: InputSet,
    runs: int,
    configs: Sequence[GpuConfig],
    options: QuantizeOptions = QuantizeOptions(),
    calibration: CalibrationOptions = CalibrationOptions(),
    progress: Progress = NULL_PROGRESS,
) -> GpuCalibrationReport:
    """Calibrate ``model`` ``runs`` times on the CUDA EP in each config, once on the CPU, and compare."""
    if runs < 2:
        raise ConfigError(f"`calibration_repeats` must be >= 2 to compare repeats, got {runs}")
    if not configs:
        raise ConfigError("GPU calibration needs at least one configuration")
    require_provider("cuda")
    cpu_options = replace(calibration, execution=ExecutionOptions())
    with scratch_dir("qconsist-gpu-calib-") as tmp:
        root = Path(tmp)
        (root / "cpu").mkdir()
        cpu = calibrate_each(model, [inputs], options, cpu_options, workdir=root / "cpu", progress=progress)
        cpu_path = root / "cpu" / "run1.onnx"
        cpu_side = (hash_artifact(cpu_path), build_table(read_onnx(cpu_path, external_data=True)))
        report = GpuCalibrationReport(runs=runs, cpu_md5=cpu.runs[0].md5, params={
            "quantize": options.to_json(), "calibration": {**cpu_options.to_json(), "provider": "cuda"}, "inputs": inputs.describe(),
            "configs": [c.label for c in configs],
        })
        for index, config in enumerate(configs):
            folder = root / f"gpu{index}"
            folder.mkdir()
            gpu_options = replace(calibration, execution=ExecutionOptions("cuda", {
                "cudnn_conv_algo_search": config.algo_search, "use_tf32": config.use_tf32,
                "cudnn_conv_use_max_workspace": config.max_workspace,
            }))
            repeat = calibrate_each(model, [inputs] * runs, options, gpu_options, workdir=folder, progress=progress)
            first = folder / "run1.onnx"
            matches = repeat.runs[0].md5 == report.cpu_md5
            differences: list[dict] = []
            if not matches:
                gpu_side = (hash_artifact(first), build_table(read_onnx(first, external_data=True)))
                diffs, _ = compare_quantized(1, cpu_side, gpu_side)
                diffs.sort(key=lambda d: (d.kind != "activation", -d.scale_max_rel_diff))
                differences = [d.to_json() for d in diffs]
            report.modes.append(ModeResult(config.label, repeat, matches, tuple(differences)))
            log.info("GPU calibration %s: %s", config.label, repeat.verdict())
    return report
