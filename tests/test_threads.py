"""Recorded figures do not change with the machine's thread counts (``qconsist/threads.py``).

Each side runs in its own process, since BLAS reads its thread count when numpy is imported: one with one
thread everywhere, one with several BLAS threads and onnxruntime's default intra-op count made 4 (what a
4-core machine gets: ``SessionOptions`` as onnxruntime creates them, for every session that does not set a
count). Where the CPU has AVX2, both force OpenBLAS's Haswell kernel (what AVX2-only and AMD machines run),
whose threaded GEMM rounds otherwise: the machine of issue 22. A control in each process computes the same
things unpinned and shows that the two environments really do change them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

HARNESS = r'''
import hashlib, json, sys
import numpy as np
import onnxruntime as ort

default_threads = int(sys.argv.pop(1))


class SessionOptions(ort.SessionOptions):  # onnxruntime's default intra-op count, as on a machine with that many cores
    def __init__(self):
        super().__init__()
        self.intra_op_num_threads = default_threads


ort.SessionOptions = SessionOptions
runs = sys.argv.pop(1)  # the runs folder: the pipeline runs there first, then the control
from qconsist.cli import main

sys.argv[1:1] = ["pipeline", "run"]
sys.argv += ["--runs-dir", runs, "--run-id", "run", "--json"]
try:
    main()
except SystemExit as exit:
    if exit.code:
        raise

import onnx
from threadpoolctl import threadpool_info
from qconsist.inference.session import ExecutionOptions, OptimizationLevel, create_session
from qconsist.models.registry import fetch_model
from qconsist.stages.caffe import reference
from qconsist.stages.caffe.fidelity import seeded_inputs
from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt


def md5(arrays):
    return hashlib.md5(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


files = fetch_model("open_nsfw")
net = read_prototxt(files["prototxt"])
params = reference.weights_by_layer(read_caffemodel(files["caffemodel"]))
inputs = seeded_inputs(net)
model = onnx.load(f"{runs}/run/convert/model.onnx")
model.graph.output.extend(onnx.ValueInfoProto(name=out) for node in model.graph.node for out in node.output)
unpinned = create_session(model.SerializeToString(), ExecutionOptions(graph_optimization_level=OptimizationLevel.DISABLE))
print("CONTROL", json.dumps({
    "blas": sorted((i["internal_api"], i["num_threads"], i.get("architecture")) for i in threadpool_info() if i["user_api"] == "blas"),
    "reference": md5(reference._forward(net, params, inputs, np.float32, True).values()),  # without one_blas_thread
    "onnxruntime": md5(unpinned.run(None, {unpinned.get_inputs()[0].name: inputs["data"]})),
}))
'''


def _avx2() -> bool:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return "avx2" in flags and "fma" in flags


HASWELL = _avx2()
MANY = max(2, os.cpu_count() or 1)
SIDES = {  # onnxruntime's default intra-op threads, BLAS / OpenMP threads
    "one": (1, "1"),
    "many": (4, str(MANY)),
}


def _run(side: str, pipeline: Path, runs: Path) -> dict:
    """``qconsist pipeline run`` into ``runs/run`` on ``side``, then the control in the same process."""
    ort_threads, blas_threads = SIDES[side]
    env = {**os.environ, "OMP_NUM_THREADS": blas_threads, "OPENBLAS_NUM_THREADS": blas_threads, "MKL_NUM_THREADS": blas_threads}
    if HASWELL:
        env["OPENBLAS_CORETYPE"] = "Haswell"
    done = subprocess.run([sys.executable, "-c", HARNESS, str(ort_threads), str(runs), str(pipeline)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.rpartition("CONTROL ")[2])


def _recorded(run: Path) -> dict:
    """A run's manifest without what says when, where and in which environment it ran."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if not k.endswith("seconds") and k not in ("started", "finished", "run_id", "command", "environment")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value.replace(str(run.parent), "RUNS") if isinstance(value, str) else value

    return strip(json.loads((run / "manifest.json").read_text()))


@pytest.fixture(scope="module")
def pipeline_file(tmp_path_factory) -> Path:
    """pipelines/open_nsfw.toml with fewer inputs (4 to calibrate, twice; 3 to evaluate)."""
    text = (REPO / "pipelines" / "open_nsfw.toml").read_text()
    for old, new in (("count = 12", "count = 4"), ("repeat = 3", "repeat = 2"), ("count = 9", "count = 3")):
        assert old in text
        text = text.replace(old, new)
    path = tmp_path_factory.mktemp("threads") / "open_nsfw.toml"
    path.write_text(text)
    return path


def test_a_pipeline_run_records_the_same_figures_and_bytes_on_one_thread_and_many(pipeline_file, tmp_path):
    controls = {side: _run(side, pipeline_file, tmp_path / side) for side in SIDES}
    runs = {side: tmp_path / side / "run" for side in SIDES}
    one, many = (_recorded(runs[side]) for side in SIDES)
    assert one["files"] == many["files"]  # every file, byte for byte: models, calibration ranges
    assert one == many  # every figure: the Caffe reference check, the stage checks, the calibration table, hashes
    assert one["stages"][0]["checks"]["caffe_reference"]["max_abs"] < 1e-6
    assert one["stages"][2]["params"]["ort_arguments"]["calibration_session"]["intra_op_threads"] == 1
    environments = [json.loads((runs[side] / "manifest.json").read_text())["environment"]["env"] for side in SIDES]
    assert [e["OPENBLAS_NUM_THREADS"] for e in environments] == ["1", str(MANY)]

    # the control: unpinned, the same computations differ between the two processes
    assert [threads for _, threads, _ in controls["one"]["blas"]] == [1]
    assert all(threads >= 2 for _, threads, _ in controls["many"]["blas"])
    assert controls["one"]["onnxruntime"] != controls["many"]["onnxruntime"]
    if HASWELL:
        assert [kernel for _, _, kernel in controls["one"]["blas"]] == ["Haswell"]
        assert controls["one"]["reference"] != controls["many"]["reference"]
