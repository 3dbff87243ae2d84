"""The typed sections of a manifest: what an inference run, a dump, a locate run and a calibration recorded.

Each is a dataclass read once from the manifest by ``qconsist.store.run.Run`` (``run.inference``, ``run.dump``,
``run.locate``, ``run.calibration``), its fields checked where a reader relies on them (a count is a count, a
path a string): a damaged manifest is one line naming the field, never a ``KeyError`` further on. Sections
written by older versions read with the defaults of what they lack.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from qconsist.errors import RunStoreError
from qconsist.store.arrays import FORMAT as OUTPUTS_FORMAT
from qconsist.store.arrays import LEGACY_FORMAT as LEGACY_OUTPUTS
from qconsist.store.fingerprints import RECORD
from qconsist.store.serde import encode, serialized, structure


def _typed(cls: Any, run: str, section: str, data: dict[str, Any]) -> Any:
    """``structure(cls, data)``, a field of the wrong type said in one line."""
    try:
        return structure(cls, data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise RunStoreError(f"run {run}: the manifest's {section} section is damaged ({' '.join(str(exc).split())[:120]})") from None


def _count(run: str, where: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RunStoreError(f"run {run}: the manifest's {where} is {value!r}, not a count")
    return value


@serialized(derived=("top1_share", "top5_share"))
@dataclass
class Accuracy:
    """Top-1 and top-5 accuracy of a class-scores output against the labels (``qconsist.compare.accuracy``):
    ``labelled`` samples, of which ``top1`` / ``top5`` were right (top-5 only with more than 5 classes)."""

    output: str
    classes: int
    labelled: int
    top1: int
    top5: int | None = None

    @property
    def top1_share(self) -> float | None:
        return self.top1 / self.labelled if self.labelled else None

    @property
    def top5_share(self) -> float | None:
        return self.top5 / self.labelled if self.labelled and self.top5 is not None else None

    def figures(self) -> dict[str, float]:
        """The history's figures (``accuracy.top1``, ``accuracy.top5``), those that exist."""
        found = {"accuracy.top1": self.top1_share, "accuracy.top5": self.top5_share}
        return {k: v for k, v in found.items() if v is not None}

    def describe(self) -> str:
        text = f"top-1 {100 * self.top1_share:.2f}%" if self.top1_share is not None else "no labelled sample"
        if self.top5_share is not None:
            text += f", top-5 {100 * self.top5_share:.2f}%"
        return f"{text} ({self.labelled} labelled samples, output {self.output})"


@serialized
@dataclass
class InputMemory:
    """Whether production's inputs were fed from page-locked host memory (``qconsist.inference.pinned``): the input
    workers' ring registered with the CUDA runtime for the whole run (``bytes``), or why not (``note``: "CPU EP",
    no ring, CuPy missing, the driver's refusal). The same bits either way: it changes how fast the inputs reach the
    GPU, never what they are."""

    page_locked: bool = False
    bytes: int = 0
    note: str = ""


@serialized
@dataclass
class InferenceSection:
    """``sections.inference`` of an inference run."""

    options: dict[str, Any] = field(default_factory=dict)
    providers: list[str] = field(default_factory=list)
    samples: int = 0
    batch_size: int = 1
    ms_per_sample: float = 0.0
    outputs: list[str] = field(default_factory=list)
    output_shapes: list[list[int]] = field(default_factory=list)
    output_format: str = LEGACY_OUTPUTS  # qconsist.outputs/1: outputs/<sample>.npz; /2: one file per output
    output_files: list[str] = field(default_factory=list)  # qconsist.outputs/2, in the order of ``outputs``
    accuracy: Accuracy | None = None  # where the inputs had labels and the model one class-scores output
    accuracy_note: str = ""  # why no accuracy was recorded although the inputs had labels
    input_memory: InputMemory | None = None  # page-locked inputs or why not (None: a run written before it was recorded)

    @classmethod
    def read(cls, run: str, data: Any) -> "InferenceSection":
        if not isinstance(data, dict):
            raise RunStoreError(f"run {run}: the manifest has no inference section (a damaged manifest)")
        _count(run, "inference.samples", data.get("samples"))
        names = data.get("outputs")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RunStoreError(f"run {run}: the manifest's inference section lists no outputs (a damaged manifest)")
        section = _typed(cls, run, "inference", {**data, "options": data.get("options") if isinstance(data.get("options"), dict) else {}})
        if section.accuracy is not None and not isinstance(section.accuracy, Accuracy):
            raise RunStoreError(f"run {run}: the manifest's inference.accuracy is damaged")
        if section.output_format not in (OUTPUTS_FORMAT, LEGACY_OUTPUTS):
            raise RunStoreError(f"run {run}: outputs of format {section.output_format!r} are not read by this qconsist")
        if section.output_format == OUTPUTS_FORMAT and len(section.output_files) != len(names):
            raise RunStoreError(f"run {run}: the manifest names {len(section.output_files)} output files for "
                                f"{len(names)} outputs (a damaged manifest)")
        return section


