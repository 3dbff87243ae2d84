"""``diff_runs``: compare two run directories — artifacts, calibration, tensors, final outputs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qconsist.compare import OutputEffect, TensorStats
from qconsist.compare.tolerance import Tolerance
from qconsist.diff.artifacts import ArtifactComparison, CalibrationComparison, compare_artifacts, compare_calibration
from qconsist.diff.tensors import TensorComparison, compare_tensors
from qconsist.inference.reader import inference_section, load_dump, load_outputs
from qconsist.inputs.digest import digest_kind, same_inputs
from qconsist.inputs.record import read_samples
from qconsist.inputs.recorded import recorded_subset
from qconsist.environment import EnvironmentDiff, compare_environments, describe_changes
from qconsist.errors import RunStoreError
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import open_run, same_run
from qconsist.store.verify import external_file
from qconsist.store.serde import structure, to_jsonable
from qconsist.inference.engines import EngineRecord
from qconsist.inference.runner import PRODUCTION_REPEATS
from qconsist.inference.session import ExecutionOptions

log = logging.getLogger(__name__)
SCHEMA = "qconsist.diff/1"


@dataclass
class EngineChange:
    """One convolution node's cuDNN kernels in the two runs (each run's recording session: engine per run)."""

    node: str  # the label users know
    op_type: str
    engines_a: list[str]
    engines_b: list[str]
    why_a: str | None = None  # why cuDNN says run A's kernel is not reproducible
    why_b: str | None = None
    origin: bool = False  # an origin node of the tensor comparison

    @property
    def same(self) -> bool:
        return self.engines_a == self.engines_b

    def describe(self) -> str:
        def runs(engines: list[str]) -> str:
            distinct = list(dict.fromkeys(engines))
            return f"{distinct[0]} in all {len(engines)} runs" if len(distinct) == 1 else ", ".join(engines)

        text = f"{self.node} ({self.op_type}): A {runs(self.engines_a)}; B {runs(self.engines_b)}"
        if not self.same:
            text += " — the two runs executed different kernels"
        why = self.why_a or self.why_b
        if why:
            text += f"; {why}" + (" — the same kernel gives different results from run to run" if self.same else "")
        return text


def compare_engines(a: Manifest, b: Manifest, origins: set[str]) -> tuple[list[EngineChange], list[str]]:
    """The convolution nodes whose kernels differ between the runs, are marked non-deterministic, or are
    origins; and notes where only one run recorded its kernels (``qconsist run --engines``)."""
    record_a, record_b = a.sections.get("engines"), b.sections.get("engines")
    if not record_a and not record_b:
        return [], []
    if not record_a or not record_b:
        return [], ["only one run recorded its cuDNN engines; rerun the other with --engines to compare kernels"]
    engines_a, engines_b = EngineRecord.from_json(record_a), EngineRecord.from_json(record_b)
    nodes_b = {n.label: n for n in engines_b.nodes}
    changes = []
    for node in engines_a.nodes:
        other = nodes_b.get(node.label)
        if other is None:
            continue
        change = EngineChange(node.label, node.op_type, list(node.runs), list(other.runs), node.why, other.why,
                              node.label in origins)
        if not change.same or change.why_a or change.why_b or change.origin:
            changes.append(change)
    return changes, []


@dataclass
class DiffResult:
    """Where two runs part. ``passed`` (and truth) means identical at every level compared."""

    run_a: str
    run_b: str
    artifacts: ArtifactComparison
    calibration: CalibrationComparison
    tensors: TensorComparison | None
    outputs: OutputEffect | None
    options: list[str] = field(default_factory=list)  # execution option differences
    environment: list[str] = field(default_factory=list)
    versions: EnvironmentDiff = EnvironmentDiff()  # what changes results: onnxruntime, onnx, numpy, CUDA, cuDNN, driver…
    capture: list[str] = field(default_factory=list)  # commands that capture the missing raw tensors
    notes: list[str] = field(default_factory=list)
    engines: list[EngineChange] = field(default_factory=list)  # cuDNN kernels of conv nodes, when both runs recorded them
    tolerance: Tolerance = field(default_factory=Tolerance)  # exact unless --atol/--rtol or a policy's [diff]
    output_stats: list[TensorStats] = field(default_factory=list)  # with a tolerance: each final output against it
    same_run: bool = False  # A and B are one run (one folder, or a copy of it): identical by construction

    @property
    def passed(self) -> bool:
        """Identical at every level compared; with a tolerance, tensors and final outputs only need to be
        within it (artifacts and calibration stay exact)."""
        if self.tolerance.exact:
            outputs_ok = not (self.outputs and not self.outputs.identical)
        else:
            outputs_ok = all(s.passed for s in self.output_stats)
        return (
            self.artifacts.first_differing_stage is None
            and not self.calibration.changed
            and not (self.tensors and self.tensors.beyond)
            and outputs_ok
        )

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **to_jsonable(self.__dict__), "passed": self.passed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DiffResult":
        if data.get("schema") != SCHEMA:
            raise RunStoreError(f"diff result schema {data.get('schema')!r} is not {SCHEMA!r}")
        return structure(cls, data)


# The ``qconsist run`` flag of each execution option (session fields, then provider options).
_FLAGS = {
    "graph_optimization_level": "--level", "intra_op_threads": "--threads", "deterministic_compute": "--deterministic",
    "cudnn_conv_algo_search": "--cudnn-conv-algo-search", "use_tf32": "--tf32",
    "cudnn_conv_use_max_workspace": "--cudnn-max-workspace", "device_id": "--device-id",
}


def capture_command(manifest: Manifest, keys: list[str] | None, disable: tuple[str, ...] = (),
                    subset: tuple[int, int] | None = None, run_dir: Path | None = None) -> str:
    """The ``qconsist run`` command that repeats ``manifest``'s run with a dump keeping the raw tensors of
    ``keys`` (``None``: no raw tensors), with the graph transformers ``disable`` switched off besides its own,
    on the samples ``subset`` (offset, count) of its input set (default: where the run's samples lie in it,
    when it can be opened again). It runs as printed: paths absolute and shell-quoted, every recorded
    execution option, the batch size, and — for images given to a model file — the run directory ``run_dir``
    itself as the model (``--stage model``), which brings the run's preprocessing."""
    import shlex

    model = manifest.model
    if model.get("run"):
        parts = ["qconsist", "run", str(Path(model["run"]).resolve())]
        if model.get("stage"):
            parts += ["--stage", model["stage"]]
    elif manifest.inputs.get("kind") == "images" and run_dir is not None:
        parts = ["qconsist", "run", str(Path(run_dir).resolve()), "--stage", _model_stages(manifest)[-1]]
    else:
        parts = ["qconsist", "run", model.get("path", "MODEL")]
    source = str(manifest.inputs.get("source", "INPUTS"))
    parts += ["--inputs", source if source.startswith("package:") or not Path(source).exists() else str(Path(source).resolve())]
    recorded = manifest.sections.get("inference", {}).get("options")
    if isinstance(recorded, dict):
        options = ExecutionOptions.from_json(recorded)
        options = replace(options, disabled_optimizers=(*options.disabled_optimizers, *disable)).to_json()
        parts += ["--ep", options["provider"]]
        for key, value in [*options.items(), *options["provider_options"].items()]:
            if key == "disabled_optimizers":
                for name in value:
                    parts += ["--disable-optimizer", name]
                continue
            if value is None or key in ("provider", "provider_options"):
                continue
            if key not in _FLAGS:
                if key in options["provider_options"]:
                    parts += ["--provider-option", f"{key}={value}"]
                continue
            if isinstance(value, bool):
                stem = _FLAGS[key][2:]
                parts.append(f"--{stem}" if value else f"--no-{stem}")
            else:
                parts += [_FLAGS[key], str(value)]
    batch = manifest.sections.get("inference", {}).get("batch_size")
    if isinstance(batch, int) and batch != 1:
        parts += ["--batch-size", str(batch)]
        if model.get("dynamic_batch"):
            parts.append("--dynamic-batch")
    subset = subset if subset is not None else recorded_subset(manifest.inputs)
    if subset is not None:
        parts += ["--offset", str(subset[0]), "--count", str(subset[1])]
    if manifest.inputs.get("kind") == "images" and not model.get("run") and run_dir is None:
        parts += ["--pipeline", "PIPELINE.toml"]
    parts += ["--dump", *(["--raw", ",".join(keys)] if keys is not None else [])]
    return " ".join(shlex.quote(p) for p in parts)


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


