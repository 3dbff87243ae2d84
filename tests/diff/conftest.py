"""Fixtures for the diff tests: open_nsfw's quantized model run on package photos, dumped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

SAMPLES = 4
OPEN_NSFW_PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "open_nsfw.toml"


@pytest.fixture(scope="session")
def nsfw_inputs(nsfw_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first package photos, preprocessed as pipelines/open_nsfw.toml says, stacked in one .npy."""
    from qconsist.inference.model import resolve_model
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline

    model = resolve_model(nsfw_run.path)
    name = input_specs(model.path)[0].name
    photos = open_input_set("package:photos", load_pipeline(OPEN_NSFW_PIPELINE).preprocess, name)
    path = tmp_path_factory.mktemp("nsfw-inputs") / "photos.npy"
    np.save(path, np.concatenate([photos.sample(i)[name] for i in range(SAMPLES)]))
    return path


@pytest.fixture(scope="session")
def level_runs(nsfw_run, nsfw_inputs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Dumps of the quantized model at optimization levels disable and extended (QDQ fusion), and a
    second run at extended (identical), with raw tensors of the first conv (and its Q/DQ) kept."""
    from qconsist.inference import ExecutionOptions, RawSelection, RunRequest, resolve_model, run_inference
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set

    runs = tmp_path_factory.mktemp("level-runs")
    source = resolve_model(nsfw_run.path)
    inputs = open_input_set(nsfw_inputs, None, input_specs(source.path)[0].name)
    out = {}
    for key, level in (("disable", "disable"), ("extended", "extended"), ("extended2", "extended")):
        request = RunRequest(ExecutionOptions(graph_optimization_level=level), dump=True, raw=RawSelection.parse("conv_1,relu_1_QuantizeLinear,relu_1_DequantizeLinear"))
        out[key] = run_inference(source, inputs, request, runs, run_id=key).run_dir
    return out


EVALUATION = (12, 3)  # package photos 12..14: pipelines/open_nsfw.toml's evaluation photos, calibrated on by neither run
OTHER_OFFSET = 9  # run B calibrates on package photos 9..20 instead of 0..11


@pytest.fixture(scope="session")
def calibration_runs(nsfw_run, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two open_nsfw pipeline runs that differ only in their calibration photos (A: the ``nsfw_run``
    fixture, photos 0..11; B: photos 9..20), and ``--dump`` inference runs of both quantized models on the
    same evaluation photos (``inference_a``, ``inference_b``; ``evaluation``: their offset and count)."""
    import dataclasses

    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inference.session import input_specs
    from qconsist.inputs import open_input_set
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    config = load_pipeline(OPEN_NSFW_PIPELINE)
    calibration = config.calibration
    other = dataclasses.replace(
        config,
        calibration=dataclasses.replace(
            calibration, inputs=dataclasses.replace(calibration.inputs, offset=OTHER_OFFSET), repeat=1,
        ),
    )
    runs = tmp_path_factory.mktemp("calibration-runs")
    out = {"evaluation": EVALUATION, "pipeline_a": nsfw_run.path, "pipeline_b": run_pipeline(other, runs_dir=runs, run_id="pipeline-b").path}
    for key in ("a", "b"):
        source = resolve_model(out[f"pipeline_{key}"])
        photos = open_input_set("package:photos", config.preprocess, input_specs(source.path)[0].name)
        request = RunRequest(ExecutionOptions(), dump=True)
        out[f"inference_{key}"] = run_inference(source, photos.subset(*EVALUATION), request, runs, run_id=f"inference-{key}").run_dir
    return out
