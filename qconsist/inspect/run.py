"""A run directory at a glance: what ran (stages and their hashes, or the model), on what, where, how, and what
it kept (dumps, raw tensors, files)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qconsist.errors import ConfigError, RunStoreError
from qconsist.inspect.model import ModelSummary, summarize_model
from qconsist.store.run import Run
from qconsist.store.runs import run_verdict, verify_run
from qconsist.store.serde import serialized

SCHEMA = "qconsist.inspect.run/1"
# what decides numerics and what a reader asks first; the manifest keeps the rest
_ENVIRONMENT = ("onnxruntime_module", "python", "os", "machine", "cpu", "cpu_count", "gpus")
_PACKAGES = ("onnxruntime", "onnxruntime-gpu", "onnx", "numpy", "protobuf", "qconsist")


@dataclass
class StageSummary:
    name: str
    path: str | None  # the artifact, relative to the run directory when inside it
    md5: str | None
    sha256: str | None
    content: str | None  # content hash (ignores metadata)
    seconds: float | None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class DumpSummary:
    tensors: int
    level: str | None
    faithful: bool | None
    samples_checked: int | None
    raw_mode: str | None
    raw_tensors: int  # raw tensors kept, over every sample
    bytes: int  # size of dump/


@serialized(
    schema=SCHEMA, error=RunStoreError, refused="run summary schema {found!r} is not {schema!r}",
    malformed="run summary is malformed: {exc}",
)
@dataclass
class RunSummary:
    """What a run directory holds."""

    path: str
    kind: str
    run_id: str
    status: str
    started: str
    finished: str
    command: str  # as it was typed, shell-quoted
    model: dict[str, Any]
    stages: list[StageSummary]
    inputs: dict[str, Any]  # per input set: source, kind, count, digest
    environment: dict[str, Any]
    options: dict[str, Any]  # the execution options of an inference run
    sections: list[str]
    dump: DumpSummary | None
    files: int
    bytes: int
    stage_model: ModelSummary | None = None  # with ``stage``: that stage's model
    accuracy: dict[str, Any] | None = None  # an inference run's accuracy against its labels
    problems: list[str] = field(default_factory=list)  # files modified, missing or refused (status "modified")
    verdict: str = "—"  # what the run judged (``store.runs.run_verdict``): a complete run may have failed its checks


def _size(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.stat().st_size for p in files)


def _stage(run_dir: Path, record: dict[str, Any]) -> StageSummary:
    artifact = record.get("artifact") if isinstance(record.get("artifact"), dict) else {}
    params = record.get("params") if isinstance(record.get("params"), dict) else {}
    return StageSummary(
        name=str(record.get("name")), path=artifact.get("path"), md5=artifact.get("md5"), sha256=artifact.get("sha256"),
        content=artifact.get("content"), seconds=record.get("seconds"),
        params={k: v for k, v in params.items() if k not in ("repairs", "ort_arguments")},
    )


def _inputs(run: Run) -> dict[str, Any]:
    keep = ("source", "kind", "count", "digest")
    recorded = run.manifest.inputs
    if "source" in recorded:
        return {"inputs": {k: recorded.get(k) for k in keep}}
    return {name: {k: value.get(k) for k in keep} for name, value in recorded.items() if isinstance(value, dict)}


def _dump(run: Run) -> DumpSummary | None:
    if not run.has_dump:
        return None
    dump = run.dump
    folder = run.path / "dump"
    return DumpSummary(
        tensors=dump.tensors, level=dump.level, faithful=dump.faithful, samples_checked=dump.samples_checked,
        raw_mode=dump.raw.get("mode"), raw_tensors=int(dump.raw.get("tensors_saved") or 0),
        bytes=_size(folder)[1] if folder.is_dir() else 0,
    )


def summarize_run(run_dir: Path | str, stage: str | None = None) -> RunSummary:
    """The summary of a complete run directory; with ``stage``, also that stage's model."""
    run = Run.open(run_dir)
    manifest, run_dir = run.manifest, run.path
    environment = {k: manifest.environment.get(k) for k in _ENVIRONMENT if k in manifest.environment}
    packages = manifest.environment.get("packages") if isinstance(manifest.environment.get("packages"), dict) else {}
    environment["packages"] = {k: packages[k] for k in _PACKAGES if packages.get(k)}
    cuda = manifest.environment.get("cuda")
    if isinstance(cuda, dict) and any(cuda.values()):
        environment["cuda"] = cuda
    files, size = _size(run_dir)
    checked = verify_run(run_dir)  # what it holds, not what it says: a tampered run is shown as modified
    problems = [f.detail for f in checked.problems] or ([checked.error] if checked.error else [])
    summary = RunSummary(
        path=str(run_dir), kind=manifest.kind, run_id=manifest.run_id, status="modified" if problems else manifest.status,
        started=manifest.started,
        finished=manifest.finished, command=" ".join(shlex.quote(str(a)) for a in manifest.command),
        model={k: v for k, v in manifest.model.items() if k in ("name", "kind", "source", "path", "run", "stage")},
        stages=[_stage(run_dir, s) for s in run.stages if isinstance(s, dict)], inputs=_inputs(run),
        environment=environment, options=dict(run.inference.options) if run.has_inference else {},
        sections=sorted(manifest.sections), dump=_dump(run), files=files, bytes=size, problems=problems,
        verdict=run_verdict(manifest),
    )
    if run.kind == "inference" and run.inference.accuracy is not None:
        summary.accuracy = run.inference.accuracy.to_json()
    if stage is not None:
        record = run.stage(stage)
        artifact = record.get("artifact") if isinstance(record, dict) else None
        if not isinstance(artifact, dict):
            names = ", ".join(s.name for s in summary.stages if s.path) or "none"
            raise ConfigError(f"run {run_dir} has no stage {stage!r} with a model; stages: {names}")
        path = run.artifact(stage)
        if path is None:
            raise RunStoreError(f"run {run_dir}: the {stage} model ({artifact.get('path')}) is gone")
        summary.stage_model = summarize_model(path)
    return summary


def inspect_path(path: Path | str, stage: str | None = None) -> RunSummary | ModelSummary:
    """A run directory's summary, or an ONNX model's."""
    path = Path(path)
    if path.is_dir():
        return summarize_run(path, stage)
    if stage is not None:
        raise ConfigError("`stage` applies to a run directory, not to a model file")
    return summarize_model(path)
