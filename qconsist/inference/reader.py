"""Read what an inference run holds for comparison: its dump (index, fingerprint table, raw tensors)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.errors import RunStoreError
from qconsist.inference.fingerprint import DTYPES
from qconsist.inference.graphmap import TensorOrigin
from qconsist.store.confine import check_npy, check_npz, load_npz
from qconsist.store.fingerprints import FORMAT as TABLE_FORMAT
from qconsist.store.fingerprints import CompactTable, FingerprintTable, read_legacy
from qconsist.store.run import Run
from qconsist.store.serde import loads


@dataclass
class LoadedDump:
    """A run's dump: its tensors (column order), fingerprint table and raw tensors."""

    run: Run
    tensors: list[TensorOrigin]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    table: FingerprintTable  # samples × tensors, read in blocks or a record at a time
    structure: str
    original_structure: str
    inputs_digest: str
    optimized_path: Path
    faithful: bool
    original_order: bool = True  # relaid tensors recorded in the original's axis order (dumps since layouts)
    nchwc_block: int = 0  # the NCHWc block the run's onnxruntime used (0: none, or a dump written before it was recorded)

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def samples(self) -> int:
        return self.table.samples

    def shape(self, sample: int, column: int) -> tuple[int, ...]:
        return self.shapes[int(self.table.record(sample, column)["shape"])]

    def dtype(self, sample: int, column: int) -> str:
        return DTYPES[int(self.table.record(sample, column)["dtype"])]

    def raw_samples(self) -> set[int]:
        """The samples the run kept raw tensors of (archives ``dump/raw/<sample>.npz`` it holds or recorded: one
        it holds without having recorded it is refused when read)."""
        names = set(self.run.recorded())
        folder = self.run_dir / "dump" / "raw"
        if folder.is_dir() and not folder.is_symlink():
            names |= {f"dump/raw/{name}" for name in os.listdir(folder)}
        found = set()
        for name in names:
            stem = name[len("dump/raw/"):-len(".npz")] if name.startswith("dump/raw/") and name.endswith(".npz") else ""
            if stem.isdigit():
                found.add(int(stem))
        return found

    def raw_file(self, sample: int) -> Path | None:
        """The verified raw-tensor archive of a sample, ``None`` when the run kept none for it."""
        return self.run.optional_file(f"dump/raw/{sample:06d}.npz")

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


def _table(run: Run, index: dict[str, Any], dtypes: list[str], shapes: list[tuple[int, ...]]) -> FingerprintTable:
    """The dump's fingerprint table, either format, its files verified."""
    section = run.dump
    name = section.fingerprints
    if section.table_format == TABLE_FORMAT:
        record = index.get("table")
        if not isinstance(record, dict) or record.get("format") != TABLE_FORMAT:
            raise RunStoreError(f"run {run.path}: dump/index.json does not describe the fingerprint table (damaged)")
        return CompactTable(f"run {run.path}: {name}", lambda member: run.file(f"{name}/{member}", "dump fingerprints path"),
                            dtypes, str(record.get("hash_function")), run.inference.samples, shapes)
    if section.table_format:
        raise RunStoreError(f"run {run.path}: a fingerprint table of format {section.table_format!r} is not read by this qconsist")
    path = run.file(name, "dump fingerprints path")
    check_npy(path, f"run {run.path}: {name}", ndim=2)  # read_legacy checks the record type
    try:
        return read_legacy(path)
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"run {run.path}: cannot read the dump's fingerprints ({' '.join(str(exc).split())[:200]})") from None


def load_dump(run: Run) -> LoadedDump:
    """The dump of a complete inference run made with ``--dump``."""
    section = run.dump
    index = _read_json(run.file(section.index, "dump index path"))
    records, shapes = _index(run.path, index)
    table = _table(run, index, [t["dtype"] for t in records], shapes)
    try:
        tensors = [TensorOrigin.from_json(t) for t in records]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise RunStoreError(f"run {run.path}: dump/index.json is damaged (a tensor record lacks its fields)") from None
    if table.columns != len(tensors):
        raise RunStoreError(f"run {run.path}: dump index and fingerprint table disagree ({len(tensors)} vs {table.columns} tensors)")
    if table.samples and len(shapes) <= table.max_shape():
        raise RunStoreError(f"run {run.path}: the fingerprint table names shape {table.max_shape()}, the index has {len(shapes)}")
    return LoadedDump(
        run=run,
        tensors=tensors,
        dtypes=[t["dtype"] for t in records],
        shapes=shapes,
        table=table,
        structure=section.structure,
        original_structure=section.original_structure,
        inputs_digest=str(run.manifest.inputs.get("digest", "")),
        optimized_path=run.file(section.optimized, "dump graph path"),
        faithful=bool(section.faithful),
        original_order=index.get("axis_order") == "original",
        nchwc_block=_block(run.path, index.get("nchwc_block", 0)),
    )


def _block(run_dir: Path, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1024:
        raise RunStoreError(f"run {run_dir}: dump/index.json is damaged (nchwc_block {value!r} is not a block size)")
    return value
