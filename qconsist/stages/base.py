"""What a pipeline stage is: a name, an options type read from its ``[section]`` of the pipeline file, and
``run(source, target, options, context) -> StageRecord``; and the registry that orders them.

A stage module (``qconsist/stages/<name>.py``) defines one object ``STAGE`` that satisfies ``Stage``; the
registry finds every such module in this package, so adding a stage is one new file. The pipeline, the
repeated calibration, the gate, the run-directory readers and the history read the stage list from here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from qconsist.discovery import discover
from qconsist.inputs.inputset import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.hashing import ArtifactHashes
from qconsist.tomlfile import Table


@dataclass
class StageContext:
    """What a stage may use besides its own options. ``calibration`` / ``evaluation`` open the pipeline's
    input sets for a model (its input name decides the feed); ``file`` is where a stage writes extra files."""

    model_files: dict[str, Path] = field(default_factory=dict)  # the pipeline's model source files by role
    calibration: Callable[[Path], InputSet] | None = None
    evaluation: Callable[[Path], InputSet] | None = None
    calibration_options: Any = None  # CalibrationOptions of the pipeline's [calibration]
    file: Callable[[str], Path] | None = None  # a path inside the run directory
    root: Path | None = None  # the run directory (artifacts are recorded relative to it)
    previous: str | None = None  # the stage whose artifact is ``source``
    progress: Progress = NULL_PROGRESS
    output_kinds: dict[str, Any] = field(default_factory=dict)  # declared kinds of the model's outputs (OutputKind)


@dataclass
class StageRecord:
    """What a stage produced: its artifact and hashes, the exact parameters, the checks with their figures,
    and, in ``manifest``, what it adds to the run's manifest besides its stage entry (e.g. ``calibration``)."""

    name: str
    path: Path
    params: dict[str, Any]
    artifact: ArtifactHashes
    checks: dict[str, Any]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)  # further keys of the stage entry
    manifest: dict[str, Any] = field(default_factory=dict)
    result: Any = None  # the stage's own typed result (e.g. QuantizeResult)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params, "artifact": self.artifact.to_json(), "checks": self.checks,
                "seconds": self.seconds, **self.extra}


@runtime_checkable
class Stage(Protocol):
    name: str  # also its [section] in a pipeline file and its folder in a run directory
    order: int  # position in the pipeline
    optional: bool  # runs only when the pipeline file has its [section]
    produces_float: bool  # its artifact is still a float model (calibration starts from the last of these)
    options_type: type  # a frozen dataclass with ``to_json()`` (recorded in the manifest's pipeline section)

    def parse(self, table: Table | None, base: Path) -> Any:
        """Its options from its [section] (``None``: absent), unknown keys refused."""

    def run(self, source: Path | None, target: Path, options: Any, context: StageContext) -> StageRecord:
        """Turn ``source`` (``None`` for the first stage) into ``target``, checked, and say what was done."""


@functools.lru_cache(maxsize=1)
def stages() -> tuple[Stage, ...]:
    """Every stage of this package, in pipeline order."""
    found = discover("qconsist.stages", "STAGE")
    for module, stage in found:
        if not isinstance(stage, Stage):
            raise TypeError(f"{module}.STAGE is not a Stage")
    return tuple(sorted((stage for _, stage in found), key=lambda s: s.order))


def stage_names() -> tuple[str, ...]:
    return tuple(s.name for s in stages())


def stage(name: str) -> Stage:
    for candidate in stages():
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def float_stage_names() -> tuple[str, ...]:
    """The stages whose artifact is a float model, in pipeline order."""
    return tuple(s.name for s in stages() if s.produces_float)
