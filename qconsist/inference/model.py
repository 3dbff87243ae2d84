"""Which model ``qconsist run`` executes: an ``.onnx`` file, or a stage's artifact in a run directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from qconsist.errors import ConfigError, InputError
from qconsist.store.manifest import Manifest
from qconsist.store.run import Run

DEFAULT_STAGE = "quantize"


@dataclass
class ModelSource:
    """A model file and, when it came from a run directory, that run's stage and provenance."""

    path: Path
    stage: str | None = None
    run: Run | None = None  # the run directory it came from
    stages: list[dict[str, Any]] = field(default_factory=list)  # provenance: stages up to the one run

    @property
    def run_dir(self) -> Path | None:
        return self.run.path if self.run is not None else None

    @property
    def manifest(self) -> Manifest | None:
        return self.run.manifest if self.run is not None else None

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {"path": str(self.path)}
        if self.run_dir is not None:
            data.update({"run": str(self.run_dir), "stage": self.stage})
            if self.manifest is not None:
                data["name"] = self.manifest.model.get("name")
        else:
            data["name"] = self.path.stem
        return data

    def preprocess_json(self) -> dict | None:
        """The source run's declared preprocessing, when its manifest records one."""
        if self.manifest is None:
            return None
        for holder in (self.manifest.inputs, self.manifest.model, *self.manifest.sections.values()):
            if isinstance(holder, dict) and isinstance(holder.get("preprocess"), dict):
                return holder["preprocess"]
        for stage in self.manifest.stages:
            params = stage.get("params") or {}
            if isinstance(params.get("preprocess"), dict):
                return params["preprocess"]
        return None


def resolve_model(model: Path | str | Run, stage: str | None = None) -> ModelSource:
    """``model`` is an ONNX file, or a complete run directory (``stage`` picks its artifact, default quantize)."""
    path = model.path if isinstance(model, Run) else Path(model)
    if isinstance(model, Run) or path.is_dir():
        run = model if isinstance(model, Run) else Run.open(path)
        names = run.model_stages()
        wanted = stage or (DEFAULT_STAGE if DEFAULT_STAGE in names else (names[-1] if names else None))
        if wanted is None:
            raise InputError(f"run {path} has no stage with a model artifact")
        if wanted not in names:
            raise ConfigError(f"run {path} has no stage {wanted!r} with a model; stages: {', '.join(names) or 'none'}")
        position = names.index(wanted)
        artifact = run.artifact(wanted)
        if artifact is None:
            raise InputError(f"run {path}: the {wanted} artifact (the model the run ran) is gone")
        kept = [s for s in run.stages if s.get("name") in names[: position + 1]]
        return ModelSource(artifact, wanted, run, kept)
    if stage is not None:
        raise ConfigError("`stage` applies to a run directory, not to a model file")
    if not path.exists():
        raise InputError(f"model {path} does not exist")
    if path.suffix.lower() != ".onnx":
        raise InputError(f"model {path}: give an .onnx file or a run directory")
    return ModelSource(path)


def with_dynamic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs and outputs take any batch size (their first dimension becomes the
    symbol ``batch``; intermediate shape annotations are dropped for onnxruntime to infer again). Whether
    the model really allows it is the caller's check: a graph that bakes its batch into a constant (a
    Reshape to [1, -1], say) fails or computes something else at another batch size."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in (*copy.graph.input, *copy.graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = "batch"
    del copy.graph.value_info[:]
    return copy