def _check_comparable(a: Manifest, b: Manifest, path_a: Path, path_b: Path) -> str | None:
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
        return _check_inputs(a, b, path_a, path_b)
    return None


def _check_inputs(a: Manifest, b: Manifest, path_a: Path, path_b: Path) -> str | None:
    """Refuse two inference runs on different input sets; a note when their digests are of different kinds
    (one run written before qconsist 0.2): their sample names are compared instead."""
    sets = f"{a.inputs.get('source')} ×{a.inputs.get('count')} vs {b.inputs.get('source')} ×{b.inputs.get('count')}"
    digest_a, digest_b = a.inputs.get("digest"), b.inputs.get("digest")
    same = same_inputs(digest_a, digest_b)
    if same or digest_a == digest_b:
        return None
    if same is False:
        raise RunStoreError(f"runs on different input sets ({sets}: input digests differ); compare runs on the same inputs")
    kinds = f"{digest_kind(digest_a) or 'no'} and {digest_kind(digest_b) or 'no'} input digests"
    try:
        names_a, names_b = read_samples(path_a, a, a.inputs).names, read_samples(path_b, b, b.inputs).names
    except RunStoreError:
        return f"the runs record {kinds}: their inputs were not compared"
    if names_a != names_b:
        raise RunStoreError(f"runs on different input sets ({sets}: their sample names differ); compare runs on the same inputs")
    return (f"the runs record {kinds} (one was written before qconsist 0.2): their {len(names_a)} sample names agree, "
            "their bytes were not compared")