@serialized
@dataclass
class DumpSummary:
    """What a ``--dump`` recorded (the manifest's ``sections.dump``): the faithfulness verdict against
    production, the tensors dumped and where the files are."""

    faithful: bool
    samples_checked: int
    mismatched_samples: list[int]
    max_abs_diff: float
    tensors: int
    ms_per_sample: float
    structure: str
    original_structure: str
    level: str
    raw: dict[str, Any]
    optimized: str = "dump/optimized.onnx"
    index: str = "dump/index.json"
    fingerprints: str = "dump/fingerprints.npy"  # the table: a .npy (format /1), or the folder of format /2
    table_format: str = ""  # "" (written before): qconsist.fingerprints/1
    bytes_per_tensor_per_sample: float = RECORD.itemsize
    fingerprints_in_worker_thread: bool = True
    fingerprints_on: str = "host"  # "device": computed on the GPU (qconsist.inference.device)
    hash_function: str = "qc-mix64/1"
    # seconds per sample in the dump session's parts (device dumps): ORT with every output exposed,
    # the fingerprint kernels, copies of final outputs and raw tensors to the host
    seconds_per_sample: dict[str, float] = field(default_factory=dict)
    # the dump session ran each step beside production's on the same GPU (device dumps since this field): then
    # ``ms_per_sample`` is what the dump cost the run's main thread (its wait for the dump beyond production's
    # step), and production's own time per sample shares the GPU with the dump
    beside_production: bool = False
    # when not faithful: does production itself give other outputs from run to run on the first mismatched
    # sample (distinct outputs in PRODUCTION_REPEATS runs)? Then no dump can match it bit for bit.
    production_distinct: int | None = None

    _REQUIRED = ("index", "fingerprints", "optimized", "structure", "original_structure")

    @classmethod
    def read(cls, run: str, data: Any) -> "DumpSummary":
        if not isinstance(data, dict):
            raise RunStoreError(f"run {run} has no tensor dump; rerun it with `qconsist run ... --dump`")
        for key in cls._REQUIRED:
            if not isinstance(data.get(key), str):
                raise RunStoreError(f"run {run}: the manifest's dump section has no {key!r} (a damaged manifest)")
        section = _typed(cls, run, "dump", data)
        distinct = section.production_distinct
        if distinct is not None and (not isinstance(distinct, int) or isinstance(distinct, bool)):
            raise RunStoreError(f"run {run}: the manifest's dump.production_distinct is {distinct!r}, not a count")
        return section


@dataclass
class LocateSection:
    """``sections.locate`` of a locate run: the verdict and what a reader needs first (``locate.json`` holds
    the report)."""

    passed: bool
    report: str = "locate.json"
    recommendation: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)
    unstable_configs: list[str] = field(default_factory=list)
    fp16_passed: bool | None = None
    calibration_passed: bool | None = None

    @classmethod
    def read(cls, run: str, data: Any) -> "LocateSection":
        if not isinstance(data, dict) or not isinstance(data.get("report", "locate.json"), str):
            raise RunStoreError(f"run {run}: the manifest's locate section is damaged")
        return _typed(cls, run, "locate", {"passed": False, **data})


@dataclass
class CalibrationSection:
    """The manifest's ``calibration``: the table (tensor -> min, max, scale, zero point…), its issues, the
    ranges file and the parameters."""

    table: dict[str, dict[str, Any]] = field(default_factory=dict)
    issues: list[Any] = field(default_factory=list)
    ranges_file: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any) -> "CalibrationSection":
        data = data if isinstance(data, dict) else {}
        return cls(table=dict(data.get("table") or {}), issues=list(data.get("issues") or []),
                   ranges_file=data.get("ranges_file"), params=dict(data.get("params") or {}))


def table_digest(table: dict[str, Any]) -> str:
    """The sha256 of a calibration table's canonical JSON (keys sorted, non-finite numbers as ``serde`` writes them)."""
    text = json.dumps(encode({"table": table}), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
