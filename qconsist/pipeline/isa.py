"""The pipeline across instruction sets.

``calib repeat --isa``'s inputs: the model calibration starts from and its calibration set, as a pipeline file
or an ONNX model with arrays declare them (``qconsist.calibration.isa`` calibrates across instruction sets).
(``qconsist.pipeline.isaspread``: verdicts within the instruction-set spread of their threshold.)"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from qconsist.calibration.isa import IsaCalibration, calibrate_across
from qconsist.errors import InputError
from qconsist.inference.session import input_specs
from qconsist.pipeline.config import DataConfig, PipelineConfig
from qconsist.pipeline.inputs import open_data
from qconsist.pipeline.runner import _context, _model_files, run_stages
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions
from qconsist.stages.convert import check_onnx_entry
from qconsist.store.scratch import scratch_dir


def across_from_pipeline(config: PipelineConfig, isas: Sequence[str], progress: Progress = NULL_PROGRESS) -> IsaCalibration:
    """Run the stages before quantize here (unchecked, as ``repeat_from_pipeline`` does), then calibrate the
    model they give once per instruction set."""
    files = _model_files(config)
    float_stages = [s for s in config.active_stages() if s.produces_float]
    with scratch_dir("qconsist-calib-") as tmp:
        folder = Path(tmp)
        context = _context(config, files, progress, None)
        context.evaluation = None
        records = run_stages(float_stages, config, context, lambda name: folder / f"{name}.onnx")
        optimized = records[-1].path
        return calibrate_across(optimized, context.calibration(optimized), config.quantize,
                                config.calibration.options, isas, progress)


def across_from_onnx(model: Path, data: DataConfig, isas: Sequence[str], options: QuantizeOptions,
                     calibration: CalibrationOptions, progress: Progress = NULL_PROGRESS) -> IsaCalibration:
    if not Path(model).is_file():
        raise InputError(f"model file {model} does not exist")
    check_onnx_entry(Path(model))
    inputs = open_data(data, None, input_specs(Path(model))[0].name, "calibration")
    return calibrate_across(Path(model), inputs, options, calibration, isas, progress)
