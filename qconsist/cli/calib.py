"""``qconsist calib repeat``: calibrate N times on the same inputs; do the quantized models agree?"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED, ConfigError

calib_app = typer.Typer(help="Calibration: repeat it and compare the quantized models.", no_args_is_help=True)


def render_repeat(result) -> None:  # RepeatResult
    console = stdout_console()
    for run in result.runs:
        console.print(f"  run {run.index}: md5 {run.md5}  ({run.seconds:.2f} s)")
    console.print(result.verdict())
    if result.producers is not None:
        console.print(f"  producers: {result.producers.evidence()}")
        for found in result.producers.varying:
            console.print(f"  varies between runs: '{found.tensor}' from {found.producer} ({found.op_type}), in "
                          f"{found.samples}/{result.producers.samples} steps; origin {', '.join(found.origins)}")
    for difference in result.differences:
        console.print(f"  {difference.line()}")
    for run, names in sorted(result.other_initializers.items()):
        console.print(f"  run {run}: other initializers differ: {', '.join(names)}")
    if result.passed:
        console.print(f"PASS: {len(result.runs)} calibrations agree")
    elif result.by_chance:
        console.print(f"FAIL: {len(result.runs)} calibrations agree by chance: a calibrated tensor's producer varies between runs")
    else:
        console.print(f"FAIL: {len(result.runs)} calibrations disagree")


def repeat(
    source: Path = typer.Argument(..., parser=opt.read_path, help="A pipeline file (.toml) or an ONNX model (.onnx, then --inputs is required)."),
    repeats: opt.told(opt.Repeats, "How many times the work is repeated and compared: calibrations (default 3).") = 3,
    inputs: Optional[str] = typer.Option(None, "--inputs", help=opt.INPUTS_HELP),
    pipeline: opt.told(opt.PipelineFile, more="With an ONNX model: the images of --inputs.") = None,
    offset: opt.Offset = 0,
    count: opt.Count = None,
    method: str = typer.Option("MinMax", "--method", help="ONNX model only: MinMax, Entropy, Percentile or Distribution."),
    quant_format: str = typer.Option("QDQ", "--format", help="ONNX model only: QDQ or QOperator."),
    per_channel: bool = typer.Option(False, "--per-channel/--per-tensor", help="ONNX model only: per-channel weights."),
    ep: opt.Ep = "cpu",
    batch_size: opt.BatchSize = 1,
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Run calibration + quantization N times on the same inputs and compare the quantized models' md5.

    With --isa native,haswell: calibrate once per instruction set instead (the emulated ones under QEMU user
    mode, on the same prepared samples) and say whether the quantized md5 depends on the calibrating machine,
    and which calibration tensors differ when it does.

    On a GPU execution provider the calibrated tensors' producers are also run again (each calibration
    sample 3 times in one session): a tensor that varies makes an agreement luck, and the verdict says so.

    Exit 0: all md5s agree; 1: they disagree (the differing tensors, by how much, and their nodes are listed),
    or they agree while a calibrated tensor's producer varies between runs; 2: error; 3: --ep cuda without the
    CUDA execution provider, or --isa without QEMU.
    """
    from qconsist.pipeline.runner import repeat_from_onnx, repeat_from_pipeline

    if not 2 <= repeats <= 100:
        raise ConfigError(f"`repeats` must be between 2 and 100, got {repeats}")
    if offset < 0 or (count is not None and count < 1):
        raise ConfigError(f"`offset` must be >= 0 and `count` >= 1, got {offset} and {count}")
    progress = progress_for(json_output)
    if isa is not None:
        _across(source, isa, inputs, offset, count, method, quant_format, per_channel, ep, batch_size, json_output)
        return
    if source.suffix.lower() == ".toml":
        from qconsist.pipeline.config import load_pipeline

        if inputs is not None or batch_size != 1 or pipeline is not None:
            raise ConfigError("`inputs`, `pipeline` and `batch_size` apply to an ONNX model; a pipeline file declares "
                              "[calibration] data and batch_size")
        result = repeat_from_pipeline(load_pipeline(source), repeats, progress)
    else:
        if inputs is None:
            raise ConfigError(f"{source} is not a pipeline file (.toml): give `inputs` with the calibration arrays")
        preprocess = None
        if pipeline is not None:
            from qconsist.pipeline.config import load_pipeline

            preprocess = load_pipeline(pipeline).preprocess
            if preprocess is None:
                raise ConfigError(f"pipeline file {pipeline} declares no [preprocess]: nothing prepares the images")
        result = repeat_from_onnx(source, _data(inputs, offset, count), repeats,
                                  *_options(method, quant_format, per_channel, ep, batch_size), progress=progress,
                                  preprocess=preprocess)
    if json_output:
        print_json(result)
    else:
        render_repeat(result)
    if not result.passed:
        raise typer.Exit(EXIT_DIVERGED)


