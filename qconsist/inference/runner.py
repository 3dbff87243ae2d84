"""``qconsist run``: inference of a model on an input set, written to a run directory of kind ``inference``.

Files written (besides ``manifest.json``)::

    outputs/fingerprints.npy   RECORD[samples, outputs] of the production session's final outputs
    outputs/<sample>.npz       the final outputs of each sample (keys o<index>, order of sections.inference.outputs)
    dump/...                   with --dump (see qconsist.inference.dump)
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx

from qconsist.environment import fingerprint as environment_fingerprint
from qconsist.errors import ConfigError, InputError
from qconsist.inference import dump as dump_module
from qconsist.inference.dump import DumpPlan, DumpRecorder, RawMode, RawSelection, plan_dump, save_npz, select_raw
from qconsist.inference.fingerprint import RECORD, FingerprintTable
from qconsist.inference.graphmap import structure_hash
from qconsist.inference.model import ModelSource
from qconsist.inference.session import ExecutionOptions, create_session
from qconsist.inputs.inputset import InputSet
from qconsist.progress import NULL_PROGRESS, Progress
from qconsist.store.hashing import hash_artifact
from qconsist.store.manifest import Manifest
from qconsist.store.rundir import RunDirectory

log = logging.getLogger(__name__)
KIND = "inference"


@dataclass(frozen=True)
class RunRequest:
    options: ExecutionOptions = field(default_factory=ExecutionOptions)
    dump: bool = False
    raw: RawSelection = field(default_factory=RawSelection)
    reference: Path | None = None  # a dump run whose differing tensors --raw auto keeps

    def __post_init__(self) -> None:
        if self.raw.mode is not RawMode.NONE and not self.dump:
            raise ConfigError("--raw needs --dump")
        if self.raw.mode is RawMode.AUTO and self.reference is None:
            raise ConfigError("--raw auto keeps the tensors that differ from a reference dump: give --reference RUN")
        if self.reference is not None and self.raw.mode is not RawMode.AUTO:
            raise ConfigError("--reference is only used with --raw auto")


@dataclass
class InferenceResult:
    run_dir: Path
    run_id: str
    samples: int
    ms_per_sample: float  # production session
    outputs: list[str]
    dump: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        """False when a dump did not reproduce the production outputs bit for bit."""
        return self.dump is None or bool(self.dump["faithful"])

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir), "run_id": self.run_id, "samples": self.samples,
            "ms_per_sample": self.ms_per_sample, "outputs": self.outputs, "dump": self.dump, "passed": self.passed,
        }


class _Reference:
    """The fingerprints of a reference dump, looked up by the key two dumps share."""

    def __init__(self, run_dir: Path, plan: DumpPlan, samples: int) -> None:
        from qconsist.compare.loader import load_dump

        ref = load_dump(run_dir)
        if ref.table.shape[0] != samples:
            raise ConfigError(f"--reference {run_dir} has {ref.table.shape[0]} samples, this run {samples}")
        same_graph = ref.structure == plan.structure
        keys = [t.name if same_graph else t.original for t in plan.tensors]
        ref_keys = {(t.name if same_graph else t.original): i for i, t in enumerate(ref.tensors)}
        self.pairs = [(c, ref_keys[k]) for c, k in enumerate(keys) if k is not None and k in ref_keys]
        self.table = ref.table
        self.digest = ref.inputs_digest
        self.run_dir = run_dir

    def differing(self, sample: int, row: np.ndarray) -> set[int]:
        """Columns of this run's ``row`` whose bytes or type differ from the reference's sample."""
        ref_row = self.table[sample]
        return {
            c for c, r in self.pairs
            if row[c]["hash"] != ref_row[r]["hash"] or row[c]["dtype"] != ref_row[r]["dtype"]
        }


def _digest_update(h: Any, sample: dict[str, np.ndarray]) -> None:
    # Same format as InputSet.digest(), computed while running so the inputs are read once.
    for name in sorted(sample):
        arr = np.ascontiguousarray(sample[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())


def _model_record(source: ModelSource) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    model = onnx.load(str(source.path))
    hashes = hash_artifact(source.path, model=model).to_json()
    hashes["path"] = str(source.path.resolve())
    structure = structure_hash(model)
    record = {**source.describe(), "path": str(source.path.resolve()), "artifact": hashes, "structure": structure}
    if source.stages:
        stages = [dict(s) for s in source.stages]
        for stage in stages:
            artifact = stage.get("artifact")
            if isinstance(artifact, dict) and source.run_dir is not None and not Path(artifact.get("path", "/")).is_absolute():
                stage["artifact"] = {**artifact, "path": str((source.run_dir / artifact["path"]).resolve())}
    else:
        stages = [{"name": "model", "params": {}, "artifact": hashes}]
    return record, stages, structure


def run_inference(
    source: ModelSource,
    inputs: InputSet,
    request: RunRequest,
    runs_root: Path,
    *,
    run_id: str | None = None,
    command: Sequence[str] = (),
    progress: Progress = NULL_PROGRESS,
) -> InferenceResult:
    """Run every sample of ``inputs`` through ``source``'s model as ``request`` says; write a run directory."""
    if len(inputs) == 0:
        raise InputError(f"input set {inputs.source} is empty")
    options = request.options
    label = f"run-{source.describe().get('name') or source.path.stem}"
    with RunDirectory.create(runs_root, label, KIND, run_id) as run:
        model_record, stages, structure = _model_record(source)
        production = create_session(source.path, options)
        output_names = [o.name for o in production.get_outputs()]
        plan = plan_dump(source.path, options, run.file("dump")) if request.dump else None
        reference = _Reference(request.reference, plan, len(inputs)) if plan and request.reference else None
        raw_columns = select_raw(plan, request.raw) if plan else set()
        if plan is not None and request.raw.mode is RawMode.AUTO:
            raw_columns = {plan.column(name) for name in plan.outputs}
        run.mark_progress("inference")
        outputs_table = FingerprintTable(run.file("outputs/fingerprints.npy"), len(inputs), len(output_names))
        digest = hashlib.sha256()
        names = [t.name for t in plan.tensors] if plan else []
        recorder = DumpRecorder(
            FingerprintTable(run.file("dump/fingerprints.npy"), len(inputs), len(plan.tensors)),
            [names.index(n) for n in output_names], raw_columns,
            lambda index: run.file(f"dump/raw/{index:06d}.npz"), reference.differing if reference else None,
        ) if plan else None
        seconds = {"production": 0.0, "dump": 0.0}
        try:
            with progress.task("inference" + (" + dump" if plan else ""), len(inputs)) as task:
                for index, sample in enumerate(inputs):
                    # The dump session runs while the recorder fingerprints the previous sample; the
                    # production session runs alone, so its time per sample is not disturbed by the dump.
                    _digest_update(digest, sample)
                    if recorder is not None:
                        start = time.perf_counter()
                        arrays = plan.session.run(names, sample)  # type: ignore[union-attr]
                        recorder.wait()
                        seconds["dump"] += time.perf_counter() - start
                    start = time.perf_counter()
                    produced = production.run(None, sample)
                    seconds["production"] += time.perf_counter() - start
                    outputs_table.write_row(index, produced)
                    save_npz(run.file(f"outputs/{index:06d}.npz"), {f"o{i}": a for i, a in enumerate(produced)})
                    if recorder is not None:
                        start = time.perf_counter()
                        recorder.submit(index, produced, arrays)
                        seconds["dump"] += time.perf_counter() - start
                    task.advance()
                if recorder is not None:
                    start = time.perf_counter()
                    recorder.wait()
                    seconds["dump"] += time.perf_counter() - start
        finally:
            if recorder is not None:
                recorder.close()
        outputs_table.close()
        inputs_digest = digest.hexdigest()
        if reference is not None and reference.digest != inputs_digest:
            raise InputError(f"--reference {reference.run_dir} ran on other inputs (digest differs); --raw auto needs the same input set")
        samples = len(inputs)
        sections: dict[str, Any] = {
            "inference": {
                "options": options.to_json(),
                "providers": production.get_providers(),
                "samples": samples,
                "ms_per_sample": 1000 * seconds["production"] / samples,
                "outputs": output_names,
                "fingerprints": "outputs/fingerprints.npy",
                "arrays": "outputs/<sample>.npz",
            }
        }
        dump_json = None
        if plan is not None:
            check, dump_table = recorder.check, recorder.table  # type: ignore[union-attr]
            dump_table.close()
            dump_json = {
                **check.to_json(),
                "tensors": len(plan.tensors),
                "ms_per_sample": 1000 * seconds["dump"] / samples,
                "optimized": "dump/optimized.onnx",
                "structure": plan.structure,
                "original_structure": plan.original_structure,
                "level": options.graph_optimization_level.value,
                "index": "dump/index.json",
                "fingerprints": "dump/fingerprints.npy",
                "bytes_per_tensor_per_sample": RECORD.itemsize,
                "raw": {**request.raw.to_json(), "reference": str(request.reference) if request.reference else None,
                        "tensors_saved": recorder.raw_saved, "dir": "dump/raw"},  # type: ignore[union-attr]
                "fingerprints_in_worker_thread": dump_module.OVERLAP,
            }
            index = {
                "schema": "qconsist.dump/1",
                "tensors": [{**t.to_json(), "dtype": d} for t, d in zip(plan.tensors, plan.dtypes)],
                "shapes": dump_table.shapes.to_json(),
                "outputs": plan.outputs,
                "mismatched_samples": check.mismatched,
            }
            run.file("dump/index.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
            sections["dump"] = dump_json
            if not check.faithful:
                log.warning(
                    "dump is NOT faithful: final outputs of %d/%d samples differ from production (max %.3g)",
                    len(check.mismatched), samples, check.max_abs_diff,
                )
        sections["inference"]["output_shapes"] = outputs_table.shapes.to_json()
        manifest = Manifest(
            kind=KIND,
            command=list(command),
            model=model_record,
            inputs={**inputs.describe(), "digest": inputs_digest},
            stages=stages,
            calibration=source.manifest.calibration if source.manifest is not None else {},
            environment=environment_fingerprint(),
            sections=sections,
        )
        path = run.finish(manifest)
    return InferenceResult(path, run.run_id, samples, sections["inference"]["ms_per_sample"], output_names, dump_json)
