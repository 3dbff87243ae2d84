"""Opening the inputs of a model: the one place where ``InputOptions`` (a command's) or a ``DataConfig`` (a
pipeline's calibration or evaluation set) become an ``InputSet``; the CLI's commands, the pipeline, locate, the
gate and the Python API all go through it, so they share its rules."""

from __future__ import annotations

from pathlib import Path

from qconsist.errors import ConfigError, InputError
from qconsist.inference.model import ModelSource
from qconsist.inference.session import input_specs
from qconsist.inputs import open_input_set
from qconsist.inputs.inputset import InputSet
from qconsist.inputs.options import InputOptions
from qconsist.inputs.preprocess import Preprocess
from qconsist.pipeline.config import DataConfig, load_pipeline


def preprocess_for(pipeline: Path | None, source: ModelSource) -> Preprocess | None:
    """How images are prepared for ``source``: the pipeline file's ``[preprocess]`` when one is given, else
    the one the source run recorded (``None``: a model file, whose images cannot be prepared)."""
    if pipeline is not None:
        return load_pipeline(pipeline).preprocess
    found = source.preprocess_json()
    if found is None:
        return None
    return Preprocess.from_dict({k: v for k, v in found.items() if v is not None}, where="run manifest preprocess")


def open_inputs(options: InputOptions, source: ModelSource, batch_size: int = 1, up_to: bool = False) -> InputSet:
    """The input set ``options`` name, prepared for ``source``, labelled, sliced, checked against the model's
    inputs (in steps of ``batch_size`` samples) and read by ``options.workers`` input workers. With ``up_to``,
    ``count`` is a most: a smaller set gives what it has from ``offset`` (``locate``'s 8 samples)."""
    if options.source is None:
        raise ConfigError("`inputs` names no input set: give one (the run's recorded inputs are opened from the run)")
    specs = input_specs(source.path)
    if not specs:
        raise ConfigError(f"model {source.path} has no inputs")
    selected = open_input_set(options.source, preprocess_for(options.pipeline, source), specs[0].name, options.labels)
    if options.offset or options.count is not None:
        count = options.count
        if up_to and count is not None:
            count = min(count, max(len(selected) - options.offset, 1))
        selected = selected.subset(options.offset, count)
    return selected.checked(specs, batch_size).with_workers(options.workers)


def open_data(data: DataConfig, preprocess: Preprocess | None, input_name: str, what: str) -> InputSet:
    """A pipeline's ``what`` set (calibration, evaluation): its samples from ``offset``, ``count`` of them."""
    inputs = open_input_set(data.data, preprocess, input_name)
    if len(inputs) == 0:
        raise InputError(f"{what} set {data.data} is empty")
    if data.offset >= len(inputs):
        raise InputError(f"{what} set {data.data} has {len(inputs)} samples; offset {data.offset} leaves none")
    return inputs.subset(data.offset, data.count)
