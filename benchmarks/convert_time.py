"""Convert-stage timing on open_nsfw (ResNet-50 1by2, 23 MB caffemodel): median of N conversions without
and with the numpy-reference check, plus the check's parts (numpy reference forward, onnxruntime run).

    .venv/bin/python benchmarks/convert_time.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from qconsist.models import fetch_model
from qconsist.stages.caffe import reference
from qconsist.stages.caffe.fidelity import onnx_session, run_onnx, seeded_inputs
from qconsist.stages.caffe.proto import read_caffemodel, read_prototxt
from qconsist.stages.convert import ConvertOptions, convert_caffe


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def describe(label: str, times: list[float]) -> str:
    return f"{label:<44} median {statistics.median(times):6.3f} s  (min {min(times):.3f}, max {max(times):.3f}, n={len(times)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    files = fetch_model("open_nsfw")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "open_nsfw.onnx"

        def convert(check: bool):
            return convert_caffe(files["prototxt"], files["caffemodel"], out, ConvertOptions(check=check))

        convert(False)  # warm-up: imports, protobuf pool
        without = timed(lambda: convert(False), args.repeat)
        with_check = timed(lambda: convert(True), args.repeat)
        net, weights = read_prototxt(files["prototxt"]), read_caffemodel(files["caffemodel"])
        params = reference.weights_by_layer(weights)
        inputs = seeded_inputs(net)
        forward = timed(lambda: reference.forward(net, params, inputs, dtype=np.float32), args.repeat)
        session = onnx_session(out)
        ort_run = timed(lambda: run_onnx(session, net, inputs), args.repeat)
        check = convert(True).check
    print(describe("convert open_nsfw, check off", without))
    print(describe("convert open_nsfw, check on (default)", with_check))
    print(describe("  numpy reference forward (float32, batch 1)", forward))
    print(describe("  onnxruntime run (CPU, batch 1)", ort_run))
    print(f"check: max abs {check.max_abs:.3g}, max rel {check.max_rel:.3g}, tolerance {check.outputs[0].tolerance:.3g}, "
          f"passed {check.passed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
