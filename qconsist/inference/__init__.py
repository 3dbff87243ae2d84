"""Inference of a model on an input set, with execution options recorded, and the faithful tensor dump."""

from qconsist.inference.dump import RawMode, RawSelection
from qconsist.inference.model import ModelSource, resolve_model
from qconsist.inference.provider import PROVIDERS, ConvAlgoSearch, ProviderSpec, register_provider
from qconsist.inference.runner import InferenceResult, RunRequest, run_inference
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session, require_provider

__all__ = [
    "PROVIDERS", "ConvAlgoSearch", "ExecutionOptions", "InferenceResult", "ModelSource", "OptimizationLevel",
    "ProviderSpec", "RawMode", "RawSelection", "RunRequest", "create_session", "register_provider",
    "require_provider", "resolve_model", "run_inference",
]
