"""What measuring on one thread costs (qconsist/threads.py), side by side in one process on open_nsfw: the
Caffe reference's forward pass on one BLAS thread vs on BLAS's own count, and the converted model on one
onnxruntime intra-op thread vs onnxruntime's default; alternated, medians and ratios.

    .venv/bin/python benchmarks/threads_cost.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

from qconsist.inference.session import MEASUREMENT, ExecutionOptions, create_session
from qconsist.models import fetch_model
from qconsist.stages.caffe import reference
from qconsist.stages.caffe.fidelity import run_onnx, seeded_inputs
from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt
from qconsist.stages.convert import ConvertOptions, convert_caffe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    files = fetch_model("open_nsfw")
    net, weights = read_prototxt(files["prototxt"]), read_caffemodel(files["caffemodel"])
    params = reference.weights_by_layer(weights)
    inputs = seeded_inputs(net)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "open_nsfw.onnx"
        convert_caffe(files["prototxt"], files["caffemodel"], model, ConvertOptions(check=False))
        sessions = {"one": create_session(model, MEASUREMENT), "default": create_session(model, ExecutionOptions())}
        cases = {
            "reference, one BLAS thread": lambda: reference.forward(net, params, inputs),
            "reference, BLAS's own count": lambda: reference._forward(net, params, inputs, np.float32, False),
            "onnxruntime, one intra-op thread": lambda: run_onnx(sessions["one"], net, inputs),
            "onnxruntime, its default": lambda: run_onnx(sessions["default"], net, inputs),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, case in cases.items():
                start = time.perf_counter()
                case()
                times[name].append(time.perf_counter() - start)
    blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    print(f"BLAS: {blas}; {args.repeat} runs each, alternated")
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, median in medians.items():
        print(f"{name:<36} median {median * 1e3:8.1f} ms")
    names = list(cases)
    print(f"reference: one thread / own count = {medians[names[0]] / medians[names[1]]:.2f}")
    print(f"onnxruntime: one thread / default = {medians[names[2]] / medians[names[3]]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