def _original(run_dir: Path, manifest: Manifest) -> Path | None:
    """The model an inference run ran (outside the run: verified against its recorded size and sha256)."""
    record = manifest.model.get("artifact")
    if not isinstance(record, dict) or not manifest.model.get("path"):
        return None
    return external_file(run_dir, {**record, "path": manifest.model.get("path")}, "model path")


def _outputs(path_a: Path, a: Manifest, path_b: Path, b: Manifest,
             tolerance: Tolerance) -> tuple[OutputEffect, list[TensorStats]]:
    effect = OutputEffect()
    names = [str(n) for n in inference_section(path_a, a).get("outputs") or []]
    stats = [TensorStats(name, *tolerance.for_node(name)) for name in names] if not tolerance.exact else []
    samples = inference_section(path_a, a)["samples"]
    if inference_section(path_b, b)["samples"] != samples:
        raise RunStoreError(f"the runs hold {samples} and {inference_section(path_b, b)['samples']} samples; "
                            "compare runs on the same input set")
    for step in range(samples):
        outputs_a, outputs_b = load_outputs(path_a, a, step), load_outputs(path_b, b, step)
        for stat, x, y in zip(stats, outputs_a, outputs_b):
            stat.add(step, x, y)
        effect.add(effect.samples, outputs_a, outputs_b)
    return effect, stats


def diff_runs(path_a: Path | str, path_b: Path | str, tolerance: Tolerance = Tolerance()) -> DiffResult:
    """Compare two complete run directories in the order artifacts → calibration → tensors → outputs.

    ``tolerance`` (default exact): tensors and final outputs are judged against ``atol + rtol·|a|`` (per
    node where it says so) instead of bit for bit."""
    path_a, path_b = Path(path_a), Path(path_b)
    a, b = open_run(path_a), open_run(path_b)
    inputs_note = _check_comparable(a, b, path_a, path_b)
    result = DiffResult(
        run_a=str(path_a), run_b=str(path_b), same_run=same_run(path_a, a, path_b, b),
        artifacts=compare_artifacts(path_a, a, path_b, b),
        calibration=compare_calibration(a, b),
        tensors=None, outputs=None,
        environment=describe_changes(a.environment, b.environment),
        versions=compare_environments(a.environment, b.environment),
        tolerance=tolerance,
    )
    if inputs_note:
        result.notes.append(inputs_note)
    opts_a = a.sections.get("inference", {}).get("options")
    opts_b = b.sections.get("inference", {}).get("options")
    if isinstance(opts_a, dict) and isinstance(opts_b, dict):
        result.options = describe_changes(opts_a, opts_b)
    if a.kind == b.kind == "inference":
        result.outputs, result.output_stats = _outputs(path_a, a, path_b, b, tolerance)
        has_a, has_b = "dump" in a.sections, "dump" in b.sections
        if has_a and has_b:
            dump_a, dump_b = load_dump(path_a, a), load_dump(path_b, b)
            for dump, path, manifest in ((dump_a, path_a, a), (dump_b, path_b, b)):
                if not dump.faithful:
                    distinct = manifest.sections["dump"].get("production_distinct") or 0
                    result.notes.append(
                        f"the final outputs of {path}'s dump differ from production, whose own outputs vary from run "
                        f"to run ({distinct} distinct in {PRODUCTION_REPEATS} runs): a non-deterministic kernel" if distinct > 1 else
                        f"the dump of {path} is NOT faithful: its final outputs differ from production")
            same_graph = dump_a.structure == dump_b.structure  # else the original models are compared: verified then
            result.tensors = compare_tensors(dump_a, dump_b, None if same_graph else _original(path_a, a),
                                             None if same_graph else _original(path_b, b), tolerance)
            if result.tensors.raw_missing:
                keys = result.tensors.raw_missing
                result.capture = [capture_command(a, keys, run_dir=path_a), capture_command(b, keys, run_dir=path_b)]
        elif has_a or has_b:
            result.notes.append("only one run has a tensor dump; rerun the other with --dump to compare tensors")
        else:
            result.notes.append("no tensor dumps; rerun both with `qconsist run ... --dump` to find the first diverging node")
    elif a.kind != b.kind:
        result.notes.append(f"{_a(a.kind)} run and {_a(b.kind)} run: artifacts and calibration compared")
    origins = {n.label for n in result.tensors.origins} if result.tensors is not None else set()
    result.engines, notes = compare_engines(a, b, origins)
    result.notes += notes
    if result.same_run:
        result.notes.insert(0, f"A and B are the same run ({a.run_id}): a run compared with itself is identical by "
                               "construction; compare two runs to learn something")
    return result
