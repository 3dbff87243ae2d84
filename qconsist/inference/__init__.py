"""Inference of a model on an input set, with execution options recorded, and the faithful tensor dump."""

from qconsist.inference.dump import RawMode, RawSelection
from qconsist.inference.model import ModelSource, resolve_model
from qconsist.inference.runner import InferenceResult, RunRequest, run_inference
from qconsist.inference.session import (
    ConvAlgoSearch, ExecutionOptions, OptimizationLevel, Provider, create_session,
)

__all__ = [
    "ConvAlgoSearch", "ExecutionOptions", "InferenceResult", "ModelSource", "OptimizationLevel", "Provider",
    "RawMode", "RawSelection", "RunRequest", "create_session", "resolve_model", "run_inference",
]
