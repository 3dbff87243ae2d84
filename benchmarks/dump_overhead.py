"""Dump overhead on open_nsfw QDQ (CPU, batch 1): plain inference vs full fingerprint dump, side by side.

Usage: .venv/bin/python benchmarks/dump_overhead.py QDQ_MODEL.onnx INPUTS.npy [SAMPLES]
Prints ms per sample of the production session, of the dump session with fingerprints, of a whole
`--dump` run (dump + production check), peak RSS for 8 vs SAMPLES samples, and bytes per tensor per sample.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def child(model: str, inputs: str, count: int, dump: bool) -> None:
    from qconsist.inference import ExecutionOptions, RunRequest, resolve_model, run_inference
    from qconsist.inputs import open_input_set

    source = resolve_model(model)
    from qconsist.inference.model import input_specs

    base = open_input_set(inputs, None, input_specs(source.path)[0].name)
    reps = -(-count // len(base))
    from qconsist.inputs.inputset import InputSet

    names = [f"{i:06d}" for i in range(count)]
    inp = InputSet(inputs, "arrays", names, lambda i: base.sample(i % len(base)))
    with tempfile.TemporaryDirectory() as runs:
        start = time.perf_counter()
        r = run_inference(source, inp, RunRequest(ExecutionOptions(), dump=dump), Path(runs))
        wall = time.perf_counter() - start
        size = (r.run_dir / "dump" / "fingerprints.npy").stat().st_size if dump else 0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        d = r.dump or {}
        print(f"samples={count} dump={dump} wall={wall:.2f}s prod_ms={r.ms_per_sample:.2f} "
              f"dump_ms={d.get('ms_per_sample', 0):.2f} tensors={d.get('tensors', 0)} faithful={d.get('faithful')} "
              f"table_bytes={size} peak_rss_mb={peak:.0f}", flush=True)


def main() -> None:
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")
        return
    model, inputs = sys.argv[1], sys.argv[2]
    many = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    for count, dump in ((many, False), (many, True), (8, True)):
        subprocess.run([sys.executable, __file__, "--child", model, inputs, str(count), "1" if dump else "0"], check=True)


if __name__ == "__main__":
    main()
