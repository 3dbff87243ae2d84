"""`qconsist diff` of two dumps of many samples, made from one real dump: time, disk, and memory against samples.

    python benchmarks/diff_scale.py DUMP_RUN [--counts 5000,50000] [--differ-from 60] [--out DIR]

Tiles DUMP_RUN's fingerprint table (a real `qconsist run ... --dump`) to COUNT samples, every activation's hash
made unique per sample (the weights stay constant, as in a real evaluation), into two runs: A, and B whose
activations differ from column ``--differ-from`` on in every sample (as a change of batch size on the GPU makes
them). The outputs and sample tables are tiled alike and the manifests rehashed. Then it times ``diff_runs(A, B)``
and reports the peak of Python's and numpy's allocations (tracemalloc: the heap, without the memory-mapped
tables' pages, which the kernel may drop) and the disk of a run, per count: a flat peak means the diff streams.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from qconsist.diff import diff_runs
from qconsist.inference.reader import load_dump
from qconsist.store.fingerprints import TableWriter
from qconsist.store.run import Run

TILED = ("dump/table/hashes.npy", "dump/table/stats.npy", "dump/table/starts.npy", "dump/table/events.npy",
         "outputs/o0.npy", "inputs/samples.jsonl")


def _rehash(run: Path, manifest: dict) -> None:
    for relative in TILED:
        blob = (run / relative).read_bytes()
        manifest["files"][relative] = {"sha256": hashlib.sha256(blob).hexdigest(), "md5": hashlib.md5(blob).hexdigest(),
                                       "size": len(blob)}


def tile(source: Path, target: Path, count: int, differ_from: int | None) -> None:
    """``source``'s dump tiled to ``count`` samples in ``target`` (see the module docstring)."""
    dump = load_dump(Run.open(source))
    rows = np.stack([dump.table.row(s) for s in range(dump.samples)])
    shutil.copytree(source, target)
    shutil.rmtree(target / "dump" / "table")
    writer = TableWriter(target / "dump" / "table", count, dump.dtypes)
    writer.shapes.shapes[:] = dump.shapes
    for start in range(0, count, 1000):
        block = rows[np.arange(start, min(start + 1000, count)) % dump.samples].copy()
        varying = block["hash"] != rows[0]["hash"]
        unique = block["hash"] ^ np.arange(start, start + block.shape[0], dtype=np.uint64)[:, None]
        block["hash"] = np.where(varying, unique, block["hash"])
        if differ_from is not None:
            later = np.zeros_like(varying)
            later[:, differ_from:] = varying[:, differ_from:]
            block["hash"] = np.where(later, block["hash"] + np.uint64(1), block["hash"])
        writer.write_block(start, block)
    writer.close()
    outputs = np.load(target / "outputs" / "o0.npy")
    np.save(target / "outputs" / "o0.npy", outputs[np.arange(count) % outputs.shape[0]])
    lines = (target / "inputs" / "samples.jsonl").read_text().splitlines()
    body = [json.loads(line) for line in lines[1:]]
    rows_text = [json.dumps([f"sample{i}", *body[i % len(body)][1:]], separators=(",", ":")) for i in range(count)]
    (target / "inputs" / "samples.jsonl").write_text("\n".join([lines[0], *rows_text]) + "\n")
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["sections"]["inference"]["samples"] = manifest["inputs"]["count"] = count
    manifest["inputs"]["digest"] = "xxh3-128:" + "0" * 32
    _rehash(target, manifest)
    (target / "manifest.json").write_text(json.dumps(manifest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--counts", default="5000,50000")
    parser.add_argument("--differ-from", type=int, default=60)
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    out = options.out or Path(tempfile.mkdtemp(prefix="qconsist-diff-scale-"))
    print("| samples | tensors | disk of a run MB | diff s | heap peak MB | diverging nodes | first |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for count in (int(c) for c in options.counts.split(",")):
        folder = out / str(count)
        shutil.rmtree(folder, ignore_errors=True)
        tile(options.run, folder / "A", count, None)
        tile(options.run, folder / "B", count, options.differ_from)
        tracemalloc.start()
        start = time.perf_counter()
        result = diff_runs(folder / "A", folder / "B")
        wall = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        disk = sum(p.stat().st_size for p in (folder / "A").rglob("*") if p.is_file())
        tensors = result.tensors
        print(f"| {count} | {tensors.compared} | {disk / 1e6:.0f} | {wall:.2f} | {peak / 1e6:.0f} | {len(tensors.nodes)} | "
              f"{tensors.first.label if tensors.first else '-'} |")
    if options.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
