"""A host dump's table checked against each tensor fingerprinted on its own (tests/inference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from qconsist.inference.fingerprint import RECORD, ShapeTable, fingerprint
from qconsist.store.fingerprints import CompactTable


def assert_records_alone(plan: Any, feeds: list[dict[str, np.ndarray]], run_dir: Path) -> tuple[dict, list[list[np.ndarray]]]:
    """Every row of ``run_dir``'s dump table equals the tensors of a separate ``session.run`` of its sample, each
    fingerprinted alone, byte for byte, and the index's shapes are those met in that order; the index and each
    sample's tensors alone."""
    index = json.loads((run_dir / "dump" / "index.json").read_text())
    table = CompactTable("dump", lambda name: run_dir / "dump" / "table" / name, index["table"]["dtypes"],
                         index["hash_function"], len(feeds), index["shapes"])
    names = [t.name for t in plan.tensors]
    shapes = ShapeTable()
    found = []
    for sample, step in enumerate(feeds):
        alone = plan.to_original(plan.session.run(names, step))
        expected = np.array([fingerprint(np.ascontiguousarray(a), shapes.id(a.shape)) for a in alone], dtype=RECORD)
        assert table.row(sample).tobytes() == expected.tobytes()
        found.append(alone)
    assert [list(s) for s in shapes.shapes] == index["shapes"]
    return index, found
