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
from qconsist.store.rundir import open_run


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

    def shape(self, sample: int, column: int) -> tuple[int, ...]:
        return self.shapes[int(self.table[sample, column]["shape"])]

    def dtype(self, sample: int, column: int) -> str:
        return DTYPES[int(self.table[sample, column]["dtype"])]

    def raw(self, sample: int, column: int) -> np.ndarray | None:
        path = self.run_dir / "dump" / "raw" / f"{sample:06d}.npz"
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as archive:
            key = f"t{column}"
            return archive[key] if key in archive.files else None


def _read_json(path: Path) -> Any:
    try:
        return loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"cannot read {path}: {exc}") from None


def load_dump(run_dir: Path, manifest: Manifest | None = None) -> LoadedDump:
    """The dump of a complete inference run made with ``--dump``."""
    run_dir = Path(run_dir)
    manifest = manifest or open_run(run_dir)
    section = manifest.sections.get("dump")
    if not isinstance(section, dict):
        raise RunStoreError(f"run {run_dir} has no tensor dump; rerun it with `qconsist run ... --dump`")
    index = _read_json(run_dir / section["index"])
    try:
        table = read_table(run_dir / section["fingerprints"])
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"run {run_dir}: cannot read the dump's fingerprints ({exc})") from None
    tensors = [TensorOrigin.from_json(t) for t in index["tensors"]]
    if table.shape[1] != len(tensors):
        raise RunStoreError(f"run {run_dir}: dump index and fingerprint table disagree ({len(tensors)} vs {table.shape[1]} tensors)")
    return LoadedDump(
        run_dir=run_dir,
        tensors=tensors,
        dtypes=[t["dtype"] for t in index["tensors"]],
        shapes=[tuple(s) for s in index["shapes"]],
        table=table,
        structure=section["structure"],
        original_structure=section["original_structure"],
        inputs_digest=manifest.inputs.get("digest", ""),
        optimized_path=run_dir / section["optimized"],
        faithful=bool(section.get("faithful")),
    )


def load_outputs(run_dir: Path, manifest: Manifest, sample: int) -> list[np.ndarray]:
    """The final outputs of one sample of an inference run."""
    names = manifest.sections["inference"]["outputs"]
    path = Path(run_dir) / "outputs" / f"{sample:06d}.npz"
    try:
        with np.load(path, allow_pickle=False) as archive:
            return [archive[f"o{i}"] for i in range(len(names))]
    except (OSError, KeyError, ValueError) as exc:
        raise RunStoreError(f"cannot read outputs of sample {sample} in {run_dir}: {exc}") from None
