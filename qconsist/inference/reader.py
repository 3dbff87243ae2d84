"""Read what a run directory holds for comparison: its manifest, dump and final outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.store.serde import loads
from qconsist.errors import RunStoreError
from qconsist.inference.fingerprint import DTYPES, read_table
from qconsist.inference.graphmap import TensorOrigin
from qconsist.store.manifest import Manifest
from qconsist.store.confine import check_npy, check_npz, load_npz
from qconsist.store.rundir import open_run
from qconsist.store.verify import optional_run_file, run_file


@dataclass
class LoadedDump:
    """A run's dump: its tensors (column order), fingerprint table and raw tensors."""

    run_dir: Path
    tensors: list[TensorOrigin]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    table: np.ndarray  # RECORD[samples, tensors], memory-mapped
    structure: str
    original_structure: str
    inputs_digest: str
    optimized_path: Path
    faithful: bool
    manifest: Manifest | None = None
    original_order: bool = True  # relaid tensors recorded in the original's axis order (dumps since layouts)

    def shape(self, sample: int, column: int) -> tuple[int, ...]:
        return self.shapes[int(self.table[sample, column]["shape"])]

    def dtype(self, sample: int, column: int) -> str:
        return DTYPES[int(self.table[sample, column]["dtype"])]

    def raw_file(self, sample: int) -> Path | None:
        """The verified raw-tensor archive of a sample, ``None`` when the run kept none for it."""
        relative = f"dump/raw/{sample:06d}.npz"
        if self.manifest is None:
            path = self.run_dir / relative
            return path if path.is_file() else None
        return optional_run_file(self.run_dir, self.manifest, relative)

    def raw_arrays(self, sample: int, columns: list[int]) -> dict[int, np.ndarray]:
        """The raw tensors of ``columns`` kept for ``sample`` (those not kept are left out)."""
        path = self.raw_file(sample)
        if path is None:
            return {}
        where = f"run {self.run_dir}: dump/raw/{sample:06d}.npz"
        kept = check_npz(path, where)
        keys = [f"t{c}" for c in columns if f"t{c}" in kept]
        arrays = load_npz(path, where, keys)
        return {int(k[1:]): v for k, v in arrays.items()}

    def raw(self, sample: int, column: int) -> np.ndarray | None:
        return self.raw_arrays(sample, [column]).get(column)


def _read_json(path: Path) -> Any:
    try:
        return loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"cannot read {path}: {' '.join(str(exc).split())[:160]}") from None


def _section(run_dir: Path, section: dict[str, Any], key: str) -> str:
    value = section.get(key)
    if not isinstance(value, str):
        raise RunStoreError(f"run {run_dir}: the manifest's dump section has no {key!r} (a damaged manifest)")
    return value


def _index(run_dir: Path, data: Any) -> tuple[list[dict[str, Any]], list[tuple[int, ...]]]:
    """The dump index's tensors and shape table, their structure checked."""
    bad = RunStoreError(f"run {run_dir}: dump/index.json is damaged (tensors and shapes must be lists of records)")
    if not isinstance(data, dict) or not isinstance(data.get("tensors"), list) or not isinstance(data.get("shapes"), list):
        raise bad
    if not all(isinstance(t, dict) and isinstance(t.get("dtype"), str) for t in data["tensors"]):
        raise bad
    shapes = []
    for shape in data["shapes"]:
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise bad
        shapes.append(tuple(shape))
    return data["tensors"], shapes


def load_dump(run_dir: Path, manifest: Manifest | None = None) -> LoadedDump:
    """The dump of a complete inference run made with ``--dump``."""
    run_dir = Path(run_dir)
    manifest = manifest or open_run(run_dir)
    section = manifest.sections.get("dump")
    if not isinstance(section, dict):
        raise RunStoreError(f"run {run_dir} has no tensor dump; rerun it with `qconsist run ... --dump`")
    index_path = run_file(run_dir, manifest, _section(run_dir, section, "index"), "dump index path")
    index = _read_json(index_path)
    records, shapes = _index(run_dir, index)
    table_name = _section(run_dir, section, "fingerprints")
    table_path = run_file(run_dir, manifest, table_name, "dump fingerprints path")
    check_npy(table_path, f"run {run_dir}: {table_name}", ndim=2)  # read_table checks the record type
    try:
        table = read_table(table_path)
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"run {run_dir}: cannot read the dump's fingerprints ({' '.join(str(exc).split())[:200]})") from None
    try:
        tensors = [TensorOrigin.from_json(t) for t in records]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise RunStoreError(f"run {run_dir}: dump/index.json is damaged (a tensor record lacks its fields)") from None
    if table.shape[1] != len(tensors):
        raise RunStoreError(f"run {run_dir}: dump index and fingerprint table disagree ({len(tensors)} vs {table.shape[1]} tensors)")
    if table.size and len(shapes) <= int(table["shape"].max()):
        raise RunStoreError(f"run {run_dir}: the fingerprint table names shape {int(table['shape'].max())}, the index has {len(shapes)}")
    optimized = run_file(run_dir, manifest, _section(run_dir, section, "optimized"), "dump graph path")
    return LoadedDump(
        run_dir=run_dir,
        tensors=tensors,
        dtypes=[t["dtype"] for t in records],
        shapes=shapes,
        table=table,
        structure=_section(run_dir, section, "structure"),
        original_structure=_section(run_dir, section, "original_structure"),
        inputs_digest=str(manifest.inputs.get("digest", "")),
        optimized_path=optimized,
        faithful=bool(section.get("faithful")),
        manifest=manifest,
        original_order=index.get("axis_order") == "original",
    )


def load_outputs(run_dir: Path, manifest: Manifest, sample: int) -> list[np.ndarray]:
    """The final outputs of one sample of an inference run."""
    names = inference_section(run_dir, manifest).get("outputs")
    if not isinstance(names, list):
        raise RunStoreError(f"run {run_dir}: the manifest's inference section lists no outputs (a damaged manifest)")
    relative = f"outputs/{sample:06d}.npz"
    path = run_file(run_dir, manifest, relative, "outputs path")
    arrays = load_npz(path, f"run {run_dir}: {relative}", [f"o{i}" for i in range(len(names))])
    return [arrays[f"o{i}"] for i in range(len(names))]


def inference_section(run_dir: Path, manifest: Manifest) -> dict[str, Any]:
    """The ``inference`` section of an inference run, its sample count checked."""
    section = manifest.sections.get("inference")
    if not isinstance(section, dict):
        raise RunStoreError(f"run {run_dir}: the manifest has no inference section (a damaged manifest)")
    samples = section.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise RunStoreError(f"run {run_dir}: the manifest's inference.samples is {samples!r}, not a count")
    return section
