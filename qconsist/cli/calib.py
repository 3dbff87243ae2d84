"""``qconsist calib repeat``: calibrate N times on the same inputs; do the quantized models agree?"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qconsist.cli.app import app, handles_errors, print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED, ConfigError

calib_app = typer.Typer(help="Calibration: repeat it and compare the quantized models.", no_args_is_help=True)
app.add_typer(calib_app, name="calib")


def render_repeat(result) -> None:  # RepeatResult
    console = stdout_console()
    console.soft_wrap = True
    for run in result.runs:
        console.print(f"  run {run.index}: md5 {run.md5}  ({run.seconds:.2f} s)")
    console.print(result.verdict())
    for difference in result.differences:
        console.print(f"  {difference.line()}")
    for run, names in sorted(result.other_initializers.items()):
        console.print(f"  run {run}: other initializers differ: {', '.join(names)}")


@calib_app.command("repeat")
@handles_errors
def repeat(
    source: Path = typer.Argument(..., help="A pipeline file (.toml) or an ONNX model (.onnx, then --data is required)."),
    n: int = typer.Option(3, "-n", "--runs", min=2, max=100, help="How many calibrations to run and compare."),
    data: Optional[str] = typer.Option(None, "--data", help="ONNX model only: calibration arrays (.npy/.npz, or a folder of .npy)."),
    offset: int = typer.Option(0, "--offset", min=0, help="ONNX model only: first sample of --data to use."),
    count: Optional[int] = typer.Option(None, "--count", min=1, help="ONNX model only: how many samples (default: all)."),
    method: str = typer.Option("MinMax", "--method", help="ONNX model only: MinMax, Entropy, Percentile or Distribution."),
    quant_format: str = typer.Option("QDQ", "--format", help="ONNX model only: QDQ or QOperator."),
    per_channel: bool = typer.Option(False, "--per-channel/--per-tensor", help="ONNX model only: per-channel weights."),
    provider: str = typer.Option("cpu", "--provider", help="ONNX model only: calibration execution provider, cpu or cuda."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run calibration + quantization N times on the same inputs and compare the quantized models' md5.

    Exit 0: all md5s agree; 1: they disagree (the differing tensors, by how much, and their nodes are listed);
    2: error; 3: --provider cuda without the CUDA execution provider.
    """
    from qconsist.pipeline.runner import repeat_from_onnx, repeat_from_pipeline

    progress = progress_for(json_output)
    if source.suffix.lower() == ".toml":
        from qconsist.pipeline.config import load_pipeline

        if data is not None:
            raise ConfigError("--data applies to an ONNX model; a pipeline file declares [calibration] data")
        result = repeat_from_pipeline(load_pipeline(source), n, progress)
    else:
        if data is None:
            raise ConfigError(f"{source} is not a pipeline file (.toml): give --data with the calibration arrays")
        result = repeat_from_onnx(source, _data(data, offset, count), n, *_options(method, quant_format, per_channel, provider), progress=progress)
    if json_output:
        print_json(result.to_json())
    else:
        render_repeat(result)
    if not result.agree:
        raise typer.Exit(EXIT_DIVERGED)


def _data(data: str, offset: int, count: int | None):
    from qconsist.pipeline.config import DataConfig

    return DataConfig(data if data.startswith("package:") else str(Path(data)), offset, count)


def _options(method: str, quant_format: str, per_channel: bool, provider: str):
    from qconsist.pipeline.config import parse_pipeline

    config = parse_pipeline({
        "model": {"onnx": "model.onnx"},
        "calibration": {"data": "unused.npy", "method": method, "provider": provider},
        "quantize": {"format": quant_format, "per_channel": per_channel},
    }, origin="options")
    return config.quantize, config.calibration.options
