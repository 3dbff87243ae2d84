"""What the gate judges: a candidate (or baseline) gathered from run directories.

A gate side is either

* a pipeline run (kind ``pipeline``): artifacts, calibration table, repeated calibration; the gate runs the
  float and quantized artifacts itself on the pipeline's evaluation inputs for the final-output checks; or
* a nightly entry (kind ``nightly-entry``, written by ``qconsist nightly``): the pipeline run plus the
  inference runs with fingerprint dumps (quantized, its repeat, float), the locate run or why it was
  skipped, the pinned GPU config and the labels of the evaluation inputs where they exist.

Labels are one idea (``qconsist.inputs.labels``): a nightly entry's ``labels`` file, else the labels the
evaluation set carries itself (class folders, a labels file beside its images), read from the pipeline run's
sample table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.compare.kinds import JudgedOutput, judged_outputs, parse_kinds
from qconsist.errors import QconsistError, RunStoreError
from qconsist.onnxfile import read_onnx
from qconsist.stages.base import float_stage_names
from qconsist.store.confine import linked_run
from qconsist.store.run import Run
from qconsist.inputs import Preprocess
from qconsist.inputs.labels import Labels
from qconsist.inputs.digest import digest_kind, same_inputs
from qconsist.inputs.record import read_samples
from qconsist.store.serde import loads
from qconsist.inference.session import input_specs
from qconsist.inference.session import outputs_of
from qconsist.pipeline.config import DataConfig
from qconsist.pipeline.inputs import open_data

log = logging.getLogger(__name__)

ENTRY_KIND = "nightly-entry"
ENTRY_SECTION = "nightly_entry"


@dataclass
class Side:
    """One side of a gate comparison."""

    run: Run  # the run given (pipeline or nightly entry)
    pipeline: Run
    inference: dict[str, Path] = field(default_factory=dict)  # role -> inference run dir (quantized, repeat, float)
    locate_path: Path | None = None
    locate_skipped: str | None = None
    pinned_gpu: str | None = None
    labels: dict[str, int] | None = None
    _outputs: dict[str, list[dict[str, np.ndarray]]] = field(default_factory=dict)
    _judged: list[JudgedOutput] | None = None

    @property
    def path(self) -> Path:
        return self.run.path

    @property
    def pipeline_path(self) -> Path:
        return self.pipeline.path

    @property
    def model(self) -> str:
        entry = self.run.sections.get(ENTRY_SECTION, {})
        return str(entry.get("model") or self.pipeline.manifest.model.get("name") or self.pipeline.run_id)

    def stage(self, name: str) -> dict[str, Any] | None:
        return self.pipeline.stage(name)

    def artifact(self, stage: str) -> Path | None:
        """The file of a stage's artifact, inside the pipeline run directory, verified against its sha256."""
        return self.pipeline.artifact(stage)

    def float_stage(self) -> str | None:
        """The last stage whose artifact is a float model (``source``: a run recorded before stages had names)."""
        for name in (*reversed(float_stage_names()), "source"):
            if self.stage(name) and self.stage(name).get("artifact"):
                return name
        return None

    def config(self) -> dict[str, Any]:
        """The pipeline configuration the run recorded (``PipelineConfig.to_json``)."""
        for key in ("config", "pipeline"):
            value = self.pipeline.sections.get(key)
            if isinstance(value, dict) and "calibration" in value:
                return value
        raise RunStoreError(f"run {self.pipeline_path} does not record its pipeline configuration")

    def judged(self) -> list[JudgedOutput]:
        """What each final output is (``qconsist.compare.kinds``): declared in the pipeline's ``[evaluation]
        outputs`` (recorded in the run; runs made before it declare nothing), else read from the float graph."""
        if self._judged is None:
            declared = parse_kinds(self.config().get("outputs") or {}, f"run {self.pipeline_path}: [evaluation] outputs")
            stage = self.float_stage()
            path = self.artifact(stage) if stage else None
            if path is None:
                raise RunStoreError(f"run {self.pipeline_path} has no float model to read its outputs' kinds from")
            self._judged = judged_outputs(read_onnx(path, error=RunStoreError), declared)
        return self._judged

    def outputs(self, stage: str) -> list[dict[str, np.ndarray]]:
        """Final outputs of a stage's artifact on the evaluation inputs (computed once, on the CPU)."""
        if stage not in self._outputs:

            self._outputs[stage] = outputs_of(self.artifact(stage), evaluation_inputs(self))
        return self._outputs[stage]


def evaluation_inputs(side: Side):  # -> InputSet
    """The evaluation set, labelled with the side's labels (a nightly's labels file, else the set's own): the
    labels the gate's ``labels.accuracy`` judges against."""
    inputs = role_inputs(side, "evaluation")
    if side.labels and (inputs.labels is None or dict(inputs.labels.by_name) != side.labels):
        inputs.labels = Labels(dict(side.labels), source="the nightly's labels")
    return inputs


def role_inputs(side: Side, role: str):  # -> InputSet
    """The pipeline's calibration or evaluation set (the calibration set where it has no evaluation set)."""
    config = side.config()
    data = config.get(role) or config["calibration"]
    preprocess = Preprocess.from_dict(config["preprocess"]) if config.get("preprocess") else None
    quantized = side.artifact("quantize")
    name = input_specs(quantized)[0].name if quantized else "input"
    inputs = open_data(DataConfig(data["data"], int(data.get("offset") or 0), data.get("count")), preprocess, name, role)
    return verified_inputs(side, role, inputs)


