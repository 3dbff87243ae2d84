"""``qconsist pipeline run``: convert, optimize and quantize a model into ``runs/<run-id>/``."""

from __future__ import annotations

from pathlib import Path

import typer

from qconsist.cli import options as opt
from qconsist.cli.app import note_ort_log, print_json, progress_for, stderr_console, stdout_console
from qconsist.errors import EXIT_DIVERGED

pipeline_app = typer.Typer(help="Run a pipeline file: Caffe → ONNX → optimized → quantized, every artifact hashed.", no_args_is_help=True)


ISA_FAILURE = "check quantize across instruction sets: "


def render_result(result) -> None:  # PipelineResult
    console = stdout_console()
    console.print(f"run {result.run_id}: {result.path}")
    for stage, hashes in result.artifacts.items():
        console.print(f"  {stage:<11} {hashes.path}  md5 {hashes.md5}  ({result.seconds[stage]:.2f} s)")
    for stage, checks in result.checks.items():
        for key, check in checks.items():
            if key == "instruction_sets" and isinstance(check, dict):  # [isa]: qconsist.pipeline.isa
                for line in check.get("lines") or ():
                    console.print(f"  check {stage} across instruction sets: {line}")
                continue
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
                              f"{'; '.join(_judgement(j) for j in check['judged'])} on {check['samples']} evaluation inputs: "
                              + _floor(check))
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
        across = failure.startswith(ISA_FAILURE)  # the quantize check across instruction sets: [isa]
        console.print(f"FAILED {failure}" + ("" if across and "[isa]" in failure else " ([isa])" if across else " ([quantize] min_sqnr_db)"))


def _floor(check: dict) -> str:
    """Whether the judged outputs passed the SQNR floor: ``passed (floor 15 dB)``, ``FAILED`` or ``recorded``."""
    floor = check.get("min_sqnr_db")
    if floor is None:
        return 'recorded (no floor: [quantize] min_sqnr_db = "off")'
    return f"{'FAILED' if check.get('below_floor') else 'passed'} (floor {float(floor):g} dB)"


def _checks(result) -> int:  # PipelineResult
    """How many checks the run made (the run page's rows that judge: a comparison only recorded is no check)."""
    from qconsist.report.run_page import RECORDED, checks

    return sum(1 for row in checks([{"name": name, "checks": found} for name, found in result.checks.items()]) if row[2] != RECORDED)


SHOWN_PREDICTIONS = 5


def render_predictions(run: Path) -> None:
    """What the float model predicts on the evaluation inputs (a wrong [preprocess] shows there: every image one
    class, or the labels missed), for a model with a class-scores output."""
    from qconsist.sensitivity.predictions import float_predictions

    found = float_predictions(run)
    if found is None or not found.predictions:
        return
    shown = "; ".join(f"{p.sample}: " + ", ".join(f"{c} ({s:.2f})" for c, s in p.top[:2])
                      + (f" [label {p.label}]" if p.label is not None else "") for p in found.predictions[:SHOWN_PREDICTIONS])
    more = len(found.predictions) - SHOWN_PREDICTIONS
    console = stdout_console()
    console.print(f"float model on the {len(found.predictions)} evaluation inputs ({found.output}, {found.classes} classes, "
                  f"top classes with scores): {shown}" + (f"; … {more} more" if more > 0 else ""))
    if found.labelled:
        console.print(f"  float accuracy: {found.correct}/{found.labelled} ({100 * found.correct / found.labelled:.1f}%) top-1 on the labelled inputs")
    if found.classes > 2 and len(found.predictions) >= 3 and found.distinct_top1() == 1:  # two classes: often right
        console.print(f"  all {len(found.predictions)} evaluation inputs get class {found.predictions[0].top[0][0]}: "
                      "unless they all are of it, check [preprocess] (channel order, mean, scale, layout)")


def render_verdict(result, downloaded: str | None = None) -> None:  # PipelineResult
    """What to run next, then the verdict as the last line: ``PASS name: …`` or ``FAIL name: …``."""
    console = stdout_console()
    if downloaded:
        console.print(downloaded)
    run = result.path
    console.print("next:")
    console.print(f"  qconsist report {run} -o {result.run_id}.html  # the run's page")
    console.print(f"  qconsist quant-error {run}  # where quantization loses, node by node")
    console.print(f"  qconsist gate {run} --baseline RUN  # judged against an earlier run")
    reasons = []
    if result.failures:
        reasons.append(f"{len(result.failures)} check(s) failed")
    if result.repeat is not None and not result.repeat.passed:
        reasons.append(f"{len(result.repeat.runs)} repeated calibrations " + (
            "agree by chance (a calibrated tensor's producer varies between runs)" if result.repeat.by_chance else "disagree"))
    if reasons:
        console.print(f"FAIL {result.name}: {'; '.join(reasons)} (run {result.run_id})")
        return
    repeat = f"; {len(result.repeat.runs)} calibrations agree" if result.repeat is not None else ""
    console.print(f"PASS {result.name}: {_checks(result)} checks passed{repeat} (run {result.run_id})")


def _judgement(entry: dict) -> str:
    """One output's figures from a recorded judgement (``OutputJudgement.to_json``)."""
    from qconsist.compare.output import describe_judgement

    return describe_judgement(entry)


def _uncached_model(config) -> str | None:  # PipelineConfig
    """The bundled model the run will download first (its files not in the cache yet), else None."""
    from qconsist.models.registry import find_model
    from qconsist.pipeline.config import ModelKind

    if config.model.kind is not ModelKind.BUNDLED:
        return None
    description = find_model(config.model.source)
    if description.source_kind == "repository":
        return None
    target = _cache(config.model.source)
    return None if all((target / Path(f.member).name).is_file() for f in description.files) else config.model.source


def _cache(name: str) -> Path:
    from qconsist.models.registry import cache_root

    return cache_root() / "models" / name


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

    Exit 0: done, calibrations agree (or not repeated); 1: repeated calibrations disagree (or agree while a
    calibrated tensor's producer varies between runs: calibration on a GPU EP), or a final output's
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
    missing = _uncached_model(config)
    if missing and not json_output:
        stderr_console().print(f"downloading model {missing} (once: it is cached for the next runs)…")
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
        render_predictions(result.path)
        downloaded = f"model {missing}: downloaded and verified (sha256) into {_cache(missing)}" if missing else None
        render_verdict(result, downloaded)
        note_ort_log(result.onnxruntime_log)
    if not result.passed:
        raise typer.Exit(EXIT_DIVERGED)
