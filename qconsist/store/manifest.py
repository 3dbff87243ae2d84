"""``manifest.json``: the schema-versioned record of a run. Written last; its presence marks a run complete.

Top-level keys (schema ``qconsist.run/1``)::

    schema        "qconsist.run/1"
    kind          "pipeline" | "inference" | "locate" | "nightly-entry" | "nightly"
    run_id        directory name
    status        "complete"
    started, finished   UTC ISO-8601
    command       argv that produced the run (informational)
    model         {"name": ..., "source": ...}           what the run is about
    inputs        {"kind", "digest", "count", "names"}   the input set (digest over the exact tensors)
    stages        [ {name, params, artifact (ArtifactHashes.to_json), checks, seconds} ]
    calibration   {"table": {tensor: {min, max, scale, zero_point, ...}}, "issues": [...]}
    environment   environment fingerprint (qconsist.environment)
    files         {path: {md5, sha256, size}}  every file of the run (relative POSIX paths; not the manifest),
                  recorded when the run finishes and checked by every command that reads the run
    sections      {name: {...}}  kind-specific results (pipeline, calib_repeat, inference, dump, locate,
                  nightly_entry, gate, nightly); JSON written through qconsist.store.serde (non-finite
                  numbers are null, named in a top-level "nonfinite" map)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qconsist.errors import RunStoreError
from qconsist.store.confine import MAX_MANIFEST_BYTES, confined
from qconsist.store.serde import loads

SCHEMA = "qconsist.run/1"
MANIFEST_NAME = "manifest.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED = {"schema": str, "kind": str, "run_id": str, "status": str}


@dataclass
class Manifest:
    kind: str
    run_id: str = ""
    status: str = "incomplete"
    started: str = ""
    finished: str = ""
    command: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": self.kind,
            "run_id": self.run_id,
            "status": self.status,
            "started": self.started,
            "finished": self.finished,
            "command": list(self.command),
            "model": self.model,
            "inputs": self.inputs,
            "stages": self.stages,
            "calibration": self.calibration,
            "environment": self.environment,
            "sections": self.sections,
            "files": self.files,
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "manifest") -> "Manifest":
        if not isinstance(data, dict):
            raise RunStoreError(f"{source}: not a JSON object")
        for key, kind in _REQUIRED.items():
            if not isinstance(data.get(key), kind):
                raise RunStoreError(f"{source}: missing or invalid '{key}'")
        schema = data["schema"]
        if not schema.startswith("qconsist.run/"):
            raise RunStoreError(f"{source}: unknown schema {schema!r}")
        if schema != SCHEMA:
            raise RunStoreError(f"{source}: schema {schema!r} is not supported by this qconsist (reads {SCHEMA})")
        typed = {
            "command": list, "model": dict, "inputs": dict, "stages": list,
            "calibration": dict, "environment": dict, "sections": dict,
            "started": str, "finished": str, "files": dict,
        }
        values: dict[str, Any] = {}
        for key, kind in typed.items():
            value = data.get(key, kind())
            if not isinstance(value, kind):
                raise RunStoreError(f"{source}: '{key}' must be a JSON {kind.__name__}")
            values[key] = value
        for i, stage in enumerate(values["stages"]):
            if not isinstance(stage, dict) or not isinstance(stage.get("name"), str):
                raise RunStoreError(f"{source}: stages[{i}] must be an object with a 'name'")
        for i, stage in enumerate(values["stages"]):
            artifact = stage.get("artifact")
            if artifact is not None and not isinstance(artifact, dict):
                raise RunStoreError(f"{source}: stages[{i}].artifact must be an object")
            if isinstance(artifact, dict) and not isinstance(artifact.get("path"), str):
                raise RunStoreError(f"{source}: stages[{i}].artifact.path must be a string")
        table = values["calibration"].get("table")
        if table is not None and (not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values())):
            raise RunStoreError(f"{source}: calibration.table must map each tensor to an object")
        for name, value in values["sections"].items():
            if not isinstance(value, (dict, list)):
                raise RunStoreError(f"{source}: sections.{name} must be a JSON object")
        for name, record in values["files"].items():
            if (not isinstance(record, dict) or not isinstance(record.get("sha256"), str)
                    or not _HEX64.match(record["sha256"]) or not isinstance(record.get("size"), int)
                    or isinstance(record.get("size"), bool) or record["size"] < 0):
                raise RunStoreError(f"{source}: files[{name!r}] must record a sha256 (64 hex digits) and a size")
        return cls(kind=data["kind"], run_id=data["run_id"], status=data["status"], **values)

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        path = Path(path)
        confined(path.parent, path.name, "manifest", limit=MAX_MANIFEST_BYTES)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RunStoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError:
            raise RunStoreError(f"{path}: not UTF-8 text") from None
        try:
            data = loads(text)
        except ValueError as exc:
            raise RunStoreError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_json(data, source=str(path))

    def stage(self, name: str) -> dict[str, Any] | None:
        for stage in self.stages:
            if stage.get("name") == name:
                return stage
        return None
