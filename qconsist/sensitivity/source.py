"""The pipeline run a sensitivity analysis starts from, read in one place (``open_quantized_run``).

What it needs of the run, every file verified against the manifest: the float model the quantize stage
started from, the quantized model, the calibration ranges the run recorded (``quantize/calibration_ranges.json``:
the one calibration every probe reuses), the quantize and calibration options as recorded, the outputs' kinds,
and the calibration and evaluation inputs, opened again from the manifest and checked against their digests.
A nightly entry stands for its pipeline run. Anything else — an inference run, a run without a quantize stage
or without recorded ranges — is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import onnx

from qconsist.compare.kinds import JudgedOutput, judged_outputs, parse_kinds
from qconsist.errors import RunStoreError
from qconsist.explain.replay import replay_inputs
from qconsist.inputs import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.stages.base import StageContext
from qconsist.stages.quantize import CalibrationOptions, QuantizeOptions
from qconsist.store.confine import linked_run
from qconsist.store.manifest import Manifest
from qconsist.store.run import Run
from qconsist.store.rundir import open_run
from qconsist.store.verify import run_file, stage_artifact

STAGE = "quantize"
ENTRY_KIND = "nightly-entry"


@dataclass
class QuantizedRun:
    """A complete pipeline run with a quantize stage, as sensitivity uses it (see the module docstring)."""

    path: Path  # the pipeline run directory
    manifest: Manifest
    float_stage: str  # the stage whose artifact the quantize stage quantized
    float_model: Path
    quantized_model: Path
    ranges: Path  # the calibration cache the quantize stage wrote
    options: QuantizeOptions
    calibration: CalibrationOptions
    config: dict[str, Any]  # the pipeline configuration as recorded
    given: Path | None = None  # the run given, when it was a nightly entry standing for this pipeline run
    _judged: list[JudgedOutput] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.manifest.model.get("name") or self.manifest.run_id)

    @property
    def declared_kinds(self) -> dict[str, Any]:
        return parse_kinds(self.config.get("outputs") or {}, f"run {self.path}: [evaluation] outputs")

    def judged(self) -> list[JudgedOutput]:
        """Every final output and part with its kind (declared in the run's pipeline, else read from the float graph)."""
        if self._judged is None:
            model = onnx.load(str(self.float_model), load_external_data=False)
            self._judged = judged_outputs(model, self.declared_kinds)
        return self._judged

    def inputs(self, role: str) -> InputSet:
        """The run's ``calibration`` or ``evaluation`` inputs, opened again from the manifest for the float model
        (digest checked)."""
        recorded = self.manifest.inputs.get(role)
        if isinstance(recorded, dict) and recorded.get("same_as"):
            recorded = self.manifest.inputs.get(str(recorded["same_as"]))
        if not isinstance(recorded, dict):
            raise RunStoreError(f"run {self.path} does not record its {role} inputs")
        chosen, _ = replay_inputs(Run(self.path, Manifest(kind="pipeline", inputs=recorded)), self.float_model)
        return chosen

    def stage_context(self, file: Callable[[str], Path] | None, root: Path | None,
                      progress: Progress = NULL_PROGRESS) -> StageContext:
        """What the pipeline's quantize stage is given when it runs again: the run's calibration and evaluation
        inputs, its calibration options and declared output kinds."""
        cache: dict[str, InputSet] = {}

        def opener(role: str) -> Callable[[Path], InputSet]:
            def open_for(model: Path) -> InputSet:
                if role not in cache:
                    cache[role] = self.inputs(role)
                return cache[role]
            return open_for

        return StageContext(calibration=opener("calibration"), evaluation=opener("evaluation"),
                            calibration_options=self.calibration, file=file, root=root, previous=self.float_stage,
                            progress=progress, output_kinds=dict(self.declared_kinds))


def _pipeline_run(path: Path, manifest: Manifest) -> tuple[Path, Manifest]:
    if manifest.kind == "pipeline":
        return path, manifest
    if manifest.kind == ENTRY_KIND:
        entry = manifest.sections.get("nightly_entry")
        if not isinstance(entry, dict) or not isinstance(entry.get("pipeline_run"), str):
            raise RunStoreError(f"run {path}: nightly entry without its pipeline run")
        pipeline = linked_run(path, entry["pipeline_run"], "pipeline run")
        return pipeline, open_run(pipeline)
    made_from = ""
    if manifest.kind == "sensitivity":
        made_from = f" (this one was made from {manifest.sections.get('sensitivity', {}).get('run', 'a pipeline run')})"
    raise RunStoreError(
        f"run {path} is a(n) {manifest.kind} run: sensitivity needs a pipeline run (or a nightly entry), whose quantize "
        f"stage it repeats with nodes kept in float{made_from}")


def open_quantized_run(path: Path | str) -> QuantizedRun:
    """The pipeline run at ``path`` (or a nightly entry's), checked to hold what sensitivity needs."""
    given = Path(path)
    run_dir, manifest = _pipeline_run(given, open_run(given))
    names = [s.get("name") for s in manifest.stages if isinstance(s.get("artifact"), dict)]
    if STAGE not in names:
        raise RunStoreError(f"run {run_dir} has no quantize stage (stages: {', '.join(map(str, names)) or 'none'}): "
                            "sensitivity needs a pipeline run that quantized its model")
    if names.index(STAGE) == 0:
        raise RunStoreError(f"run {run_dir} records no float model before its quantize stage")
    float_stage = str(names[names.index(STAGE) - 1])
    relative = manifest.calibration.get("ranges_file")
    if not isinstance(relative, str):
        raise RunStoreError(f"run {run_dir} does not record its calibration ranges (quantize/calibration_ranges.json): "
                            "run the pipeline again with this qconsist, which records them")
    config = next((manifest.sections[key] for key in ("pipeline", "config")
                   if isinstance(manifest.sections.get(key), dict) and "calibration" in manifest.sections[key]), None)
    if config is None:
        raise RunStoreError(f"run {run_dir} does not record its pipeline configuration")
    float_model = stage_artifact(run_dir, manifest, float_stage)
    quantized = stage_artifact(run_dir, manifest, STAGE)
    if float_model is None or quantized is None:
        raise RunStoreError(f"run {run_dir}: the {float_stage} or quantize artifact is gone")
    return QuantizedRun(
        path=run_dir, manifest=manifest, float_stage=float_stage, float_model=float_model, quantized_model=quantized,
        ranges=run_file(run_dir, manifest, relative, "calibration ranges"),
        options=QuantizeOptions.from_json(config.get(STAGE) or {}), calibration=CalibrationOptions.from_json(config["calibration"]),
        config=config, given=given if given != run_dir else None,
    )

