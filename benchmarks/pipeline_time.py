"""Convert, optimize and quantize times for open_nsfw (pipelines/open_nsfw.toml), median of N runs each.

    .venv/bin/python benchmarks/pipeline_time.py [-n 5] [--json]

Each stage runs on the previous stage's output, as in the pipeline; each run writes fresh files in a
temporary folder. Timed: the stage call itself (convert: caffe2onnx + repairs + checker, and separately its
Caffe-reference check; optimize: quant_pre_process without the evaluation check; quantize: calibration on
the pipeline's 12 photographs + quantize_static + table, without the evaluation check). The photographs
are decoded inside the calibration, as in the pipeline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from qconsist.models import fetch_model
from qconsist.pipeline.config import load_pipeline
from qconsist.inference.session import create_session as open_session, input_specs
from qconsist.inputs import open_input_set
from qconsist.stages.convert import ConvertOptions, convert_caffe
from qconsist.stages.optimize import optimize_model
from qconsist.stages.quantize import quantize_model

PIPELINE = Path(__file__).resolve().parent.parent / "pipelines" / "open_nsfw.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs per stage (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    config = load_pipeline(PIPELINE)
    files = fetch_model(config.model.source)
    times: dict[str, list[float]] = {
        "convert": [], "convert_without_check": [], "optimize": [], "quantize": [], "quantize_calibration_part": [],
    }
    with tempfile.TemporaryDirectory(prefix="qconsist-bench-") as tmp:
        folder = Path(tmp)
        for i in range(args.n):
            converted, optimized, quantized = folder / f"c{i}.onnx", folder / f"o{i}.onnx", folder / f"q{i}.onnx"
            start = time.perf_counter()
            result = convert_caffe(files["prototxt"], files["caffemodel"], converted, config.convert)
            times["convert"].append(time.perf_counter() - start)
            start = time.perf_counter()
            convert_caffe(files["prototxt"], files["caffemodel"], folder / f"c{i}b.onnx",
                          ConvertOptions(opset=config.convert.opset, check=False))
            times["convert_without_check"].append(time.perf_counter() - start)
            start = time.perf_counter()
            optimize_model(converted, optimized, config.optimize)
            times["optimize"].append(time.perf_counter() - start)
            name = input_specs(open_session(optimized))[0].name
            data = config.calibration.inputs
            inputs = open_input_set(data.data, config.preprocess, name).subset(data.offset, data.count)
            start = time.perf_counter()
            quant = quantize_model(optimized, quantized, inputs, config.quantize, config.calibration.options)
            times["quantize"].append(time.perf_counter() - start)
            times["quantize_calibration_part"].append(quant.calibration_seconds)
            del result
    summary = {
        stage: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "runs": len(v)}
        for stage, v in times.items()
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"open_nsfw, {args.n} runs per stage, calibration on {config.calibration.inputs.count} photographs")
    for stage, row in summary.items():
        print(f"  {stage:<26} median {row['median_s']:.2f} s  (min {row['min_s']:.2f}, max {row['max_s']:.2f})")


if __name__ == "__main__":
    main()
