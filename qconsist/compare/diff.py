"""``diff_runs``: compare two run directories — artifacts, calibration, tensors, final outputs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qconsist.compare.artifacts import compare_artifacts, compare_calibration
from qconsist.compare.elements import OutputStats
from qconsist.compare.loader import load_dump, load_outputs
from qconsist.compare.tensors import TensorComparison, compare_tensors
from qconsist.environment import describe_changes
from qconsist.errors import RunStoreError
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import open_run

log = logging.getLogger(__name__)
SCHEMA = "qconsist.diff/1"


@dataclass
class DiffResult:
    """Where two runs part. ``passed`` (and truth) means identical at every level compared."""

    run_a: str
    run_b: str
    artifacts: dict[str, Any]
    calibration: dict[str, Any]
    tensors: TensorComparison | None
    outputs: dict[str, Any] | None
    options: list[str] = field(default_factory=list)  # execution option differences
    environment: list[str] = field(default_factory=list)
    capture: list[str] = field(default_factory=list)  # commands that capture the missing raw tensors
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.artifacts.get("first_differing_stage") is None
            and not self.calibration.get("changed")
            and not (self.tensors and self.tensors.nodes)
            and not (self.outputs and self.outputs["differing_samples"])
        )

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "run_a": self.run_a, "run_b": self.run_b, "passed": self.passed,
            "artifacts": self.artifacts, "calibration": self.calibration,
            "tensors": self.tensors.to_json() if self.tensors else None, "outputs": self.outputs,
            "options": self.options, "environment": self.environment, "capture": self.capture, "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DiffResult":
        if data.get("schema") != SCHEMA:
            raise RunStoreError(f"diff result schema {data.get('schema')!r} is not {SCHEMA!r}")
        return cls(
            run_a=data["run_a"], run_b=data["run_b"], artifacts=data["artifacts"], calibration=data["calibration"],
            tensors=TensorComparison.from_json(data["tensors"]) if data["tensors"] else None,
            outputs=data["outputs"], options=data["options"], environment=data["environment"],
            capture=data["capture"], notes=data["notes"],
        )


_FLAGS = {
    "ep": "--ep", "graph_optimization_level": "--level", "intra_op_threads": "--threads",
    "deterministic_compute": "--deterministic", "cudnn_conv_algo_search": "--cudnn-conv-algo-search",
    "use_tf32": "--tf32", "cudnn_conv_use_max_workspace": "--cudnn-max-workspace", "device_id": "--device-id",
}


def capture_command(manifest: Manifest, keys: list[str]) -> str:
    """The ``qconsist run`` command that repeats ``manifest``'s run keeping the raw tensors of ``keys``."""
    model = manifest.model
    parts = ["qconsist", "run", model.get("run") or model.get("path", "MODEL")]
    if model.get("run") and model.get("stage"):
        parts += ["--stage", model["stage"]]
    parts += ["--inputs", str(manifest.inputs.get("source", "INPUTS"))]
    for key, value in manifest.sections.get("inference", {}).get("options", {}).items():
        if value is None or key not in _FLAGS:
            continue
        if isinstance(value, bool):
            stem = _FLAGS[key][2:]
            parts.append(f"--{stem}" if value else f"--no-{stem}")
        else:
            parts += [_FLAGS[key], str(value)]
    if manifest.inputs.get("kind") == "images":
        parts += ["--pipeline", "PIPELINE.toml"]
    parts += ["--dump", "--raw", ",".join(keys)]
    return " ".join(parts)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _model_stages(manifest: Manifest) -> list[str]:
    return [s["name"] for s in manifest.stages if isinstance(s.get("artifact"), dict)]


def _same_source(a: Manifest, b: Manifest) -> bool:
    """Two pipelines of one model under different names (e.g. CPU and CUDA calibration of open_nsfw): the
    model's source files are byte-identical."""
    files_a, files_b = a.model.get("files"), b.model.get("files")
    if not isinstance(files_a, dict) or not isinstance(files_b, dict) or not files_a or set(files_a) != set(files_b):
        return False
    return all(
        isinstance(files_a[r], dict) and isinstance(files_b[r], dict) and files_a[r].get("sha256")
        and files_a[r].get("sha256") == files_b[r].get("sha256")
        for r in files_a
    )


