"""``Run``: a complete run directory, opened once, that every reader is handed.

``Run.open(path)`` reads and checks the manifest once (``rundir.open_run``); the run's files are then verified
against the manifest's ``files`` map the first time they are asked for (``run.file(name)``: confined to the run,
its sha256 streamed and compared, once per run and file) and its models loaded once (``run.model(stage)``).
Its sections come typed (``run.inference``, ``run.dump``, ``run.locate``, ``run.calibration``:
``qconsist.store.sections``), read and checked once. No reader works out a path from a manifest dict or verifies
a file again.

An inference run refers to the run its model came from instead of copying that run's calibration table and
per-initializer digests (``model.source_manifest``: the source manifest's sha256 and size, and the digest and
size of its calibration table): two inference runs of one source compare their calibration by digest, without
opening anything outside them; ``run.calibration`` reads the source's table (through ``run.source()``, its
manifest opened like any external file a run names: only at the recorded size, used only at the recorded
sha256) when it must. The stage records stay (without the per-initializer digests, which are recomputed from a
model when two differ). Runs written before copied both: they are read as written.
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import onnx

from qconsist.errors import RunStoreError
from qconsist.onnxfile import read_onnx
from qconsist.store.arrays import FORMAT as OUTPUTS_FORMAT
from qconsist.store.arrays import OutputArrays, OutputFiles, SampleArchives
from qconsist.store.manifest import MANIFEST_NAME, Manifest
from qconsist.store.rundir import open_run, same_run
from qconsist.store.sections import CalibrationSection, DumpSummary, InferenceSection, LocateSection
from qconsist.store.sections import table_digest
from qconsist.store.verify import (
    external_file, optional_run_file, recorded_files, run_file, stage_artifact, verify_artifacts,
)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
SOURCE_KEY = "source_manifest"  # in an inference manifest's ``model``: the sha256 and size of its source's manifest


class Run:
    """A complete run directory and its manifest (see the module docstring)."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = Path(path)
        self.manifest = manifest
        self._files: dict[str, Path] = {}
        self._artifacts: dict[str, Path | None] = {}
        self._models: dict[str, onnx.ModelProto | None] = {}

    @classmethod
    def open(cls, path: Path | str) -> "Run":
        """The complete run at ``path``; a one-line ``RunStoreError`` when it is missing, incomplete or damaged."""
        return cls(Path(path), open_run(Path(path)))

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, kind={self.kind!r})"

    def __str__(self) -> str:
        return str(self.path)

    # --- what the manifest says -----------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @property
    def sections(self) -> dict[str, Any]:
        return self.manifest.sections

    @property
    def name(self) -> str:
        """The model's name, else the run id."""
        return str(self.manifest.model.get("name") or self.manifest.run_id)

    def same_as(self, other: "Run") -> bool:
        """One run: the same folder, or a copy of it."""
        return same_run(self.path, self.manifest, other.path, other.manifest)

    # --- files ------------------------------------------------------------------------------------------------------

    def file(self, relative: Any, what: str = "path") -> Path:
        """The file ``relative`` of the run, confined to it and verified against its recorded sha256 (once)."""
        key = relative if isinstance(relative, str) else repr(relative)
        found = self._files.get(key)
        if found is None:
            found = self._files[key] = run_file(self.path, self.manifest, relative, what)
        return found

    def optional_file(self, relative: str) -> Path | None:
        """``file``, or ``None`` when the run neither holds nor records it (optional raw tensors)."""
        if relative in self._files:
            return self._files[relative]
        found = optional_run_file(self.path, self.manifest, relative)
        if found is not None:
            self._files[relative] = found
        return found

    def recorded(self) -> dict[str, dict[str, Any]]:
        """Every file the run recorded, with its hashes."""
        return recorded_files(self.manifest)

    # --- the models ---------------------------------------------------------------------------------------------

    @property
    def stages(self) -> list[dict[str, Any]]:
        """The stage records (an inference run's: those of the run its model came from, as it recorded them)."""
        return self.manifest.stages

    def stage(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.stages if s.get("name") == name), None)

    def model_stages(self) -> list[str]:
        """The stages whose artifact is a model, in order."""
        return [s["name"] for s in self.stages if isinstance(s.get("artifact"), dict)]

    def artifact(self, stage: str) -> Path | None:
        """The verified model file of a stage (``None`` when an inference run's external model is gone)."""
        if stage not in self._artifacts:
            self._artifacts[stage] = stage_artifact(self.path, self.manifest, stage)
        return self._artifacts[stage]

    def model(self, stage: str) -> onnx.ModelProto | None:
        """The model of a stage, verified and loaded once (``None`` when it is gone)."""
        if stage not in self._models:
            path = self.artifact(stage)
            self._models[stage] = None if path is None else _load_model(self.path, stage, path)
        return self._models[stage]

    def ran_model(self) -> Path | None:
        """The model an inference run ran (outside the run: verified against its recorded size and sha256)."""
        record = self.manifest.model.get("artifact")
        if not isinstance(record, dict) or not self.manifest.model.get("path"):
            return None
        return external_file(self.path, {**record, "path": self.manifest.model.get("path")}, "model path")

    def verify_artifacts(self) -> None:
        """Every model artifact the run holds, verified (before its recorded hashes are trusted)."""
        verify_artifacts(self.path, self.manifest)

    # --- the run it came from ------------------------------------------------------------------------------------

    def source(self) -> "Run | None":
        """The run an inference run's model came from, when the manifest refers to it and it is still there:
        its manifest verified against the recorded sha256. ``None`` for runs that copied it or name none."""
        return self._source

    @cached_property
    def _source(self) -> "Run | None":
        record = self.manifest.model.get(SOURCE_KEY)
        where = self.manifest.model.get("run")
        if not isinstance(record, dict) or not isinstance(where, str) or not where.startswith("/"):
            return None
        path = Path(where)
        found = external_file(self.path, {"path": str(path / MANIFEST_NAME), "size": record.get("size"),
                                          "sha256": record.get("sha256")}, "source run's manifest")
        return Run.open(path) if found is not None else None

    # --- typed sections ---------------------------------------------------------------------------------------------

    @cached_property
    def inference(self) -> InferenceSection:
        """The inference section (``RunStoreError`` when the run has none or it is damaged)."""
        return InferenceSection.read(str(self.path), self.manifest.sections.get("inference"))

    @property
    def has_inference(self) -> bool:
        return isinstance(self.manifest.sections.get("inference"), dict)

    @cached_property
    def dump(self) -> DumpSummary:
        """The dump section (``RunStoreError`` when the run has no dump)."""
        return DumpSummary.read(str(self.path), self.manifest.sections.get("dump"))

    @property
    def has_dump(self) -> bool:
        return "dump" in self.manifest.sections

    @cached_property
    def locate(self) -> LocateSection:
        if self.kind != "locate":
            raise RunStoreError(f"run {self.path} is a {self.kind} run, not a locate run")
        return LocateSection.read(str(self.path), self.manifest.sections.get("locate") or {})

    @cached_property
    def calibration(self) -> CalibrationSection:
        """The calibration record: the run's own, or (an inference run) its source run's (opened for it: empty
        when that run is gone)."""
        if not isinstance(self.manifest.model.get(SOURCE_KEY), dict):
            return CalibrationSection.read(self.manifest.calibration)
        source = self.source()
        return source.calibration if source is not None else CalibrationSection()

    def calibration_digest(self) -> tuple[str, int]:
        """The calibration table's digest and its number of tensors, without opening another run: an inference
        run recorded those of its source's table."""
        record = self.manifest.model.get(SOURCE_KEY)
        if isinstance(record, dict):
            found = record.get("calibration")
            digest = found.get("sha256") if isinstance(found, dict) else None
            tensors = found.get("tensors") if isinstance(found, dict) else None
            if not isinstance(digest, str) or not _HEX64.match(digest) or not isinstance(tensors, int):
                raise RunStoreError(f"run {self.path}: the manifest's record of its source's calibration is damaged")
            return digest, tensors
        table = self.calibration.table
        return table_digest(table), len(table)

    # --- outputs -----------------------------------------------------------------------------------------------------

    def outputs(self) -> OutputArrays:
        """The final outputs of an inference run, sample by sample or in blocks (either layout)."""
        section = self.inference
        where = f"run {self.path}"
        if section.output_format != OUTPUTS_FORMAT:
            return SampleArchives(where, section.outputs, section.samples, lambda r: self.file(r, "outputs path"))
        files = [self.file(f, "outputs path") for f in section.output_files]
        indexes = [self.optional_file(f[:-4] + ".index.npy") for f in section.output_files]
        return OutputFiles(where, section.outputs, section.samples, files, indexes, section.output_shapes)


def _load_model(run_dir: Path, stage: str, path: Path) -> onnx.ModelProto:
    return read_onnx(path, external_data=True, what=f"run {run_dir}: the {stage} artifact", error=RunStoreError)


def runs_root(path: Path) -> Path:
    """The runs directory a run directory lies in."""
    return Path(os.path.dirname(os.path.abspath(path)))
