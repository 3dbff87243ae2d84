"""The sample table of a run: every sample's name, digest, file digest and label, in a file beside the manifest.

A manifest records an input set in a few keys (``InputSet.describe``: source, count, offset, preprocessing,
the labels' summary) plus its ``digest`` and ``samples``, the run-relative path of this table, so that a set of
50,000 samples does not make the manifest grow; the table is listed in the manifest's ``files`` map like every
file of the run, and read back verified (``read_samples``).

Format (``qconsist.samples/1``), JSON Lines: a header object ``{"schema", "digest", "columns", "classes"}``, then
one array per sample, ``[name, digest, file, label]``: its name (JSON-escaped: a file name that is not UTF-8
keeps its bytes as ``\\udcXX`` escapes, Python's surrogate escapes), the hex of its 16-byte digest
(``digest`` names the kind, ``qconsist.inputs.digest``), the hex of its file's digest or ``null``, its class
index or ``null``.

Manifests written before the table (qconsist 0.1) list the sample names in ``inputs.names`` and hold no
labels: ``read_samples`` reads both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from qconsist.errors import RunStoreError
from qconsist.inputs.digest import XXH3, set_digest
from qconsist.inputs.inputset import InputSet
from qconsist.inputs.stream import SampleInfo
from qconsist.store.atomic import write_bytes_atomic
from qconsist.store.run import Run
from qconsist.store.serde import loads

SCHEMA = "qconsist.samples/1"
SAMPLES_FILE = "inputs/samples.jsonl"  # the sample table of a run of one input set (inference, locate)
COLUMNS = ["name", "digest", "file", "label"]


@dataclass
class SampleTable:
    """A run's samples, in order: names, digests (hex, of ``kind``), file digests and labels (``None`` where
    absent), and the class names by index where known."""

    names: list[str]
    digests: list[str] = field(default_factory=list)
    files: list[str | None] = field(default_factory=list)
    labels: list[int | None] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    kind: str = XXH3

    def labelled(self) -> dict[str, int]:
        """Class indices by sample name, for the samples that have one."""
        return {n: label for n, label in zip(self.names, self.labels) if label is not None}


def record_inputs(inputs: InputSet, infos: Sequence[SampleInfo], path: Path, relative: str) -> dict[str, Any]:
    """Write the sample table of ``inputs`` (prepared as ``infos`` say) to ``path`` and return the manifest's
    record of the set: its description, ``digest`` and ``samples`` (``relative``, the table's run path)."""
    if len(infos) != len(inputs):
        raise ValueError(f"{len(infos)} sample infos for {len(inputs)} samples")
    labels = inputs.labels.of(inputs.names) if inputs.labels is not None else [None] * len(inputs)
    digest = set_digest(info.digest for info in infos)
    header = {"schema": SCHEMA, "digest": XXH3, "columns": COLUMNS,
              "classes": list(inputs.labels.classes) if inputs.labels is not None else []}
    lines = [json.dumps(header)]
    lines += [json.dumps([name, info.digest.hex(), info.file.hex() if info.file is not None else None, label],
                         separators=(",", ":"))
              for name, info, label in zip(inputs.names, infos, labels)]
    write_bytes_atomic(path, ("\n".join(lines) + "\n").encode("ascii"))
    return {**inputs.describe(infos), "digest": digest, "samples": relative}


def read_samples(run: Run, recorded: dict[str, Any] | None = None) -> SampleTable:
    """The sample table of ``recorded`` (a manifest's record of an input set; default the run's own), verified;
    the names alone for a run written before the table."""
    recorded = run.manifest.inputs if recorded is None else recorded
    run_dir = run.path
    relative = recorded.get("samples")
    if relative is None:
        names = recorded.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RunStoreError(f"run {run_dir} does not record the names of its samples")
        return SampleTable(list(names), kind="sha256")
    if not isinstance(relative, str):
        raise RunStoreError(f"run {run_dir}: the manifest's sample table path is {relative!r}, not a path")
    path = run.file(relative, "sample table path")
    bad = RunStoreError(f"run {run_dir}: {relative} is damaged (not a {SCHEMA} table)")
    try:
        lines = path.read_text(encoding="ascii").splitlines()
        header, rows = loads(lines[0]), [loads(line) for line in lines[1:]]
    except (OSError, ValueError, IndexError):
        raise bad from None
    if not isinstance(header, dict) or header.get("schema") != SCHEMA or header.get("columns") != COLUMNS:
        raise bad
    if not all(isinstance(r, list) and len(r) == 4 and isinstance(r[0], str) and isinstance(r[1], str) for r in rows):
        raise bad
    if len(rows) != recorded.get("count", len(rows)):
        raise RunStoreError(f"run {run_dir}: {relative} holds {len(rows)} samples, the manifest {recorded.get('count')}")
    classes = header.get("classes") if isinstance(header.get("classes"), list) else []
    return SampleTable([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                       [str(c) for c in classes], str(header.get("digest")))