def verified_inputs(side: Side, role: str, inputs: Any) -> Any:  # InputSet -> InputSet
    """``inputs`` (a set reopened from the recorded configuration) if they are the ones the pipeline run recorded,
    by digest; else a ``RunStoreError`` naming the samples removed, added and changed since (from the run's sample
    table). What qconsist judges it verifies first: a gate never passes "on 3 samples" of a set that had 4. A run
    that recorded no digest (written before qconsist recorded one) is opened as it is."""
    recorded = recorded_inputs(side, role)
    digest, kind = recorded.get("digest"), digest_kind(recorded.get("digest"))
    if kind is None or inputs.digest(kind) == digest:
        return inputs
    detail = ""
    try:
        table = read_samples(side.pipeline, recorded) if "samples" in recorded else None
    except QconsistError:
        table = None
    if table is not None and table.digests and table.kind == kind:
        now = {name: info.digest.hex() for name, info in zip(inputs.names, inputs.sample_infos())}
        then = dict(zip(table.names, table.digests))
        parts = [(what, names) for what, names in (
            ("removed", [n for n in table.names if n not in now]),
            ("added", [n for n in inputs.names if n not in then]),
            ("changed", [n for n in table.names if n in now and now[n] != then[n]]),
        ) if names]
        if not parts and list(table.names) != list(inputs.names):
            parts = [("reordered", [n for n, m in zip(table.names, inputs.names) if n != m])]
        detail = ": " + "; ".join(f"{what} {_listed(names)}" for what, names in parts) if parts else ""
    source = (side.config().get(role) or side.config()["calibration"]).get("data")
    raise RunStoreError(
        f"run {side.pipeline_path}: its {role} set {source} is not the one the run recorded ({recorded.get('count', '?')} "
        f"samples recorded, {len(inputs)} now){detail}; restore it or run the pipeline again")


def _listed(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return f"{shown} and {len(names) - most} more" if len(names) > most else shown


def recorded_inputs(side: Side, role: str) -> dict[str, Any]:
    """The pipeline manifest's record of its calibration or evaluation set."""
    recorded = side.pipeline.manifest.inputs.get(role)
    if isinstance(recorded, dict) and recorded.get("same_as") == "calibration":
        recorded = side.pipeline.manifest.inputs.get("calibration")
    return recorded if isinstance(recorded, dict) else {}


def same_role_inputs(candidate: Side, baseline: Side, role: str) -> bool | None:
    """Whether both pipelines ran on the same calibration or evaluation set, by digest; where one recorded a
    digest of another kind (a run written before qconsist 0.2), the candidate's set is opened again and
    digested the baseline's way. ``None``: it cannot be told (the set cannot be opened again)."""
    mine, theirs = recorded_inputs(candidate, role).get("digest"), recorded_inputs(baseline, role).get("digest")
    same = same_inputs(mine, theirs)
    if same is not None or mine == theirs:
        return True if same is None else same
    try:  # digested again the other side's way (a side that recorded no digest is digested as the other did)
        if digest_kind(theirs) is not None:
            return role_inputs(candidate, role).digest(digest_kind(theirs)) == theirs
        if digest_kind(mine) is not None:
            return role_inputs(baseline, role).digest(digest_kind(mine)) == mine
    except QconsistError:
        pass
    return None


def load_side(path: Path | str) -> Side:
    """Open a pipeline run or a nightly entry as one side of the gate; ``RunStoreError`` if it is neither."""
    path = Path(path)
    run = Run.open(path)
    if run.kind == "pipeline":
        side = Side(run=run, pipeline=run)
        side.labels = dataset_labels(side)
        return side
    if run.kind != ENTRY_KIND:
        raise RunStoreError(
            f"run {path} is of kind {run.kind!r}; the gate judges a pipeline run or a nightly entry"
        )
    entry = run.sections.get(ENTRY_SECTION)
    if not isinstance(entry, dict) or not isinstance(entry.get("pipeline_run"), str):
        raise RunStoreError(f"run {path}: nightly entry without its pipeline run")
    pipeline_path = linked_run(path, entry["pipeline_run"], "pipeline run")
    inference = entry.get("inference_runs") or {}
    if not isinstance(inference, dict):
        raise RunStoreError(f"run {path}: the manifest's inference_runs must be an object")
    pipeline = Run.open(pipeline_path)
    if pipeline.kind != "pipeline":
        raise RunStoreError(f"run {path}: its pipeline run {pipeline_path} is of kind {pipeline.kind!r}")
    side = Side(
        run=run, pipeline=pipeline,
        inference={str(role): linked_run(path, run, f"{role} inference run") for role, run in inference.items()},
        locate_path=linked_run(path, entry["locate_run"], "locate run") if entry.get("locate_run") else None,
        locate_skipped=entry.get("locate_skipped"), pinned_gpu=entry.get("pinned_gpu"),
        labels=entry_labels(run, entry.get("labels")),
    )
    if side.labels is None:
        side.labels = dataset_labels(side)
    return side


def dataset_labels(side: Side) -> dict[str, int] | None:
    """The labels the evaluation set itself carries (class folders, a labels file beside its images), as the
    pipeline run recorded them in its sample table; ``None`` where it has none."""
    recorded = recorded_inputs(side, "evaluation")
    if "samples" not in recorded:
        return None
    labelled = read_samples(side.pipeline, recorded).labelled()
    return labelled or None


LABELS_FILE = "labels.json"  # a nightly entry's labels of its evaluation samples: {name: class}


def entry_labels(run: Run, recorded: Any) -> dict[str, int] | None:
    """A nightly entry's labels: the file it keeps (``LABELS_FILE``, verified), or the object entries written
    before copied into their manifest."""
    if recorded is None or isinstance(recorded, dict):
        return recorded
    path = run.file(recorded, "labels path")
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"run {run.path}: {recorded} is not readable JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                             for k, v in data.items()):
        raise RunStoreError(f"run {run.path}: {recorded} must map sample names to class indices")
    return data
