"""``run_locate``: what ``qconsist locate`` does, from a request to a complete run directory (kind "locate").

* precision fp32 (default): the configuration matrix on the CUDA EP (``locate``), and with
  ``calibration_repeats`` the repeated GPU calibrations against the CPU (``gpu_calibration``);
* precision fp16: the float16 analysis (``analyse_fp16``) on the chosen EP — the CPU EP needs no GPU.

Run-directory files: ``locate.json`` (the ``LocateReport``); the manifest's ``sections.locate`` holds the
verdict, the recommendation and the origin nodes, so ``qconsist report`` / history can read them without
the full report.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from qconsist.onnxfile import read_onnx
from qconsist.store.serde import loads
from qconsist.environment import fingerprint
from qconsist.errors import ConfigError, UnsupportedModelError
from qconsist.locate.config import AlgoSearch, GpuConfig, Tf32Override
from qconsist.locate.fp16 import FP16_LEVEL, Fp16Options, Fp16Report, analyse_fp16
from qconsist.locate.explore import LocateOptions, locate
from qconsist.locate.report import SCHEMA, LocateReport, Tf32Section
from qconsist.inference.model import ModelSource, resolve_model
from qconsist.inference.session import input_specs
from qconsist.inference.session import ExecutionOptions, ort_logged, require_provider
from qconsist.inputs.record import SAMPLES_FILE, record_inputs
from qconsist.inputs.inputset import InputSet, check_batch_size
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.atomic import write_json_atomic
from qconsist.store.manifest import Manifest
from qconsist.store.ortlog import LOG_NAME as ORT_LOG
from qconsist.store.ortlog import capture_ort_log
from qconsist.store.rundir import RunDirectory
from qconsist.pipeline.config import load_pipeline
from qconsist.pipeline.inputs import open_data, open_inputs
from qconsist.inputs.options import InputOptions
from qconsist.locate.calibration import gpu_calibration
from qconsist.stages.calibration_table import quantized_nodes
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions
from qconsist.errors import RunStoreError
from qconsist.store.run import Run

log = logging.getLogger(__name__)

REPORT_FILE = "locate.json"
MAX_SAMPLES = 256


class Precision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"


def check_count(count: int | None) -> None:
    """locate reads up to ``MAX_SAMPLES`` samples."""
    if count is None or isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SAMPLES:
        raise ConfigError(f"`count` must be between 1 and {MAX_SAMPLES}, got {count}")


@dataclass(frozen=True)
class LocateRequest:
    model: Path
    inputs: InputOptions  # its count is a most: up to ``count`` samples from ``offset``
    stage: str | None = None
    precision: Precision = Precision.FP32
    fp16_ep: str = "cuda"  # the execution provider of the fp16 analysis
    locate: LocateOptions = field(default_factory=LocateOptions)
    calibration_repeats: int = 0
    batch_size: int = 1  # samples per step: cuDNN picks its algorithms per shape
    calibration_searches: tuple[AlgoSearch, ...] = tuple(AlgoSearch)

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))
        object.__setattr__(self, "fp16_ep", ExecutionOptions(self.fp16_ep).provider)
        check_batch_size(self.batch_size)
        check_count(self.inputs.count)
        if self.calibration_repeats and self.calibration_repeats < 2:
            raise ConfigError(f"`calibration_repeats` must be 0 (off) or >= 2, got {self.calibration_repeats}")
        if self.calibration_repeats and self.precision is Precision.FP16:
            raise ConfigError("`calibration_repeats` applies to `precision` fp32")


def open_samples(request: LocateRequest, source: ModelSource) -> tuple[InputSet, list[dict[str, np.ndarray]]]:
    """The input set (checked against the model's inputs) and its samples, loaded, in steps of ``batch_size``
    samples (one step a sample by default)."""
    input_set = open_inputs(request.inputs, source, request.batch_size, up_to=True)
    return input_set, [step for _, step in input_set.batches(request.batch_size)]


def _is_quantized(path: Path) -> bool:
    return bool(quantized_nodes(read_onnx(path)))


def _fp16_source(request: LocateRequest, source: ModelSource) -> ModelSource:
    """The float model the fp16 analysis converts: a run's float stage before quantize when no `stage` was
    given; a quantized model is refused (float16 Q/DQ scales do not load in onnxruntime)."""
    if not _is_quantized(source.path):
        return source
    if source.run is not None and request.stage is None:
        names = [s.get("name") for s in source.run.stages if isinstance(s, dict)]
        if source.stage in names and names.index(source.stage) > 0:
            return resolve_model(source.run_dir, names[names.index(source.stage) - 1])
    hint = ": `stage` optimize" if source.run_dir is not None else ""
    raise UnsupportedModelError(
        f"`precision` fp16 converts a float model to float16; {source.path} is quantized; give the float model{hint}"
    )


def _float_source(request: LocateRequest, source: ModelSource) -> Path:
    """The float model to calibrate: the model itself, or the run's optimize stage when given a run."""
    if source.run_dir is not None and _is_quantized(source.path):
        return resolve_model(source.run_dir, "optimize").path
    if _is_quantized(source.path):
        raise ConfigError(
            f"`calibration_repeats` calibrates a float model; {source.path} is already quantized "
            "(give the float model, or a run directory whose optimize stage holds it)"
        )
    return source.path


def _calibration(request: LocateRequest, source: ModelSource, input_set: InputSet, progress: Progress):  # -> GpuCalibrationReport

    options, calibration, inputs = QuantizeOptions(), CalibrationOptions(), input_set
    if request.inputs.pipeline is not None:
        config = load_pipeline(request.inputs.pipeline)
        options, calibration = config.quantize, config.calibration.options
        data = config.calibration.inputs
        specs = input_specs(source.path)
        inputs = open_data(data, config.preprocess, specs[0].name, "calibration")
        inputs = inputs.checked(specs)
    configs = [GpuConfig(search).resolved() for search in request.calibration_searches]
    report = gpu_calibration(_float_source(request, source), inputs, request.calibration_repeats, configs,
                             options, calibration, progress)
    return report


def _fp16_report(request: LocateRequest, source: ModelSource, samples: list, progress: Progress) -> Fp16Report:
    if request.fp16_ep == "cuda":
        require_provider("cuda")
        execution = replace(GpuConfig().execution_options(), graph_optimization_level=FP16_LEVEL)
    else:
        execution = ExecutionOptions(request.fp16_ep, graph_optimization_level=FP16_LEVEL)
    return analyse_fp16(source.path, samples, execution, Fp16Options(), progress)


def _empty_report(source: ModelSource, input_set: InputSet) -> LocateReport:
    return LocateReport(
        model=source.describe(), inputs=input_set.describe(), device={}, reference="", repeats=0, contention=None,
        configs=[], comparisons=[], tf32=Tf32Section(Tf32Override.from_environment()),
        recommendation=None,
    )


@ort_logged()  # one capture for all its sessions and runs
def build_report(request: LocateRequest, progress: Progress = NULL_PROGRESS) -> tuple[LocateReport, ModelSource, InputSet]:
    """Everything ``qconsist locate`` measures, as a ``LocateReport`` (no run directory)."""
    source = resolve_model(request.model, request.stage)
    if request.precision is Precision.FP16:
        source = _fp16_source(request, source)
    input_set, samples = open_samples(request, source)
    if request.precision is Precision.FP16:
        report = _empty_report(source, input_set)
        report.fp16 = _fp16_report(request, source, samples, progress)
        return report, source, input_set
    report = locate(source.path, samples, request.locate, source.describe(), input_set.describe(), progress)
    if request.calibration_repeats:
        report.calibration = _calibration(request, source, input_set, progress)
    return report, source, input_set


def summary(report: LocateReport) -> dict:
    """The manifest's ``sections.locate``: the verdict and what a reader needs first."""
    rec = report.recommendation
    return {
        "schema": SCHEMA, "passed": report.passed, "report": REPORT_FILE,
        "recommendation": rec.to_json() if rec is not None else None,
        "nodes": [{"label": n.label, "why": n.why} for n in report.nodes],
        "unstable_configs": [c.label for c in report.configs if not c.stable],
        "fp16_passed": report.fp16.passed if report.fp16 is not None else None,
        "calibration_passed": report.calibration.passed if report.calibration is not None else None,
    }


def run_locate(request: LocateRequest, runs_dir: Path, command: Sequence[str] = (), run_id: str | None = None,
               progress: Progress = NULL_PROGRESS) -> tuple[LocateReport, Path]:
    """Measure, then write the run directory (``locate.json`` and the manifest, written last)."""
    named = resolve_model(request.model, request.stage)
    if request.precision is Precision.FP32 or request.fp16_ep == "cuda":
        require_provider("cuda")  # no GPU: said before a run directory exists
    label = f"locate-{named.describe().get('name') or named.path.stem}"
    with RunDirectory.create(runs_dir, label, "locate", run_id) as rundir, \
            capture_ort_log(rundir.file(ORT_LOG), str(rundir.path / ORT_LOG)) as ort_log:  # measured inside: its scratch space
        report, source, input_set = build_report(request, progress)
        write_json_atomic(rundir.file(REPORT_FILE), report.to_json())
        manifest = Manifest(
            kind="locate", command=list(command), model=source.describe(),
            inputs=record_inputs(input_set, input_set.sample_infos(), rundir.file(SAMPLES_FILE), SAMPLES_FILE),
            environment=fingerprint(),
            sections={"locate": summary(report)},
        )
        if ort_log.refresh():  # the CUDA EP's kernel warnings ("running in Fallback mode") land here
            manifest.sections["onnxruntime_log"] = ort_log.to_json()
        path = rundir.finish(manifest)
    return report, path


def load_report(run: Run | Path) -> LocateReport:
    """The ``LocateReport`` of a complete locate run directory (``locate.json``)."""
    run = run if isinstance(run, Run) else Run.open(run)
    path = run.file(run.locate.report, "locate report")
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"cannot read {run.path / REPORT_FILE}: {exc}") from None
    return LocateReport.from_json(data)
