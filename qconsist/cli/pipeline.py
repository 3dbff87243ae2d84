"""``qconsist pipeline run``: convert, optimize and quantize a model into ``runs/<run-id>/``."""

from __future__ import annotations

from pathlib import Path

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import note_ort_log, print_json, progress_for, stdout_console
from qconsist.errors import EXIT_DIVERGED

pipeline_app = typer.Typer(help="Run a pipeline file: Caffe → ONNX → optimized → quantized, every artifact hashed.", no_args_is_help=True)


def render_result(result) -> None:  # PipelineResult
    console = stdout_console()
    console.print(f"run {result.run_id}: {result.path}")
    for stage, hashes in result.artifacts.items():
        console.print(f"  {stage:<11} {hashes.path}  md5 {hashes.md5}  ({result.seconds[stage]:.2f} s)")
    for stage, checks in result.checks.items():
        for key, check in checks.items():
            if not key.startswith("outputs_vs_") or not check:
                continue
            against = key[len("outputs_vs_"):]
            if check["atol"] is not None:  # a fidelity check within a tolerance
                console.print(
                    f"  check {stage}: max abs diff {check['max_abs_diff']} vs {against} "
                    f"(atol {check['atol']}, rtol {check['rtol']}): {'passed' if check['passed'] else 'FAILED'}"
                )
            elif check.get("judged") is not None:  # each output judged for what it is
                console.print(f"  check {stage}: max abs diff {float(check['max_abs_diff']):.4g} vs {against}; "
                              f"{'; '.join(_judgement(j) for j in check['judged'])} on {check['samples']} evaluation inputs")
            else:  # recorded: how far quantization moved the outputs
                console.print(
                    f"  check {stage}: max abs diff {float(check['max_abs_diff']):.4g} vs {against}, top-1 agreement "
                    f"{check['top1_agreement']:.0%} on {check['samples']} evaluation inputs"
                )
    for issue in result.issues:
        console.print(f"  invalid scale (allowed): {issue['message']}")
    if result.repeat is None:
        console.print("calibration repeat: not run ([calibration] repeat = 1)")
    else:
        console.print(f"calibration repeat: {result.repeat.verdict()}")
        for difference in result.repeat.differences:
            console.print(f"  {difference.line()}")
    for failure in result.failures:
        console.print(f"FAILED {failure} ([quantize] min_sqnr_db)")


def _judgement(entry: dict) -> str:
    """One output's figures from a recorded judgement (``OutputJudgement.to_json``)."""
    from qconsist.compare.output import describe_judgement

    return describe_judgement(entry)


def run(
    file: Path = typer.Argument(..., parser=opt.read_path, help="Pipeline file (TOML), e.g. pipelines/open_nsfw.toml."),
    runs_dir: opt.RunsDir = None,
    run_id: opt.RunId = None,
    json_output: opt.Json = False,
    isa: opt.Isa = None,
) -> None:
    """Run every stage of FILE; print the three artifacts with their md5 and the repeated-calibration verdict.

    With --isa MODEL every stage runs in a child process under QEMU user mode emulating that processor (the
    quantize check's figures then are that processor's) and the run records its instruction set.

    Exit 0: done, calibrations agree (or not repeated); 1: repeated calibrations disagree, or a final output's
    SQNR against the float model is below [quantize] min_sqnr_db (the run is kept; the nodes that lose most
    are named); 2: error; 3: [calibration] provider = "cuda" without the CUDA execution provider, or --isa
    without QEMU.
    """
    if isa is not None:
        from qconsist.cli.emulated import reexec_under

        if reexec_under(isa, quiet=json_output):
            return
    from qconsist.pipeline.config import load_pipeline
    from qconsist.pipeline.runner import run_pipeline

    config = load_pipeline(file)
    result = run_pipeline(config, runs_dir=runs_dir, run_id=run_id, progress=progress_for(json_output))
    blame = {}
    if result.failures:  # where the outputs below the floor lost their signal: quant-error on the run kept for it
        from qconsist.gate.blame import blame_pipeline_run

        blame = blame_pipeline_run(result.path)
    if json_output:
        print_json({**result.to_json(), "losing_nodes": blame})
    else:
        render_result(result)
        for label, line in blame.items():
            stdout_console().print(f"  {label}: {line}")
        note_ort_log(result.onnxruntime_log)
    if not result.passed:
        raise typer.Exit(EXIT_DIVERGED)