def _across(source: Path, isa: str, inputs: str | None, offset: int, count: int | None, method: str,
            quant_format: str, per_channel: bool, ep: str, batch_size: int, json_output: bool) -> None:
    """``calib repeat --isa``: one calibration per instruction set."""
    from qconsist.emulation import parse_models
    from qconsist.pipeline.isa import across_from_onnx, across_from_pipeline

    isas = parse_models(isa)
    if len(isas) < 2:
        raise ConfigError(f"`isa` names {len(isas)} instruction set: give two or more, e.g. native,haswell")
    if ep != "cpu":
        raise ConfigError("`isa` compares the CPU's instruction sets: calibration runs on `ep` cpu")
    progress = progress_for(json_output)
    if not json_output:
        from qconsist.cli.app import stderr_console

        stderr_console().print(f"calibrating on {', '.join(isas)}: the emulated ones run under QEMU user mode, "
                               "which is slow (each one's time is measured and shown)")
    if source.suffix.lower() == ".toml":
        from qconsist.pipeline.config import load_pipeline

        if inputs is not None or batch_size != 1:
            raise ConfigError("`inputs` and `batch_size` apply to an ONNX model; a pipeline file declares "
                              "[calibration] data and batch_size")
        result = across_from_pipeline(load_pipeline(source), isas, progress)
    else:
        if inputs is None:
            raise ConfigError(f"{source} is not a pipeline file (.toml): give `inputs` with the calibration arrays")
        result = across_from_onnx(source, _data(inputs, offset, count), isas,
                                  *_options(method, quant_format, per_channel, ep, batch_size), progress=progress)
    if json_output:
        print_json(result)
    else:
        console = stdout_console()
        for run in result.runs:
            console.print(f"  {run.isa}: {run.kernels}, float {run.float_kernels}: md5 {run.md5}  ({run.seconds:.2f} s)")
        console.print(result.verdict())
        for difference in result.differences:
            console.print(f"  {difference.line().replace(f'run {difference.run}:', result.runs[difference.run - 1].isa + ':', 1)}")
        for name, names in sorted(result.other_initializers.items()):
            console.print(f"  {name}: other initializers differ: {', '.join(names)}")
    if not result.agree:
        raise typer.Exit(EXIT_DIVERGED)


def _data(data: str, offset: int, count: int | None):
    from qconsist.pipeline.config import DataConfig

    return DataConfig(data if data.startswith("package:") else str(Path(data)), offset, count)


def _options(method: str, quant_format: str, per_channel: bool, provider: str, batch_size: int = 1):
    from qconsist.pipeline.config import parse_pipeline

    config = parse_pipeline({
        "model": {"onnx": "model.onnx"},
        "calibration": {"data": "unused.npy", "method": method, "provider": provider, "batch_size": batch_size},
        "quantize": {"format": quant_format, "per_channel": per_channel},
    }, origin="options")
    return config.quantize, config.calibration.options
