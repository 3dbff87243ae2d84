"""``qconsist pipeline run``: convert, optimize and quantize a model into ``runs/<run-id>/``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qconsist.cli.app import app, handles_errors, print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED

pipeline_app = typer.Typer(help="Run a pipeline file: Caffe → ONNX → optimized → quantized, every artifact hashed.", no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")


def render_result(result) -> None:  # PipelineResult
    console = stdout_console()
    console.soft_wrap = True  # one line per fact, whatever the width
    console.print(f"run {result.run_id}: {result.path}")
    for stage, hashes in result.artifacts.items():
        console.print(f"  {stage:<9} {hashes.path}  md5 {hashes.md5}  ({result.seconds[stage]:.2f} s)")
    optimize = result.checks.get("optimize", {}).get("outputs_vs_convert")
    if optimize:
        console.print(
            f"  check optimize: max abs diff {optimize['max_abs_diff']} vs convert "
            f"(atol {optimize['atol']}, rtol {optimize['rtol']}): {'passed' if optimize['passed'] else 'FAILED'}"
        )
    quantize = result.checks.get("quantize", {}).get("outputs_vs_optimize")
    if quantize:
        console.print(
            f"  check quantize: max abs diff {float(quantize['max_abs_diff']):.4g} vs optimize, top-1 agreement "
            f"{quantize['top1_agreement']:.0%} on {quantize['samples']} evaluation inputs"
        )
    for issue in result.issues:
        console.print(f"  invalid scale (allowed): {issue['message']}")
    if result.repeat is None:
        console.print("calibration repeat: not run ([calibration] repeat = 1)")
        return
    console.print(f"calibration repeat: {result.repeat.verdict()}")
    for difference in result.repeat.differences:
        console.print(f"  {difference.line()}")


@pipeline_app.command("run")
@handles_errors
def run(
    file: Path = typer.Argument(..., help="Pipeline file (TOML), e.g. pipelines/open_nsfw.toml."),
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help="Where run directories go (default: the file's runs_dir, else ./runs)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name of the run directory (default: <name>-<UTC time>-<random>)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run every stage of FILE; print the three artifacts with their md5 and the repeated-calibration verdict.

    Exit 0: done, calibrations agree (or not repeated); 1: repeated calibrations disagree; 2: error;
    3: [calibration] provider = "cuda" without the CUDA execution provider.
    """
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    config = load_pipeline(file)
    result = run_pipeline(config, runs_dir=runs_dir, run_id=run_id, progress=progress_for(json_output))
    if json_output:
        print_json(result.to_json())
    else:
        render_result(result)
    if not result.passed:
        raise typer.Exit(EXIT_DIVERGED)