def _check_comparable(a: Manifest, b: Manifest, path_a: Path, path_b: Path) -> None:
    name_a, name_b = a.model.get("name"), b.model.get("name")
    if name_a and name_b and name_a != name_b and a.kind == b.kind == "pipeline" and not _same_source(a, b):
        raise RunStoreError(f"runs of different models: {path_a} is {name_a!r}, {path_b} is {name_b!r}")
    if a.kind != b.kind:
        stages_a, stages_b = _model_stages(a), _model_stages(b)
        if not set(stages_a) & set(stages_b):
            raise RunStoreError(
                f"runs share no stage with a model ({', '.join(stages_a)} vs {', '.join(stages_b)}): {path_a} is "
                f"{_a(a.kind)} run and {path_b} {_a(b.kind)} run; run the model from the pipeline's run directory "
                "(qconsist run RUN_DIR) to compare them"
            )
    if a.kind == b.kind == "inference":
        digest_a, digest_b = a.inputs.get("digest"), b.inputs.get("digest")
        if digest_a != digest_b:
            raise RunStoreError(
                f"runs on different input sets ({a.inputs.get('source')} ×{a.inputs.get('count')} vs "
                f"{b.inputs.get('source')} ×{b.inputs.get('count')}: input digests differ); compare runs on the same inputs"
            )


def _outputs(path_a: Path, a: Manifest, path_b: Path, b: Manifest) -> dict[str, Any]:
    stats = OutputStats()
    for sample in range(int(a.sections["inference"]["samples"])):
        stats.add(sample, load_outputs(path_a, a, sample), load_outputs(path_b, b, sample))
    return stats.to_json()


def diff_runs(path_a: Path | str, path_b: Path | str) -> DiffResult:
    """Compare two complete run directories in the order artifacts → calibration → tensors → outputs."""
    path_a, path_b = Path(path_a), Path(path_b)
    a, b = open_run(path_a), open_run(path_b)
    _check_comparable(a, b, path_a, path_b)
    result = DiffResult(
        run_a=str(path_a), run_b=str(path_b),
        artifacts=compare_artifacts(path_a, a, path_b, b),
        calibration=compare_calibration(a, b),
        tensors=None, outputs=None,
        environment=describe_changes(a.environment, b.environment),
    )
    opts_a = a.sections.get("inference", {}).get("options")
    opts_b = b.sections.get("inference", {}).get("options")
    if isinstance(opts_a, dict) and isinstance(opts_b, dict):
        result.options = describe_changes(opts_a, opts_b)
    if a.kind == b.kind == "inference":
        result.outputs = _outputs(path_a, a, path_b, b)
        has_a, has_b = "dump" in a.sections, "dump" in b.sections
        if has_a and has_b:
            dump_a, dump_b = load_dump(path_a, a), load_dump(path_b, b)
            for dump, path in ((dump_a, path_a), (dump_b, path_b)):
                if not dump.faithful:
                    result.notes.append(f"the dump of {path} is NOT faithful: its final outputs differ from production")
            result.tensors = compare_tensors(
                dump_a, dump_b, Path(a.model["path"]) if a.model.get("path") else None,
                Path(b.model["path"]) if b.model.get("path") else None,
            )
            if result.tensors.raw_missing:
                keys = result.tensors.raw_missing
                result.capture = [capture_command(a, keys), capture_command(b, keys)]
        elif has_a or has_b:
            result.notes.append("only one run has a tensor dump; rerun the other with --dump to compare tensors")
        else:
            result.notes.append("no tensor dumps; rerun both with `qconsist run ... --dump` to find the first diverging node")
    elif a.kind != b.kind:
        result.notes.append(f"{_a(a.kind)} run and {_a(b.kind)} run: artifacts and calibration compared")
    return result
